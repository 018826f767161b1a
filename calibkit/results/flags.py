"""Which layers to keep in higher precision, and why: thresholds the user can set, reasons in words."""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

FP16_MAX = 65504.0


class Bounds(Protocol):
    """An interval's estimate and 95 % bounds: the shape of ``evidence.intervals.Interval``."""

    @property
    def estimate(self) -> float: ...
    @property
    def low(self) -> float: ...
    @property
    def high(self) -> float: ...


class PairedEffect(Protocol):
    """B - A of a paired outcome on the same examples with its 95 % interval, what a flag reads of one: the shape
    of ``evidence.intervals.PairedDifference``, which computes it in the layer above."""

    @property
    def interval(self) -> Bounds: ...
    @property
    def n(self) -> int: ...
    @property
    def significant(self) -> bool: ...
    def examples_to_settle(self) -> int | None: ...


class Flag(str, enum.Enum):
    OK = "ok"
    WATCH = "watch"  # a heuristic fired, but measured sensitivity says INT8 is harmless here
    KEEP_FP16 = "keep-fp16"
    KEEP_FP32 = "keep-fp32"
    # a measured effect passed a threshold, but its 95 % interval covers zero: no advice either way
    INSUFFICIENT = "insufficient-evidence"


@dataclass(frozen=True)
class Thresholds:
    """A layer is flagged when any rule fires. Accuracy thresholds are in percentage points.

    ``min_sqnr_db`` applies to the layer's own quantization SQNR (its FP input against the input fake-quantized
    with the model's own scale): the output SQNR of B against A also carries every earlier layer's error, so
    below the first bad layer it is low everywhere. The output SQNR is used only where the own one is unknown.
    """

    min_sqnr_db: float = 20.0
    max_clipped_fraction: float = 1e-3
    max_outlier_ratio: float = 10.0
    min_recovery_points: float = 0.5  # keeping only this layer in higher precision recovers more than this
    max_cost_points: float = 0.5  # quantizing only this layer costs more than this
    max_zeroed_weights: float = 0.05  # fraction of non-zero FP weights that INT8 rounds to zero
    # embeddings: keeping only this layer recovers, or quantizing only it costs, more mean cosine than this
    cosine_effect: float = 0.002

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LayerFlag:
    """One layer's decision: the flag and the reasons that set it, measured effects first.

    Each flag has one meaning, which every rendering states: KEEP_FP32 / KEEP_FP16: keep it (a measured effect
    past its threshold with a 95 % interval that excludes zero, or, with nothing measured, a heuristic);
    INSUFFICIENT: a measured effect, or the 95 % upper bound of a recovery, reaches past its threshold without
    being settled; WATCH: a heuristic fired but the measured effects are settled within the thresholds (or the
    whole model is not significantly worse, see :func:`gate_on_overall`); OK: nothing fired."""

    flag: Flag
    reasons: tuple[str, ...]
    measured_harm: bool = False  # the keep rests on a settled measured effect, not on heuristics alone


