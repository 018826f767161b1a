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

A range's observed extremes (what the onnxruntime layout's uint8 grid is fitted to) are checked against the
statistics recorded with them by :func:`check_extremes`: calibkit writes both from one measurement.

``representable_only`` keeps just the first two rules: the scale guard of the Q/DQ writer, which sees tables
without their statistics and must not refuse a real activation range above 65504 that calibration measured.

Violations are refused (CalibrationError naming the tensors), not dropped: a dropped range silently leaves a
layer in FP32, a kept bad one silently wrecks accuracy — both exit 0 with a wrong model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from calibkit.errors import CalibrationError
from calibkit.types import INT8_MAX

if TYPE_CHECKING:  # pragma: no cover - types only
    import onnx

MAX_AMAX = 65504.0  # float16 max
MIN_SCALE = float(np.finfo(np.float32).tiny)  # smallest normal float32
WIDER_FACTOR = 10.0
NARROWER_FACTOR = 1e-6


@dataclass(frozen=True)
class RangeProblem:
    tensor: str
    amax: float
    reason: str


def problem(tensor: str, amax: object, stats: Mapping[str, Any] | None = None, *,
            representable_only: bool = False) -> RangeProblem | None:
    """The reason ``amax`` cannot be used for ``tensor`` (None when it can; amax 0 is usable: kept FP32)."""
    if isinstance(amax, bool) or not isinstance(amax, (int, float, np.floating, np.integer)):
        return RangeProblem(tensor, float("nan"), f"amax is {type(amax).__name__}, not a number")
    try:
        a = float(amax)
    except OverflowError:  # an integer literal beyond any float (JSON reads 1e400 as inf, 10**400 as an int)
        return RangeProblem(tensor, float("inf"), "amax is too large for a float")
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
        ends = [abs(v) for v in (stats.get("min"), stats.get("max")) if isinstance(v, (int, float))]
        vals = [max(ends)] if ends else [None]
    v = vals[0]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v):
        return None
    return float(v)


def _finite(v: float) -> bool:
    """``v`` is a finite float, or an int a float can hold (an integer literal beyond any float is not)."""
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


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


def _float32_equal(a: float, b: float) -> bool:
    """``a`` and ``b`` are the same value to float32 precision. Activations are float32, so every extreme and
    every recorded min/max/absmax is the exact value of one float32 (calibkit writes the float64 that holds it,
    which JSON round-trips exactly); a writer that printed them as float32 (shortest float32 repr) still rounds
    back to the same float32. Anything further apart is not the same measurement."""
    with np.errstate(over="ignore"):
        fa, fb = np.float32(a), np.float32(b)
    if not (np.isfinite(fa) and np.isfinite(fb)):  # beyond float32: no activation was ever that large
        return a == b
    return bool(fa == fb)


def _recorded(stats: Mapping[str, Any] | None, key: str) -> float | None:
    v = stats.get(key) if isinstance(stats, Mapping) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v):
        return None
    return float(v)


def extremes_problem(lo: float, hi: float, stats: Mapping[str, Any] | None) -> str | None:
    """Why the observed extremes ``lo``/``hi`` of one range disagree with the statistics recorded for its tensor
    in the same file (None: they agree, or nothing was recorded). calibkit writes both from the same
    measurement (observed_min is the recorded min, observed_max the recorded max, absmax the larger of their
    magnitudes), so any difference beyond float32 rounding is an edit or a corruption. A positive minimum or a
    negative maximum is a real measurement (a softmax output never reaches 0): the uint8 grid widens to keep 0
    inside itself, so such extremes are not refused on their own."""
    rmin, rmax, rabs = _recorded(stats, "min"), _recorded(stats, "max"), _recorded(stats, "absmax")
    if rmin is not None and not _float32_equal(lo, rmin):
        return f"observed_min {lo!r} is not the recorded min {rmin!r}"
    if rmax is not None and not _float32_equal(hi, rmax):
        return f"observed_max {hi!r} is not the recorded max {rmax!r}"
    if rabs is not None:
        with np.errstate(over="ignore"):
            below, above = np.float32(lo) < -np.float32(rabs), np.float32(hi) > np.float32(rabs)
        if below or above:
            return (f"observed_min {lo!r} / observed_max {hi!r} lie outside [-absmax, absmax] of the recorded "
                    f"absmax {rabs!r}")
        if not _float32_equal(max(abs(lo), abs(hi)), rabs):
            return (f"observed_min {lo!r} / observed_max {hi!r} do not reach the recorded absmax {rabs!r} "
                    "(the larger of their magnitudes is the absmax calibration recorded)")
    return None


def check_extremes(ranges: Iterable[tuple[str, float, float | None, float | None]], *, source: str,
                   stats: Mapping[str, Mapping[str, Any]] | None, hint: str) -> None:
    """Raise one CalibrationError naming every range (tensor, amax, observed_min, observed_max) whose extremes
    disagree with the statistics recorded for its tensor (:func:`extremes_problem`). Where no statistics are
    recorded (a table ``tune`` wrote), the extremes are what calibration recorded of the tensor: its amax is
    judged against them as :func:`problem` judges it against statistics. Ranges without extremes are read as
    before."""
    stats = stats or {}
    bad: list[str] = []
    for t, amax, lo, hi in ranges:
        if lo is None or hi is None:
            continue
        if _recorded_absmax(stats.get(t)) is None:
            p = problem(t, amax, {"min": lo, "max": hi})
            why = None if p is None else f"{p.reason.replace('recorded', 'in its observed extremes')} (amax {amax!r})"
        else:
            why = extremes_problem(lo, hi, stats.get(t))
        if why is not None:
            bad.append(f"{t}: {why}")
    if bad:
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise CalibrationError(f"{source}: {len(bad)} range(s) whose observed extremes disagree with what is "
                               f"recorded beside them: {'; '.join(bad[:5])}{more}", hint=hint)


