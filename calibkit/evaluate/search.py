"""Mixed-precision plan search: the fewest layers in higher precision that meet an accuracy target.

Pure logic over an ``evaluate`` callback (a measured accuracy per candidate, or an (accuracy, agreement with
FP32) pair), so it is tested with fake evaluators and runs unchanged over a process pool or a distributed engine.
A candidate meets the target when its accuracy reaches ``threshold`` and, when ``min_agreement`` is given, its
agreement with FP32 reaches it too; among those, the most INT8 FLOPs win, then the highest agreement.

Strategy, every step measured:
1. all layers INT8; done if it meets the target;
2. keep the top-k layers of the sensitivity ranking in higher precision, k = 1, 2, 4, 8, ... until a candidate
   meets the target, then bisect k between the last failure and the first success; with ``anchors`` > 0,
   larger prefixes with margin past the target are measured too (see ``search_plan``);
3. prune: try returning each kept layer to INT8, most FLOPs first, keeping each return that still meets the
   target (the ranking is only an estimate; layers interact), and pass again while a pass returned any. With
   ``prune_min_share``, layers under that share of the FLOPs are tried once, all together (one at a time they
   cost a whole evaluation each for a fraction of a percent of INT8); ``prune_budget`` caps the stage.
The answer is the measured candidate that meets the target with the largest INT8 share of MatMul/Gemm FLOPs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

Plan = tuple[str, ...]  # node names kept in higher precision, sorted


def as_plan(nodes: Sequence[str] | set[str] | frozenset[str]) -> Plan:
    return tuple(sorted(set(nodes)))


@dataclass(frozen=True)
class Measured:
    plan: Plan
    accuracy: float
    int8_flops_fraction: float
    stage: str  # "all-int8" | "prefix" | "anchor" | "bisect" | "prune"
    meets: bool
    agreement: float = float("nan")  # share of FP32's predictions kept (the task's agreement)
    cosine: float = float("nan")  # embeddings: mean cosine to FP32's vectors
    texts: int | None = None  # search rows the decision rested on, when the evaluator says (a Judged score)


@dataclass(frozen=True)
class SearchOutcome:
    best: Measured | None  # None when no candidate met the target
    tried: tuple[Measured, ...]


def int8_flops_fraction(plan: Plan, flops: Mapping[str, float]) -> float:
    total = sum(flops.values())
    if total <= 0:
        return 0.0
    kept = sum(flops.get(n, 0.0) for n in plan)
    return (total - kept) / total


class Judged(Protocol):
    """A score that carries its own decision (evaluate.plan_decisions.Judged): ``meets`` is taken as given."""

    accuracy: float
    agreement: float
    meets: bool
    texts: int


# accuracy; (accuracy, agreement); (accuracy, agreement, mean cosine); or a decided score (a cosine target is
# decided only by a decision rule: evaluate.plan_decisions)
Score = float | tuple[float, float] | tuple[float, float, float] | Judged


def search_plan(
    ranking: Sequence[str],
    flops: Mapping[str, float],
    evaluate: Callable[[Sequence[Plan]], Sequence[Score]],
    threshold: float,
    *,
    max_evaluations: int = 40,
    min_agreement: float | None = None,
    agreement_examples: int = 0,
    agreement_z: float = 0.0,
    anchors: int = 0,
    margin: Callable[[Measured], bool] | None = None,
    prune_min_share: float = 0.0,
    prune_budget: int | None = None,
) -> SearchOutcome:
    """``ranking``: nodes, most harmful in INT8 first. ``evaluate`` measures several plans (it may run them in
    parallel); a score that carries ``meets`` (evaluate.plan_decisions.Judged: decided by a decision rule on as
    many texts as the decision needed) is taken as decided, and the thresholds below do not apply to it.
    ``threshold``: the lowest accuracy that meets the target; ``min_agreement`` (a fraction): the
    lowest agreement with FP32; with ``agreement_examples`` (the search split's size) and ``agreement_z`` > 0 it
    is the one-sided Wilson lower bound of the measured agreement that must reach it, so that a plan which
    only just meets the target on the search split, by the luck of those examples, does not count as met.
    ``anchors``: when the first prefix that meets the target has no ``margin``, also measure the next
    ``anchors`` sizes of the doubling ladder (more kept, stage "anchor"; never the whole ranking, which leaves
    nothing to INT8) until one meets the target with margin, then bisect between the first passing prefix and
    it (to an eighth of the prefix) for the fewest kept layers with margin. Bisect and prune find plans at the
    edge of the target by construction; the anchors are plans with margin, so the confirmation on the holdout
    (evaluate.confirm, which tests the least INT8 first) has candidates it can confirm on its way up.
    ``margin``: whether a measured plan is far enough past the target (tune: whether the holdout could certify
    its agreement if it saw the same); None: the first anchor that meets the target is taken.

    Kept in one piece (over 80 lines) on purpose: the prefix, bisect and prune stages share the
    evaluation budget and the set of measured plans, which one function keeps in view.
    """
    from calibkit.results.intervals import wilson_lower

    tried: dict[Plan, Measured] = {}

    def meets(acc: float, agr: float) -> bool:
        if acc < threshold:
            return False
        # no flips at all is no evidence of any: the bound cannot reach a 100 % target, the estimate can
        return min_agreement is None or (not math.isnan(agr) and agr >= min_agreement and (
            agr >= 1.0 or wilson_lower(agr, agreement_examples, agreement_z) >= min_agreement))

    def measure(plans: Sequence[Plan], stage: str) -> list[Measured]:
        fresh = [p for p in dict.fromkeys(plans) if p not in tried]
        budget = max_evaluations - len(tried)
        fresh = fresh[: max(budget, 0)]
        if fresh:
            for p, score in zip(fresh, evaluate(fresh), strict=True):
                if hasattr(score, "meets"):  # decided by the evaluator (a sequential rule): taken as given
                    acc, agr = float(score.accuracy), float(score.agreement)
                    tried[p] = Measured(p, acc, int8_flops_fraction(p, flops), stage, bool(score.meets), agr,
                                        float(getattr(score, "cosine", math.nan)), int(score.texts))
                    continue
                acc, agr, cos = _unpack(score)
                tried[p] = Measured(p, acc, int8_flops_fraction(p, flops), stage, meets(acc, agr), agr, cos)
        return [tried[p] for p in plans if p in tried]

    def best() -> Measured | None:
        ok = [m for m in tried.values() if m.meets]
        return max(ok, key=lambda m: (m.int8_flops_fraction, _or0(m.agreement), m.accuracy)) if ok else None

    def with_margin(m: Measured | None) -> bool:
        return m is not None and m.meets and (margin is None or margin(m))

    def anchor(i: int) -> None:  # plans with margin past the first passing prefix, sizes[i] (see ``anchors``)
        lo, found = sizes[i], None
        for a in [a for a in sizes[i + 1:i + 1 + anchors] if a < len(order)]:  # keeping all is no plan
            (m,) = measure([as_plan(order[:a])], "anchor") or (None,)
            if with_margin(m):
                found = a
                break
            lo = a
        while found is not None and margin is not None and found - lo > max(1, sizes[i] // 8) \
                and len(tried) < max_evaluations:
            mid = (lo + found) // 2
            (m,) = measure([as_plan(order[:mid])], "anchor") or (None,)
            lo, found = (lo, mid) if with_margin(m) else (mid, found)

    base = measure([()], "all-int8")
    if base and base[0].meets:
        return SearchOutcome(base[0], tuple(tried.values()))

    order = list(dict.fromkeys(ranking))
    sizes: list[int] = []
    k = 1
    while k < len(order):
        sizes.append(k)
        k *= 2
    sizes.append(len(order))
    lo, hi = 0, None  # largest failing k, smallest passing k
    for i, k in enumerate(sizes):
        (m,) = measure([as_plan(order[:k])], "prefix") or (None,)
        if m is None:
            break
        if m.meets:
            hi = k
            if anchors > 0 and not (margin is not None and margin(m)):
                anchor(i)
            break
        lo = k
    if hi is None:
        return SearchOutcome(best(), tuple(tried.values()))
    while hi - lo > 1 and len(tried) < max_evaluations:
        mid = (lo + hi) // 2
        (m,) = measure([as_plan(order[:mid])], "bisect") or (None,)
        if m is None:
            break
        if m.meets:
            hi = mid
        else:
            lo = mid
    kept = list(order[:hi])
    stop = max_evaluations if prune_budget is None else min(max_evaluations, len(tried) + prune_budget)
    _prune(kept, flops, prune_min_share, stop, tried, measure)
    return SearchOutcome(best(), tuple(tried.values()))


def _prune(kept: list[str], flops: Mapping[str, float], min_share: float, stop: int, tried: dict[Plan, Measured],
           measure: Callable[[Sequence[Plan], str], list[Measured]]) -> None:
    """The prune stage of ``search_plan`` on ``kept`` (changed in place) until ``len(tried)`` reaches ``stop``."""
    total = sum(flops.values()) or 1.0
    small = {n for n in kept if flops.get(n, 0.0) / total < min_share}

    def attempt(back: Sequence[str]) -> bool:
        trial = as_plan([n for n in kept if n not in back])
        if trial in tried and not tried[trial].meets:
            return False
        (m,) = measure([trial], "prune") or (None,)
        if m is not None and m.meets:
            for n in back:
                kept.remove(n)
            return True
        return False

    changed = True
    while changed and len(tried) < stop:  # another pass after any return: layers interact
        changed = False
        for node in sorted((n for n in kept if n not in small), key=lambda n: -flops.get(n, 0.0)):
            if len(tried) >= stop:
                return
            changed = attempt([node]) or changed
    if small and len(tried) < stop:
        attempt([n for n in kept if n in small])


def _unpack(score: Score) -> tuple[float, float, float]:
    if not isinstance(score, tuple):
        return float(score), math.nan, math.nan
    vals = [float(v) for v in score] + [math.nan] * (3 - len(score))
    return vals[0], vals[1], vals[2]


def _or0(v: float) -> float:
    return 0.0 if math.isnan(v) else v