def flag_layer(
    thresholds: Thresholds,
    *,
    sqnr_db: float | None,
    clipped_fraction: float | None,
    outlier_ratio: float | None,
    nonfinite: int,
    fp_absmax: float | None,
    quant_sqnr_db: float | None = None,
    weight_sqnr_db: float | None = None,
    zeroed_weights: float | None = None,
    only_this_delta: float | None = None,
    all_but_this_delta: float | None = None,
    only_this_diff: PairedEffect | None = None,
    all_but_this_diff: PairedEffect | None = None,
    flips_removed: PairedEffect | None = None,
    agreement_cost: PairedEffect | None = None,
    cosine_recovered: PairedEffect | None = None,
    cosine_cost: PairedEffect | None = None,
    fidelity_name: str = "agreement",
) -> LayerFlag:
    """Deltas are accuracy differences as fractions (0.01 = one point). With their paired intervals
    (``*_diff``), a measured rule fires only when the interval excludes zero; otherwise the layer is marked
    "insufficient evidence" with the number of examples that would settle it. So is a layer whose measured
    recovery stays under its threshold while its 95 % upper bound reaches past it: keeping it could still pay.

    Without accuracy deltas (no labels, or a task without classes) the layer is judged on fidelity to the
    reference instead: ``flips_removed`` (agreement recovered by keeping only it in higher precision) and
    ``agreement_cost`` (agreement lost by quantizing only it) against the same point thresholds, and for
    embeddings ``cosine_recovered`` / ``cosine_cost`` against ``thresholds.cosine_effect``; ``fidelity_name``
    names the agreement in the reasons ("nearest-neighbour agreement", "per-token agreement")."""
    t = thresholds
    heuristic, fp32 = _heuristics(t, sqnr_db=sqnr_db, clipped_fraction=clipped_fraction,
                                  outlier_ratio=outlier_ratio, nonfinite=nonfinite, fp_absmax=fp_absmax,
                                  quant_sqnr_db=quant_sqnr_db, weight_sqnr_db=weight_sqnr_db,
                                  zeroed_weights=zeroed_weights)
    harm: list[str] = []  # measured effects past their thresholds, settled
    unsettled: list[str] = []
    by_accuracy = only_this_delta is not None and all_but_this_delta is not None
    if by_accuracy or only_this_delta is not None or all_but_this_delta is not None:
        if all_but_this_delta is not None and all_but_this_delta * 100 > t.min_recovery_points:
            what = (f"keeping only this layer in higher precision recovers {all_but_this_delta * 100:.2f} points"
                    f"{_ci(all_but_this_diff)} > {t.min_recovery_points:g}")
            (unsettled if _unsettled(all_but_this_diff) else harm).append(what + _settle(all_but_this_diff))
        else:
            unsettled += _open_bound(all_but_this_diff, t.min_recovery_points / 100, "points", 100)
        if only_this_delta is not None and -only_this_delta * 100 > t.max_cost_points:
            what = (f"quantizing only this layer costs {-only_this_delta * 100:.2f} points{_ci(only_this_diff)}"
                    f" > {t.max_cost_points:g}")
            (unsettled if _unsettled(only_this_diff) else harm).append(what + _settle(only_this_diff))
        extra = _fidelity(flips_removed)
    else:
        effects = _fidelity_effects(t, fidelity_name, flips_removed, agreement_cost, cosine_recovered, cosine_cost)
        for d, what in effects:
            (unsettled if _unsettled(d) else harm).append(what + _settle(d))
        unsettled += _open_bound(flips_removed, t.min_recovery_points / 100, f"points of {fidelity_name}", 100)
        extra = []
    unsettled += _open_bound(cosine_recovered, t.cosine_effect, "of mean cosine to the reference", 1, 4)
    if fp32:
        return LayerFlag(Flag.KEEP_FP32, tuple(harm + heuristic + unsettled + extra), bool(harm))
    if harm:
        return LayerFlag(Flag.KEEP_FP16, tuple(harm + heuristic + unsettled + extra), True)
    if unsettled:
        return LayerFlag(Flag.INSUFFICIENT, tuple(unsettled + heuristic + extra))
    if not heuristic:
        return LayerFlag(Flag.OK, ())
    measured = _measured(by_accuracy, only_this_delta, all_but_this_delta, all_but_this_diff, only_this_diff,
                         fidelity_name, flips_removed, agreement_cost, cosine_recovered, cosine_cost)
    if measured:
        # the measurement outranks the heuristics: keeping this layer in higher precision was tried and did not
        # pay off, so the layer is only worth watching
        return LayerFlag(Flag.WATCH, tuple(heuristic + [measured] + extra))
    return LayerFlag(Flag.KEEP_FP16, tuple(heuristic + extra))


def _open_bound(d: PairedEffect | None, threshold: float, unit: str, scale: float, digits: int = 2
                ) -> list[str]:
    """A recovery under its threshold whose 95 % upper bound reaches past it: not settled either way."""
    if d is None or d.interval.estimate > threshold or d.interval.high <= threshold:
        return []
    iv = d.interval
    need = ""
    if iv.estimate < threshold and iv.high > iv.estimate:  # the half-width shrinks as 1/sqrt(n)
        more = math.ceil(d.n * ((iv.high - iv.estimate) / (threshold - iv.estimate)) ** 2)
        need = f"; about {more:,} examples would settle it"
    return [f"keeping only this layer in higher precision recovers {iv.estimate * scale:+.{digits}f} {unit}"
            f"{_ci(d, scale, digits)}, whose upper bound reaches past {threshold * scale:g}: insufficient evidence "
            f"on {d.n} examples{need}"]


