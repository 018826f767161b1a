"""Is a clipping range usable? One set of rules for calibration.json, TensorRT caches and tune/compare tables.

A range becomes the per-tensor scale ``amax / 127`` stored as float32 in the model. It must be:

- finite and positive (0 is the one exception: calibkit writes it for a tensor that was all zero, and such a
  tensor's node stays FP32 — legitimate, but reported by name);
- representable: the float32 scale must be a *normal* number (a denormal or 0 scale divides by ~0 and
  saturates every value) and ``amax`` at most ``MAX_AMAX``: the FP16 maximum, because TensorRT runs the layers
  around a Q/DQ pair in FP16 where anything larger overflows, and no activation of a working FP32 transformer
  needs a wider INT8 range;
- plausible against the statistics recorded with it, where known: never wider than ``WIDER_FACTOR`` x the
  largest |x| seen (no calibration method picks a range wider than the data; a far wider one leaves a handful
  of the 255 levels in use), never narrower than ``NARROWER_FACTOR`` x the largest |x| (every value clips).

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


def problem(tensor: str, amax: Any, stats: Mapping[str, Any] | None = None) -> RangeProblem | None:
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
    if a > MAX_AMAX:
        return RangeProblem(tensor, a, f"amax is above {MAX_AMAX:g} (the FP16 maximum)")
    with np.errstate(under="ignore"):
        scale = float(np.float32(a / INT8_MAX))
    if scale < MIN_SCALE:
        return RangeProblem(tensor, a, "scale amax/127 is below the smallest normal float32 (denormal or 0)")
    absmax = _recorded_absmax(stats)
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
                 hint: str) -> None:
    """Raise one CalibrationError naming every unusable range of ``amax`` ((tensor, amax) pairs)."""
    stats = stats or {}
    bad = [p for t, a in amax if (p := problem(t, a, stats.get(t))) is not None]
    if bad:
        shown = "; ".join(f"{p.tensor}: {p.reason} ({p.amax:.4g})" for p in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise CalibrationError(f"{source}: {len(bad)} unusable range(s): {shown}{more}", hint=hint)


def zero_ranges(amax: Iterable[tuple[str, Any]]) -> list[str]:
    """Tensors whose amax is exactly 0 (all-zero during calibration): their nodes stay in FP32."""
    return [t for t, a in amax if isinstance(a, (int, float)) and not isinstance(a, bool) and a == 0]
