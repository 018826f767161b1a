"""TensorRT's legacy calibration cache (TensorRT 8-10 implicit INT8; ModelOpt imports it).

Format (REFERENCES.md §3)::

    TRT-<version>-<algorithm>
    <tensor name>: <hex of the float32 bit pattern of scale = amax / 127>

Hex is lower case without zero padding, so a zero scale is ``0``; ``7f800000`` is +inf. Names may contain
``": "`` themselves (``(Unnamed Layer* 64) [Shuffle]_output``), so a line splits at its last ``": "``.

Algorithm names written per method: entropy -> ``EntropyCalibration2``, minmax -> ``MinMaxCalibration``,
percentile and mse -> ``LegacyCalibration``. TensorRT 8-10 only reuses a cache whose algorithm matches the
calibrator it builds with; ``IInt8LegacyCalibrator`` is TensorRT's user-parameterised (quantile) calibrator,
the one whose algorithm is not a fixed search, so it is the honest name for ranges chosen by percentile or MSE.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from calibkit._io import text_lines, write_text
from calibkit.errors import CalibrationError
from calibkit.types import INT8_MAX, CalibrationTable, Method

DEFAULT_TRT_VERSION = 101303  # 10.13.3: the last TensorRT generation that still has the legacy calibrators

ALGORITHM_FOR_METHOD: dict[Method, str] = {
    Method.ENTROPY: "EntropyCalibration2",
    Method.MINMAX: "MinMaxCalibration",
    Method.PERCENTILE: "LegacyCalibration",
    Method.MSE: "LegacyCalibration",
}
METHOD_FOR_ALGORITHM: dict[str, Method] = {
    "EntropyCalibration2": Method.ENTROPY,
    "EntropyCalibration": Method.ENTROPY,
    "MinMaxCalibration": Method.MINMAX,
    "LegacyCalibration": Method.PERCENTILE,
}

_HEADER = re.compile(r"^TRT-(\d+)-(\w+)$")


@dataclass(frozen=True)
class TrtCache:
    """A parsed cache. ``scales`` holds every finite scale (zeros included); ``zero`` and ``non_finite`` list
    the tensors whose scale is 0 or inf/nan (the latter are also absent from ``scales``)."""

    algorithm: str
    version: int
    scales: dict[str, float] = field(default_factory=dict)
    zero: list[str] = field(default_factory=list)
    non_finite: list[str] = field(default_factory=list)
    non_finite_scales: dict[str, float] = field(default_factory=dict)  # their values as read (inf, -inf or NaN)

    @property
    def amax(self) -> dict[str, float]:
        return {t: s * INT8_MAX for t, s in self.scales.items()}

    @property
    def method(self) -> Method:
        return METHOD_FOR_ALGORITHM.get(self.algorithm, Method.ENTROPY)


def float_to_hex(value: float) -> str:
    return format(struct.unpack("<I", struct.pack("<f", value))[0], "x")


def hex_to_float(text: str) -> float:
    bits = int(text, 16)
    if not 0 <= bits <= 0xFFFFFFFF:
        raise ValueError(f"{text!r} is not a 32-bit pattern")
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


def format_cache(scales: Mapping[str, float], algorithm: str, version: int = DEFAULT_TRT_VERSION) -> str:
    lines = [f"TRT-{int(version)}-{algorithm}"]
    for name, scale in scales.items():
        if "\n" in name:
            raise CalibrationError(f"tensor name {name!r} contains a newline and cannot be written to a cache")
        lines.append(f"{name}: {float_to_hex(float(scale))}")
    return "\n".join(lines) + "\n"


def write_cache(
    path: str | os.PathLike[str],
    table_or_scales: CalibrationTable | Mapping[str, float],
    algorithm: str | None = None,
    version: int = DEFAULT_TRT_VERSION,
) -> Path:
    """Write a cache atomically. A table's scales are amax/127 (stored as float32, as TensorRT does);
    a mapping is taken as scales. ``algorithm`` defaults to the table method's name (module docstring)."""
    if isinstance(table_or_scales, CalibrationTable):
        scales = {r.tensor: r.amax / INT8_MAX for r in table_or_scales.ranges}
        algo = algorithm or ALGORITHM_FOR_METHOD[table_or_scales.method]
    else:
        scales = dict(table_or_scales)
        if algorithm is None:
            raise CalibrationError("write_cache needs an algorithm name when given bare scales")
        algo = algorithm
    if not re.fullmatch(r"\w+", algo):
        raise CalibrationError(f"invalid TensorRT calibration algorithm name {algo!r}")
    write_text(path, format_cache(scales, algo, version))
    return Path(path)