def _heuristics(t: Thresholds, *, sqnr_db: float | None, clipped_fraction: float | None,
                outlier_ratio: float | None, nonfinite: int, fp_absmax: float | None, quant_sqnr_db: float | None,
                weight_sqnr_db: float | None, zeroed_weights: float | None) -> tuple[list[str], bool]:
    """The reasons the ranges, SQNR and weights give, and whether one of them asks for FP32."""
    reasons: list[str] = []
    fp32 = False
    if nonfinite > 0:
        reasons.append(f"{nonfinite} non-finite values seen")
        fp32 = True
    if fp_absmax is not None and fp_absmax > FP16_MAX:
        reasons.append(f"range {fp_absmax:.4g} exceeds the FP16 maximum {FP16_MAX:g}")
        fp32 = True
    if quant_sqnr_db is not None:
        if quant_sqnr_db < t.min_sqnr_db:
            reasons.append(f"quantization SQNR of its input {quant_sqnr_db:.1f} dB < {t.min_sqnr_db:g} dB")
    elif sqnr_db is not None and sqnr_db < t.min_sqnr_db:
        reasons.append(f"output SQNR {sqnr_db:.1f} dB < {t.min_sqnr_db:g} dB")
    if weight_sqnr_db is not None and weight_sqnr_db < t.min_sqnr_db:
        reasons.append(f"weight quantization SQNR {weight_sqnr_db:.1f} dB < {t.min_sqnr_db:g} dB")
    if zeroed_weights is not None and zeroed_weights > t.max_zeroed_weights:
        reasons.append(
            f"{zeroed_weights:.1%} of its non-zero weights round to 0 in INT8 (> {t.max_zeroed_weights:.0%})"
        )
    if clipped_fraction is not None and clipped_fraction > t.max_clipped_fraction:
        reasons.append(f"clipped fraction {clipped_fraction:.2e} > {t.max_clipped_fraction:g}")
    if outlier_ratio is not None and outlier_ratio > t.max_outlier_ratio:
        reasons.append(f"outlier ratio max/p99.99 {outlier_ratio:.1f} > {t.max_outlier_ratio:g}")
    return reasons, fp32


def _fidelity_effects(t: Thresholds, name: str, recovered: PairedEffect | None, cost: PairedEffect | None,
                      cos_recovered: PairedEffect | None, cos_cost: PairedEffect | None
                      ) -> list[tuple[PairedEffect, str]]:
    """The fidelity effects past their thresholds, each with its sentence (without the settle clause)."""
    out = []
    if recovered is not None and recovered.interval.estimate * 100 > t.min_recovery_points:
        out.append((recovered, f"keeping only this layer in higher precision recovers "
                               f"{recovered.interval.estimate * 100:.2f} points of {name}{_ci(recovered)} > "
                               f"{t.min_recovery_points:g}"))
    if cost is not None and -cost.interval.estimate * 100 > t.max_cost_points:
        out.append((cost, f"quantizing only this layer costs {-cost.interval.estimate * 100:.2f} points of {name}"
                          f"{_ci(cost)} > {t.max_cost_points:g}"))
    if cos_recovered is not None and cos_recovered.interval.estimate > t.cosine_effect:
        out.append((cos_recovered, f"keeping only this layer in higher precision recovers "
                                   f"{cos_recovered.interval.estimate:.4f} of mean cosine to the reference"
                                   f"{_ci(cos_recovered, 1, 4)} > {t.cosine_effect:g}"))
    if cos_cost is not None and -cos_cost.interval.estimate > t.cosine_effect:
        out.append((cos_cost, f"quantizing only this layer costs {-cos_cost.interval.estimate:.4f} of mean cosine "
                              f"to the reference{_ci(cos_cost, 1, 4)} > {t.cosine_effect:g}"))
    return out


