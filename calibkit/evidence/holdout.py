"""The final plan's evidence on one split (paired accuracy against FP32, agreement, cosine, with 95 % intervals)
and the holdout verdict: per constraint, whether the split the search never used supports the claim."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from calibkit.evidence.intervals import mean_interval, paired_difference, proportion
from calibkit.evidence.rowfidelity import CLASSIFICATION, TextScores
from calibkit.evidence.split import SplitEvidence
from calibkit.evidence.subsets import EvalSubset
from calibkit.results.runs import AGREEMENT_NOUNS, Difference, HoldoutVerdict, PlanEvidence, Range, finite


class PlanTarget(Protocol):
    """What the plan must meet and the seed of its intervals' resampling, as tune's request
    (``requests.tune.TuneRequest``) states them: accuracy within ``max_drop`` points of FP32 (percent of FP32's
    accuracy when ``relative``; no accuracy target when ``fidelity_only``), agreement of at least
    ``min_agreement`` %, mean cosine of at least ``min_cosine``."""

    @property
    def seed(self) -> int: ...
    @property
    def fidelity_only(self) -> bool: ...
    @property
    def max_drop(self) -> float: ...
    @property
    def relative(self) -> bool: ...
    @property
    def min_agreement(self) -> float | None: ...
    @property
    def min_cosine(self) -> float | None: ...


def plan_evidence(config: PlanTarget, evidence: SplitEvidence, subset: EvalSubset,
                   r: TextScores | None) -> tuple[PlanEvidence | None, float | None]:
    """The final plan against FP32 on one split, with 95 % intervals, and its agreement with FP32: accuracy
    (paired) on the rows whose accuracy counts, agreement (and mean cosine) on those whose agreement counts."""
    idx = subset.array
    if r is None or len(r.agreement_values) != len(idx) or not len(idx):
        return None, None
    acc_p, agr_p = evidence.accuracy_positions(subset), evidence.agreement_positions(subset)
    ia, ig = idx[acc_p], idx[agr_p]
    diff = None
    if len(acc_p) and len(r.predictions) == len(idx):
        labels, ref_pred = evidence.labels, evidence.reference_predictions
        pred = np.asarray(r.predictions, dtype=np.int64)
        diff = paired_difference(ref_pred[ia] == labels[ia], pred[acc_p] == labels[ia], seed=config.seed)
    values = np.asarray(r.agreement_values, dtype=np.float64)[agr_p]
    agree = proportion(values >= 1.0) if evidence.kind.binary_agreement else mean_interval(values)
    cosine = None
    if r.cosine_values:
        cosine = Range.of(mean_interval(np.asarray(r.cosine_values, dtype=np.float64)[agr_p]))
    no_accuracy = Difference(None, None, None, 0, 0, 0, None, False, "n/a")
    ev = PlanEvidence(Difference.of(diff) if diff is not None else no_accuracy,
                      Range.of(agree), int((values < 1.0).sum()), int(len(ia)),
                      agreement_n=int(len(ig)) if evidence.traffic is not None or not len(acc_p) else None,
                      cosine=cosine)
    return ev, finite(agree.estimate)


def allowed_change(config: PlanTarget, evidence: SplitEvidence) -> float | None:
    """The accuracy change against FP32 the target allows on the holdout (None: no accuracy constraint)."""
    if config.fidelity_only:
        return None
    fp32_hold = evidence.accuracy_of_reference(evidence.holdout)
    return -(fp32_hold * config.max_drop / 100.0 if config.relative else config.max_drop / 100.0)


NOT_CHECKED = "not checked (no texts in the holdout)"


def holdout_verdict(config: PlanTarget, ev: PlanEvidence | None, allowed: float | None,
                    task: str = CLASSIFICATION, *, confirmed: bool = False) -> HoldoutVerdict:
    """Whether the holdout split supports the claim, per constraint: 'supported' (met on the holdout),
    'not confirmed' (missed, but within the holdout's 95 % interval) or 'contradicted' (missed beyond it).
    ``confirmed``: the plan is the last candidate the holdout confirmed (evidence.confirm), which the text says."""
    if ev is None:
        return HoldoutVerdict(None, "no holdout split: the claim rests on the search split alone")
    d, a = ev.accuracy_minus_fp32, ev.agreement
    parts: dict[str, str] = {}
    if allowed is not None:  # an accuracy target (labelled rows); none of them in the holdout: not checked
        if allowed != allowed or d.estimate is None:
            parts["accuracy"] = NOT_CHECKED
        elif d.estimate >= allowed - 1e-12:
            parts["accuracy"] = "supported"
        else:
            parts["accuracy"] = "not confirmed" if (d.high or 0.0) >= allowed else "contradicted"
    if config.min_agreement is not None:  # a target the holdout has no texts for is not checked, not dropped
        parts["agreement"] = judged(a, config.min_agreement / 100.0) if a.estimate is not None else NOT_CHECKED
    if config.min_cosine is not None:
        c = ev.cosine
        parts["cosine"] = judged(c, config.min_cosine) if c is not None and c.estimate is not None else NOT_CHECKED
    supported = None
    if parts:
        failed = any(v not in ("supported", NOT_CHECKED) for v in parts.values())
        supported = False if failed else (None if NOT_CHECKED in parts.values() else True)

    def pts(v: float | None, fmt: str) -> str:
        return "n/a" if v is None else format(100 * v, fmt)

    where = (f"{ev.n} examples" if ev.agreement_n is None
             else f"{ev.n} labelled examples and {ev.agreement_n} traffic texts")
    if ev.n == 0:
        where = f"{ev.agreement_n} texts"
    where += " never used by the search"
    if confirmed:
        where += ", which confirmed the plan among the search's passing candidates by fixed-sequence testing"
    kept = (f"it keeps {pts(a.estimate, '.2f')} % of {agreement_noun(task)} (95 % CI {pts(a.low, '.2f')} to "
            f"{pts(a.high, '.2f')})" if a.estimate is not None else "it has no texts to measure agreement on")
    if ev.n == 0:
        words = [f"on the holdout split ({where}) {kept}"]
    else:
        words = [f"on the holdout split ({where}) the plan's accuracy is "
                 f"{pts(d.estimate, '+.2f')} points from FP32 (95 % CI {pts(d.low, '+.2f')} to "
                 f"{pts(d.high, '+.2f')}, {d.verdict}) and {kept}"]
    c = ev.cosine
    if c is not None and c.estimate is not None:
        words.append(f"mean cosine to FP32 {c.estimate:.5f} (95 % CI {c.low:.5f} to {c.high:.5f})")
    for k, v in parts.items():
        words.append(f"{k} target: {v}")
    return HoldoutVerdict(supported, "; ".join(words), parts)


def judged(r: Range, need: float) -> str:
    if r.estimate is not None and r.estimate >= need - 1e-12:
        return "supported"
    return "not confirmed" if (r.high or 0.0) >= need else "contradicted"


def agreement_noun(task: str | None) -> str:
    return AGREEMENT_NOUNS.get(task or CLASSIFICATION, "FP32's outputs")
