"""Is a clipping range usable? One set of rules for calibration.json, TensorRT caches and tune/compare tables.

A range becomes the per-tensor scale ``amax / 127`` stored as float32 in the model. It must be:

- finite and positive (0 is the one exception: calibkit writes it for a tensor that was all zero, and such a
  tensor's node stays FP32 — legitimate, but reported by name);
- representable: the float32 scale must be a finite, *normal* number (a denormal or 0 scale divides by ~0
  and saturates every value; an overflowing one is inf);
- plausible against the statistics recorded with it, where known: never wider than ``WIDER_FACTOR`` x the
  largest |x| seen (no calibration method picks a range wider than the data; a far wider one leaves a handful
  of the 255 levels in use), never narrower than ``NARROWER_FACTOR`` x the largest |x| (every value clips);
- where no statistics are known (a TensorRT cache, a table without them): ``amax`` at most ``MAX_AMAX``, the
  FP16 maximum — TensorRT runs the layers around a Q/DQ pair in FP16, where anything larger overflows, so a
  wider range is a corrupt value, not a measurement (1e30 scales in a cache once cost 5.5 accuracy points).

``representable_only`` keeps just the first two rules: the scale guard of the Q/DQ writer, which sees tables
without their statistics and must not refuse a real activation range above 65504 that calibration measured.

Violations are refused (CalibrationError naming the tensors), not dropped: a dropped range silently leaves a
layer in FP32, a kept bad one silently wrecks accuracy — both exit 0 with a wrong model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from calibkit.errors import CalibrationError
from calibkit.types import INT8_MAX

MAX_AMAX = 65504.0  # float16 max
MIN_SCALE = float(np.finfo(np.float32).tiny)  # smallest normal float32
WIDER_FACTOR = 10.0
NARROWER_FACTOR = 1e-6


@dataclass(frozen=True)
class RangeProblem:
    tensor: str
    amax: float
    reason: str


def problem(tensor: str, amax: Any, stats: Mapping[str, Any] | None = None, *,
            representable_only: bool = False) -> RangeProblem | None:
    """The reason ``amax`` cannot be used for ``tensor`` (None when it can; amax 0 is usable: kept FP32)."""
    if isinstance(amax, bool) or not isinstance(amax, (int, float, np.floating, np.integer)):
        return RangeProblem(tensor, float("nan"), f"amax is {type(amax).__name__}, not a number")
    a = float(amax)
    if math.isnan(a):
        return RangeProblem(tensor, a, "amax is NaN")
    if math.isinf(a):
        return RangeProblem(tensor, a, "amax is infinite")
    if a < 0:
        return RangeProblem(tensor, a, "amax is negative")
    if a == 0:
        return None
    if a / INT8_MAX > float(np.finfo(np.float32).max):
        return RangeProblem(tensor, a, "scale amax/127 overflows float32")
    with np.errstate(under="ignore"):
        scale = float(np.float32(a / INT8_MAX))
    if scale < MIN_SCALE:
        return RangeProblem(tensor, a, "scale amax/127 is below the smallest normal float32 (denormal or 0)")
    if representable_only:
        return None
    absmax = _recorded_absmax(stats)
    if (absmax is None or absmax <= 0) and a > MAX_AMAX:
        return RangeProblem(tensor, a, f"amax is above {MAX_AMAX:g} (the FP16 maximum) and no statistics say the "
                                       "tensor is that large")
    if absmax is not None and absmax > 0:
        if a > WIDER_FACTOR * absmax:
            return RangeProblem(tensor, a, f"amax is over {WIDER_FACTOR:g}x the largest |x| recorded ({absmax:.4g})")
        if a < NARROWER_FACTOR * absmax:
            return RangeProblem(tensor, a, f"amax is under {NARROWER_FACTOR:g}x the largest |x| recorded "
                                           f"({absmax:.4g}): every value would clip")
    return None


def _recorded_absmax(stats: Mapping[str, Any] | None) -> float | None:
    if not isinstance(stats, Mapping):
        return None
    vals = [stats.get("absmax")]
    if vals[0] is None:
        vals = [abs(v) for v in (stats.get("min"), stats.get("max")) if isinstance(v, (int, float))]
        vals = [max(vals)] if vals else [None]
    v = vals[0]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def check_ranges(amax: Iterable[tuple[str, Any]], *, source: str, stats: Mapping[str, Mapping[str, Any]] | None = None,
                 hint: str, representable_only: bool = False) -> None:
    """Raise one CalibrationError naming every unusable range of ``amax`` ((tensor, amax) pairs)."""
    stats = stats or {}
    bad = [p for t, a in amax
           if (p := problem(t, a, stats.get(t), representable_only=representable_only)) is not None]
    if bad:
        shown = "; ".join(f"{p.tensor}: {p.reason} ({p.amax:.4g})" for p in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise CalibrationError(f"{source}: {len(bad)} unusable range(s): {shown}{more}", hint=hint)


def zero_ranges(amax: Iterable[tuple[str, Any]]) -> list[str]:
    """Tensors whose amax is exactly 0 (all-zero during calibration): their nodes stay in FP32."""
    return [t for t, a in amax if isinstance(a, (int, float)) and not isinstance(a, bool) and a == 0]