def _measured(by_accuracy: bool, only_this_delta: float | None, all_but_this_delta: float | None,
              all_but_this_diff: PairedEffect | None, only_this_diff: PairedEffect | None, name: str,
              recovered: PairedEffect | None, cost: PairedEffect | None,
              cos_recovered: PairedEffect | None, cos_cost: PairedEffect | None) -> str:
    """The "but measured" sentence that turns a heuristic flag into a watch ("" when nothing was measured)."""
    if by_accuracy:
        assert only_this_delta is not None and all_but_this_delta is not None
        return (f"but measured: keeping only it in higher precision changes accuracy by "
                f"{all_but_this_delta * 100:+.2f} points{_ci(all_but_this_diff)} and quantizing only it by "
                f"{only_this_delta * 100:+.2f}{_ci(only_this_diff)} (within the thresholds)")
    if recovered is None or cost is None:
        return ""
    cos = ""
    if cos_recovered is not None and cos_cost is not None:
        cos = (f"; mean cosine by {cos_recovered.interval.estimate:+.4f}{_ci(cos_recovered, 1, 4)} and "
               f"{cos_cost.interval.estimate:+.4f}{_ci(cos_cost, 1, 4)}")
    return (f"but measured: keeping only it in higher precision changes {name} by "
            f"{recovered.interval.estimate * 100:+.2f} points{_ci(recovered)} and quantizing only it by "
            f"{cost.interval.estimate * 100:+.2f}{_ci(cost)}{cos} (within the thresholds)")


def _unsettled(d: PairedEffect | None) -> bool:
    return d is not None and not d.significant


def _ci(d: PairedEffect | None, scale: float = 100, digits: int = 2) -> str:
    if d is None:
        return ""
    return f" (95 % CI {d.interval.low * scale:+.{digits}f} to {d.interval.high * scale:+.{digits}f})"


def _settle(d: PairedEffect | None) -> str:
    if d is None or d.significant:
        return ""
    need = d.examples_to_settle()
    more = f"; about {need:,} examples would settle it" if need else ""
    return f": insufficient evidence on {d.n} examples{more}"


def _fidelity(d: PairedEffect | None) -> list[str]:
    if d is None or not d.significant or d.interval.estimate <= 0:
        return []
    return [f"keeping only it in higher precision removes {d.interval.estimate * 100:.2f} % of the flips to the "
            f"reference{_ci(d)}"]


def gate_on_overall(flag: LayerFlag, overall: PairedEffect | None, names: tuple[str, str] = ("A", "B")
                    ) -> LayerFlag:
    """No keep-in-FP16 advice from heuristics alone when B is not significantly less accurate than A: the layer
    is only watched. A keep that rests on the layer's own settled measurement stands (that measurement says
    what this layer costs, the overall difference does not), and so do FP32 keeps (non-finite values, FP16
    overflow): they are about FP16, not about accuracy."""
    if (flag.flag is not Flag.KEEP_FP16 or flag.measured_harm or overall is None
            or (overall.significant and overall.interval.estimate < 0)):
        return flag
    a, b = names
    iv = overall.interval
    why = (f"but {b} is not significantly less accurate than {a} ({iv.estimate * 100:+.2f} points, 95 % CI "
           f"{iv.low * 100:+.2f} to {iv.high * 100:+.2f}): no layer needs higher precision for accuracy")
    return replace(flag, flag=Flag.WATCH, reasons=(*flag.reasons, why))


# -- findings: flags that share a cause -----------------------------------------------------------------------
# One method clipping a whole family of tensors (every attention Softmax output, every GELU output) flags each
# affected input on its own, most of them "insufficient evidence" on a small sample, and per-layer advice then
# swings with the sample. The cause is one range rule, and so is the fix: the inputs are reported as one finding.

FLAG_ORDER = (Flag.OK, Flag.WATCH, Flag.INSUFFICIENT, Flag.KEEP_FP16, Flag.KEEP_FP32)
