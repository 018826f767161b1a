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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from calibkit.evidence.candidates import Measured, Plan, as_plan

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # typing.TypeIs is 3.13+; only read by the type checker


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
    """A score that carries its own decision (evidence.plan_decisions.Judged): ``meets`` is taken as given."""

    @property
    def accuracy(self) -> float: ...
    @property
    def agreement(self) -> float: ...
    @property
    def meets(self) -> bool: ...
    @property
    def texts(self) -> int: ...


# accuracy; (accuracy, agreement); (accuracy, agreement, mean cosine); or a decided score (a cosine target is
# decided only by a decision rule: evidence.plan_decisions)
Plain = float | tuple[float, float] | tuple[float, float, float]
Score = Plain | Judged


def _judged(score: Score) -> TypeIs[Judged]:
    """Whether ``score`` carries its own decision: of the kinds of :data:`Score`, only a judged one has ``meets``."""
    return hasattr(score, "meets")


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
    parallel); a score that carries ``meets`` (evidence.plan_decisions.Judged: decided by a decision rule on as
    many texts as the decision needed) is taken as decided, and the thresholds below do not apply to it.
    ``threshold``: the lowest accuracy that meets the target; ``min_agreement`` (a fraction): the
    lowest agreement with FP32; with ``agreement_examples`` (the search split's size) and ``agreement_z`` > 0 it
    is the one-sided Wilson lower bound of the measured agreement that must reach it, so that a plan which
    only just meets the target on the search split, by the luck of those examples, does not count as met.
    ``anchors``: when the first prefix that meets the target has no ``margin``, also measure the next ``anchors``
    sizes of the doubling ladder (more kept, stage "anchor"; never the whole ranking, which leaves nothing to INT8)
    until one meets the target with margin, then halve the gap between the first passing prefix and it once (to half
    the prefix) for fewer kept layers with margin. One step, not a bisection to the last layer: the confirmation
    tests only the least-INT8 passing plan and the ones with the most (evidence.confirm), so finer anchors are
    rarely tested; on the demo classifier, anchors of 32, 24, 20 and 18 kept layers cost 64 s of a 784-s tune on two
    cores, and only the 32 and the 18 were confirmed. Bisect and prune find plans at the edge of the target by
    construction; the anchors are plans with margin, so the confirmation on the holdout (evidence.confirm, which
    tests the least INT8 first) has candidates it can confirm on its way up.
    ``margin``: whether a measured plan is far enough past the target (tune: whether the holdout could certify
    its agreement if it saw the same); None: the first anchor that meets the target is taken.
    """
    tried = _Tried(flops, evaluate, threshold, max_evaluations, min_agreement, agreement_examples, agreement_z,
                   margin)
    base = tried.measure(as_plan(()), "all-int8")
    if base is not None and base.meets:
        return SearchOutcome(base, tried.all())
    order = list(dict.fromkeys(ranking))
    lo, hi = _ladder(order, tried, anchors)
    if hi is None:
        return SearchOutcome(tried.best(), tried.all())
    while hi - lo > 1 and tried.left():
        mid = (lo + hi) // 2
        m = tried.measure(as_plan(order[:mid]), "bisect")
        if m is None:
            break
        lo, hi = (lo, mid) if m.meets else (mid, hi)
    kept = list(order[:hi])
    stop = max_evaluations if prune_budget is None else min(max_evaluations, len(tried.plans) + prune_budget)
    _prune(kept, flops, prune_min_share, stop, tried.plans, tried.measure_many)
    return SearchOutcome(tried.best(), tried.all())


@dataclass
class _Tried:
    """The plans ``search_plan`` measured, and how it measures and judges one: the evaluation budget, the
    target, the margin the anchors need."""

    flops: Mapping[str, float]
    evaluate: Callable[[Sequence[Plan]], Sequence[Score]]
    threshold: float
    max_evaluations: int
    min_agreement: float | None
    agreement_examples: int
    agreement_z: float
    margin: Callable[[Measured], bool] | None
    plans: dict[Plan, Measured] = field(default_factory=dict)

    def left(self) -> bool:
        return len(self.plans) < self.max_evaluations

    def all(self) -> tuple[Measured, ...]:
        return tuple(self.plans.values())

    def meets(self, acc: float, agr: float) -> bool:
        from calibkit.evidence.intervals import wilson_lower

        if acc < self.threshold:
            return False
        # no flips at all is no evidence of any: the bound cannot reach a 100 % target, the estimate can
        need = self.min_agreement
        return need is None or (not math.isnan(agr) and agr >= need and (
            agr >= 1.0 or wilson_lower(agr, self.agreement_examples, self.agreement_z) >= need))

    def measure_many(self, plans: Sequence[Plan], stage: str) -> list[Measured]:
        fresh = [p for p in dict.fromkeys(plans) if p not in self.plans]
        fresh = fresh[: max(self.max_evaluations - len(self.plans), 0)]
        for p, score in zip(fresh, self.evaluate(fresh) if fresh else [], strict=True):
            share = int8_flops_fraction(p, self.flops)
            if _judged(score):  # decided by the evaluator (a sequential rule): taken as given
                self.plans[p] = Measured(p, float(score.accuracy), share, stage, bool(score.meets),
                                         float(score.agreement), float(getattr(score, "cosine", math.nan)),
                                         int(score.texts))
                continue
            acc, agr, cos = _unpack(score)
            self.plans[p] = Measured(p, acc, share, stage, self.meets(acc, agr), agr, cos)
        return [self.plans[p] for p in plans if p in self.plans]

    def measure(self, plan: Plan, stage: str) -> Measured | None:
        (m,) = self.measure_many([plan], stage) or (None,)
        return m

    def best(self) -> Measured | None:
        ok = [m for m in self.plans.values() if m.meets]
        return max(ok, key=lambda m: (m.int8_flops_fraction, _or0(m.agreement), m.accuracy)) if ok else None

    def with_margin(self, m: Measured | None) -> bool:
        return m is not None and m.meets and (self.margin is None or self.margin(m))


def _ladder(order: list[str], tried: _Tried, anchors: int) -> tuple[int, int | None]:
    """Keep the top 1, 2, 4, ... of ``order`` until a prefix meets the target (then, with ``anchors``, look for
    one with margin past it): the largest failing and the smallest passing prefix (None: none passed)."""
    sizes: list[int] = []
    k = 1
    while k < len(order):
        sizes.append(k)
        k *= 2
    sizes.append(len(order))
    lo = 0
    for i, k in enumerate(sizes):
        m = tried.measure(as_plan(order[:k]), "prefix")
        if m is None:
            break
        if m.meets:
            if anchors > 0 and not (tried.margin is not None and tried.margin(m)):
                _anchor(order, sizes, i, tried, anchors)
            return lo, k
        lo = k
    return lo, None


def _anchor(order: list[str], sizes: list[int], i: int, tried: _Tried, anchors: int) -> None:
    """Plans with margin past the first passing prefix, ``sizes[i]`` (see ``search_plan``'s ``anchors``)."""
    lo, found = sizes[i], None
    for a in [a for a in sizes[i + 1:i + 1 + anchors] if a < len(order)]:  # keeping all is no plan
        if tried.with_margin(tried.measure(as_plan(order[:a]), "anchor")):
            found = a
            break
        lo = a
    while found is not None and tried.margin is not None and found - lo > max(1, sizes[i] // 2) and tried.left():
        mid = (lo + found) // 2
        lo, found = (lo, mid) if tried.with_margin(tried.measure(as_plan(order[:mid]), "anchor")) else (mid, found)


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


def _unpack(score: Plain) -> tuple[float, float, float]:
    if not isinstance(score, tuple):
        return float(score), math.nan, math.nan
    vals = [float(v) for v in score] + [math.nan] * (3 - len(score))
    return vals[0], vals[1], vals[2]


def _or0(v: float) -> float:
    return 0.0 if math.isnan(v) else v
