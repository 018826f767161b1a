"""What this machine's CPU means for ONNX Runtime's int8 kernels.

On x86-64 without VNNI, ONNX Runtime's int8 GEMM multiplies uint8 activations by int8 weights with VPMADDUBSW,
which adds products in pairs into int16 and saturates for 8-bit weights (ONNX Runtime's quantization guide
recommends ``reduce_range``, 7-bit weights, there). Measured on an AVX2 machine without VNNI
(benchmarks/bench_zoo.py, 600 texts): the test zoo's random-init ELECTRA kept 56.2 % of FP32's predictions
through ORT's kernels with 8-bit weights (TensorRT layout), 88.5 % when that graph ran as exact arithmetic
(graph optimizations off), and 91.3 % in the onnxruntime layout with 7-bit weights through ORT's kernels.
VNNI's VPDPBUSD accumulates in int32 and does not saturate; ARM's dot-product kernels do not either.
"""

from __future__ import annotations

import platform
from pathlib import Path

VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def cpu_flags(cpuinfo: str | None = None) -> set[str] | None:
    """The CPU's feature flags from /proc/cpuinfo (Linux), or None where they cannot be read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return None


def int8_gemm_saturates(machine: str | None = None, flags: set[str] | None = None) -> bool:
    """True where ONNX Runtime's 8-bit-weight int8 GEMM can saturate: x86-64 whose flags show no VNNI.
    Unknown flags (macOS, Windows) count as not saturating: most x86 CPUs sold since 2019 have VNNI."""
    machine = (machine or platform.machine()).lower()
    if machine not in ("x86_64", "amd64", "i686", "x86"):
        return False
    flags = cpu_flags() if flags is None else flags
    if not flags:
        return False
    return not any(f in flags for f in VNNI_FLAGS)