def zero_ranges(amax: Iterable[tuple[str, Any]]) -> list[str]:
    """Tensors whose amax is exactly 0 (all-zero during calibration): their nodes stay in FP32."""
    return [t for t, a in amax if isinstance(a, (int, float)) and not isinstance(a, bool) and a == 0]


# -- ranges that are usable but known to hurt --------------------------------------------------------------------
# A calibration method may legitimately clip a long-tailed tensor. Two families are different: the largest values
# of a softmax output are the attention peaks every head depends on (entropy once clipped all six attention
# softmax outputs of the demo model at 0.125 while they reach 0.998: -5.25 accuracy points), and the largest GELU
# outputs are the outlier channels a transformer's MLP carries its signal in. A range that cuts them far below
# what calibration observed is reported with the fix, not refused: the model is still valid.
SOFTMAX = "attention Softmax outputs"
GELU = "GELU outputs"
# warn when amax is below this share of the largest |x| recorded
HARMFUL_CLIP_RATIO: dict[str, float] = {SOFTMAX: 0.5, GELU: 0.25}
_GELU_OPS = frozenset({"Gelu", "FastGelu", "BiasGelu", "QuickGelu"})
_GELU_MARKERS = frozenset({"Erf", "Tanh"})  # decomposed GELU: x * 0.5 * (1 + erf(x / sqrt 2)), or the tanh form
_GELU_DEPTH = 3


@dataclass(frozen=True)
class ClipWarning:
    """Tensors of one ``family`` whose ``method`` range cuts them far below the largest |x| observed."""

    family: str
    method: str
    tensors: tuple[str, ...]
    amax: tuple[float, ...]
    observed: tuple[float, ...]  # largest |x| recorded, per tensor
    of: int  # tensors of the family that were calibrated

    @property
    def suggestion(self) -> str:
        return clipping_fix(self.family)

    @property
    def message(self) -> str:
        lo, hi = min(self.amax), max(self.amax)
        amax = f"amax {lo:.3g}" if lo == hi else f"amax {lo:.3g}-{hi:.3g}"
        share = min(a / o for a, o in zip(self.amax, self.observed))
        return (f"{self.method} clips {len(self.tensors)} of {self.of} {self.family} far below their observed "
                f"values ({amax} while they reach {max(self.observed):.3g}; as low as {share:.0%} of the range, "
                f"e.g. {self.tensors[0]}): clipping these is known to cost accuracy; {self.suggestion}")

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "method": self.method, "tensors": list(self.tensors), "amax": list(self.amax),
                "observed_absmax": list(self.observed), "of": self.of, "threshold": HARMFUL_CLIP_RATIO[self.family],
                "suggestion": self.suggestion, "message": self.message}


def clipping_fix(family: str) -> str:
    """What to do about a range that cuts a ``family`` of tensors far below their observed values."""
    if family == SOFTMAX:
        return ("calibrate with --method minmax (a softmax output never exceeds 1, so its full range costs "
                "little resolution) or --method mse, or keep these MatMuls out of INT8 with --exclude")
    return ("calibrate with --method minmax or --method mse, or run `calibkit smooth` first to move the "
            "outlier channels into the weights")


def tensor_families(model: onnx.ModelProto) -> dict[str, str]:
    """Tensor -> family (:data:`SOFTMAX`, :data:`GELU`) for tensors produced by a Softmax, a fused GELU op, or the
    last node of a decomposed GELU (a Mul with an Erf or Tanh among its last few ancestors)."""
    producer: dict[str, Any] = {}
    for node in model.graph.node:
        for out in node.output:
            producer[out] = node

    def has_marker(node: onnx.NodeProto, depth: int) -> bool:
        if node.op_type in _GELU_MARKERS:
            return True
        if depth == 0:
            return False
        return any(has_marker(producer[i], depth - 1) for i in node.input if i in producer)

    fam: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type == "Softmax":
            fam.update({o: SOFTMAX for o in node.output})
        elif node.op_type in _GELU_OPS:
            fam.update({o: GELU for o in node.output})
        elif node.op_type == "Mul" and any(i in producer and has_marker(producer[i], _GELU_DEPTH - 1)
                                           for i in node.input):
            fam.update({o: GELU for o in node.output})
    return fam


def harmful_clipping(model: onnx.ModelProto, ranges: Iterable[tuple[str, float, str]],
                     absmax: Mapping[str, float]) -> tuple[ClipWarning, ...]:
    """One :class:`ClipWarning` per (family, method) whose ranges cut its tensors below
    :data:`HARMFUL_CLIP_RATIO` of the largest |x| recorded. ``ranges``: (tensor, amax, method) of the table;
    ``absmax``: the recorded largest |x| per tensor (tensors without one are not judged)."""
    families = tensor_families(model)
    calibrated: dict[str, int] = {}
    cut: dict[tuple[str, str], list[tuple[str, float, float]]] = {}
    for tensor, amax, method in ranges:
        fam = families.get(tensor)
        seen = absmax.get(tensor)
        if fam is None or seen is None or not math.isfinite(seen) or seen <= 0:
            continue
        calibrated[fam] = calibrated.get(fam, 0) + 1
        if 0 < amax < HARMFUL_CLIP_RATIO[fam] * seen:
            cut.setdefault((fam, method), []).append((tensor, float(amax), float(seen)))
    return tuple(ClipWarning(fam, method, tuple(t for t, _, _ in rows), tuple(a for _, a, _ in rows),
                             tuple(o for _, _, o in rows), calibrated[fam])
                 for (fam, method), rows in sorted(cut.items()))
