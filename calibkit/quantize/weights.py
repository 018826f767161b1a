"""Symmetric INT8 weight quantization: per-output-channel scales, zero point 0, values in [-127, 127].

``qmax`` 63 is ONNX Runtime's *reduce range* (7-bit weights): on x86-64 CPUs without VNNI its int8 GEMM adds
uint8 x int8 products in pairs into int16 (VPMADDUBSW), which saturates for 8-bit weights (255 * 127 * 2 >
32767) and silently corrupts outputs; 7-bit weights cannot saturate (255 * 63 * 2 < 32767)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from calibkit.types import INT8_MAX

REDUCED_WEIGHT_MAX = 63  # ONNX Runtime's reduce_range: 7-bit weights


@dataclass(frozen=True)
class QuantizedWeight:
    values: np.ndarray  # int8, same shape as the weight
    scale: np.ndarray  # float32, one per channel along ``axis`` (0-d when per-tensor)
    axis: int | None  # None: per-tensor


def weight_axis(op_type: str, input_index: int, rank: int, trans_b: bool = False) -> int | None:
    """The output-channel axis of a weight input, or None for per-tensor.

    MatMul B is [..., K, N]: channels on the last axis. Gemm B is [K, N] (axis 1), or [N, K] with transB=1
    (axis 0). A weight on the left side (input 0) is quantized per tensor: its rows are not output channels
    of a single GEMM that TensorRT or ONNX Runtime can scale per column.
    """
    if input_index != 1 or rank < 1:
        return None
    if op_type == "Gemm":
        return 0 if trans_b else 1
    return rank - 1 if rank >= 2 else None


def quantize_weight(w: np.ndarray, axis: int | None, qmax: int = INT8_MAX) -> QuantizedWeight:
    """Round ``w / scale`` to int8 with ``scale = max|w| / qmax`` per channel (channels of zeros get scale 1)."""
    w = np.asarray(w, dtype=np.float32)
    if axis is None:
        amax = np.asarray(np.max(np.abs(w)) if w.size else 0.0, dtype=np.float32)
    else:
        other = tuple(i for i in range(w.ndim) if i != axis)
        amax = np.max(np.abs(w), axis=other).astype(np.float32)
    scale = (amax / np.float32(qmax)).astype(np.float32)
    scale = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)
    bshape = scale.shape if axis is None else tuple(-1 if i == axis else 1 for i in range(w.ndim))
    q = np.rint(w / scale.reshape(bshape))
    np.clip(q, -qmax, qmax, out=q)
    return QuantizedWeight(values=q.astype(np.int8), scale=scale, axis=axis)


def fake_quantize_weight(w: np.ndarray, axis: int | None) -> np.ndarray:
    """What the DequantizeLinear of :func:`quantize_weight` gives back (for references and error estimates)."""
    qw = quantize_weight(w, axis)
    bshape = qw.scale.shape if axis is None else tuple(-1 if i == axis else 1 for i in range(np.ndim(w)))
    return qw.values.astype(np.float32) * qw.scale.reshape(bshape)