def parse_cache(text: str, source: str = "<cache>") -> TrtCache:
    lines = text_lines(text)
    m = _HEADER.match(lines[0].strip()) if lines else None
    if m is None:
        first = lines[0][:60] if lines else ""
        raise CalibrationError(
            f"{source} is not a TensorRT calibration cache (first line {first!r})",
            hint="expected a header like TRT-8601-EntropyCalibration2; ONNX Runtime's calibration.cache "
            "is a different format",
        )
    scales: dict[str, float] = {}
    zero: list[str] = []
    non_finite: list[str] = []
    non_finite_scales: dict[str, float] = {}
    for n, raw in enumerate(lines[1:], 2):
        line = raw.rstrip("\r")
        if not line.strip():
            continue
        name, sep, value = line.rpartition(": ")
        if not sep or not name:
            raise CalibrationError(f"{source}:{n}: expected '<tensor>: <hex scale>', got {line[:80]!r}")
        try:
            scale = hex_to_float(value.strip())
        except ValueError:
            raise CalibrationError(f"{source}:{n}: {value.strip()!r} is not a hex float32 bit pattern") from None
        if scale != scale or scale in (float("inf"), float("-inf")):
            non_finite.append(name)
            non_finite_scales[name] = scale
            continue
        if scale == 0.0:
            zero.append(name)
        scales[name] = scale
    return TrtCache(algorithm=m.group(2), version=int(m.group(1)), scales=scales, zero=zero, non_finite=non_finite,
                    non_finite_scales=non_finite_scales)


def read_cache(path: str | os.PathLike[str]) -> TrtCache:
    p = Path(path)
    if not p.is_file():
        raise CalibrationError(f"calibration cache not found: {p}")
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise CalibrationError(f"cannot read {p}: {exc}") from exc
    return parse_cache(text, str(p))


def matched_amax(cache: TrtCache, wanted: Collection[str], source: str) -> dict[str, float]:
    """amax (scale x 127) of the cache entries that name one of ``wanted``, validated.

    A cache that matches no wanted tensor is an error (it would write a model with nothing quantized). A
    matched entry that is NaN/inf, negative, denormal or huge is refused by name (rangecheck); entries that
    match nothing are TensorRT-internal names and are only reported.
    """
    from calibkit.quantize.rangecheck import check_ranges

    hint = "the cache must come from TensorRT calibrating this same ONNX model; re-run its calibration"
    matched = {t: cache.scales[t] * INT8_MAX for t in wanted if t in cache.scales}
    bad_nf = [t for t in cache.non_finite if t in wanted]
    if not matched and not bad_nf:
        some = ", ".join(sorted(wanted)[:3])
        raise CalibrationError(
            f"{source}: none of its {len(cache.scales) + len(cache.non_finite)} entries names a tensor this model "
            f"quantizes (e.g. {some})",
            hint=hint,
        )
    # the value as read: an inf scale is reported as infinite, not as NaN
    bad = [(t, cache.non_finite_scales.get(t, float("nan")) * INT8_MAX) for t in bad_nf]
    check_ranges([*bad, *matched.items()], source=source, hint=hint)
    return matched
