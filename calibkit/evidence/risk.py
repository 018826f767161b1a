"""Evidence where the risk is: the search split in strata by flip risk, every candidate judged on all of the risky
texts and a seeded random sample of the others, with a stratified estimate and lower bound.

Most texts cannot flip. On the demo classifier and 4,000 unseen log texts, the texts whose FP32 top-2
probability gap is under 0.2 (12.7 % of them) held 89 % of all-INT8's flips; the two thirds with a gap of 0.5
or more held one. A text's risk is read from two things measured before the search, at no extra cost: FP32's
margin on it (:func:`margins`: the top-2 probability gap of a classifier, the gap between an embedding's
nearest and second-nearest neighbour in the FP32 index) and whether the all-INT8 model already changed it.
The strata (:func:`stratify`) are *risky* (all-INT8 changed it, or a margin under ``risky``), *uncertain* (a
margin under ``safe``) and *safe* (the rest), separately for labelled and traffic rows; the risky stratum is
evaluated in full, the others are sampled (seeded, without replacement) at a rate with a floor.

A constraint's mean is estimated stratum by stratum and weighted by each stratum's share of the rows the
constraint counts (the stratified estimator, unbiased whatever the risk model gets wrong), and its lower bound
is ``estimate - z * sqrt(sum W_h^2 v_h / n_h)``. ``v_h`` is the stratum's variance with a floor that keeps a
stratum in which nothing changed from claiming certainty: for 0/1 values ``p(1-p)`` of the add-one estimate
``(k + 1) / (n + 2)``. A wrong risk model costs width, not validity: flips in a sampled stratum are weighted up
by its sampling rate. The error rate of the bound at the target is checked by simulation in the tests, as the
sequential rule's is.

This judge only chooses among candidates. What the plan claims rests on the holdout split, which stays a plain
random sample, judged by the sequential rule (evidence.confirm): a risk model that hid flips from the search
could not hide them there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist

import numpy as np

from calibkit.evidence.candidates import Plan
from calibkit.evidence.plan_decisions import (
    ACCURACY_DROP,
    ChunkResult,
    Judged,
    RunChunks,
    chunk_subset,
    chunk_values,
)
from calibkit.evidence.sequential import Constraint, Decision, DecisionRule, Verdict
from calibkit.evidence.split import SplitEvidence
from calibkit.evidence.subsets import EvalSubset

RISKY, UNCERTAIN, SAFE = "risky", "uncertain", "safe"
STRATIFIED = "stratified"  # the rule name tune records for this judge


@dataclass(frozen=True)
class RiskDesign:
    """Where the strata are cut and how much of each is sampled. Classifiers: ``risky`` / ``safe`` are FP32
    top-2 probability gaps; embeddings: quantiles of the neighbour margin (``risky_quantile``, ``safe_quantile``),
    whose scale depends on the model."""

    risky: float = 0.2
    safe: float = 0.5
    risky_quantile: float = 0.15
    safe_quantile: float = 0.5
    uncertain_share: float = 0.25
    uncertain_min: int = 150
    safe_share: float = 0.06
    safe_min: int = 200


def margins(evidence: SplitEvidence) -> np.ndarray | None:
    """FP32's margin per evidence row (larger: further from changing), as its task kind measures it (the top-2
    probability gap of a classifier, the gap between a text's two nearest neighbours for an embedder); None
    for a task without one."""
    return evidence.kind.flip_margins(np.asarray(evidence.reference, dtype=np.float64))


def risky_subset(evidence: SplitEvidence, subset: EvalSubset, n: int) -> EvalSubset:
    """The ``n`` rows of ``subset`` whose FP32 margin is smallest, smallest first (where calibration tables and
    single layers differ: a text far from FP32's decision boundary flips under none of them). Without a margin
    (token tasks): the first ``n`` rows of ``subset``'s seeded order."""
    if len(subset) <= n and margins(evidence) is None:
        return subset
    m = margins(evidence)
    if m is None:
        return replace(subset, indices=subset.indices[:n], strategy="risky", content_sha256="")
    order = np.argsort(m[subset.array], kind="stable")[:n]
    return replace(subset, indices=tuple(subset.indices[i] for i in order), strategy="risky", content_sha256="")


@dataclass(frozen=True)
class Strata:
    """A partition of a subset's positions into strata, and the positions of each that are evaluated."""

    names: tuple[str, ...]
    members: tuple[np.ndarray, ...]  # positions in the subset's row order
    sampled: tuple[np.ndarray, ...]  # the members evaluated (all of the risky ones)

    @property
    def evaluated(self) -> np.ndarray:
        return np.sort(np.concatenate(self.sampled)) if self.sampled else np.zeros(0, dtype=np.int64)

    def describe(self) -> str:
        return ", ".join(f"{name} {len(s)}/{len(m)}" for name, m, s in zip(self.names, self.members, self.sampled))


def stratify(evidence: SplitEvidence, subset: EvalSubset, base_agreement: Sequence[float] | np.ndarray,
             design: RiskDesign = RiskDesign(), seed: int = 0) -> Strata | None:
    """The strata of ``subset`` by flip risk; ``base_agreement``: the all-INT8 model's per-text agreement on
    ``subset`` (its row order). None when the task has no margin (every text is then evaluated)."""
    m_all = margins(evidence)
    if m_all is None:
        return None
    idx = subset.array
    m = m_all[idx]
    moved = np.asarray(base_agreement, dtype=np.float64) < 1.0
    if len(moved) != len(idx):
        raise ValueError(f"all-INT8 agreement has {len(moved)} values for a subset of {len(idx)} texts")
    if evidence.kind.margin_scale == "absolute":
        lo, hi = design.risky, design.safe
    else:
        lo, hi = (float(np.quantile(m, q)) for q in (design.risky_quantile, design.safe_quantile))
    level = np.where(moved | (m < lo), 0, np.where(m < hi, 1, 2))
    kind = np.zeros(len(idx), dtype=np.int64) if evidence.traffic is None else evidence.traffic[idx].astype(np.int64)
    rng = np.random.default_rng(seed)
    names, members, sampled = [], [], []
    for k in np.unique(kind):
        for lev, (name, share, floor) in enumerate(((RISKY, 1.0, 0), (UNCERTAIN, design.uncertain_share,
                                                     design.uncertain_min),
                                                    (SAFE, design.safe_share, design.safe_min))):
            pos = np.flatnonzero((kind == k) & (level == lev))
            if not len(pos):
                continue
            n = min(len(pos), max(floor, math.ceil(share * len(pos))))
            take = pos if n == len(pos) else np.sort(rng.choice(pos, size=n, replace=False))
            names.append(name if evidence.traffic is None else f"{'traffic' if k else 'labelled'} {name}")
            members.append(pos)
            sampled.append(take)
    return Strata(tuple(names), tuple(members), tuple(sampled))


def stratified_bound(values: Sequence[np.ndarray], sizes: Sequence[int], constraint: Constraint, z: float
                     ) -> tuple[float, float]:
    """(estimate, lower bound) of the mean over all members from each stratum's sampled ``values`` and its
    member count ``sizes`` (see the module docstring)."""
    total = float(sum(sizes))
    est, var = 0.0, 0.0
    for v, size in zip(values, sizes):
        if not size:
            continue
        w = size / total
        n = len(v)
        if not n:  # a stratum with members and no sample cannot be estimated: assume its worst
            est += w * constraint.low
            continue
        est += w * float(np.mean(v))
        if n >= size:  # evaluated in full: no sampling error within the split
            continue
        if constraint.binary:
            p = (float(np.sum(v)) + 1.0) / (n + 2.0)
            s2 = p * (1.0 - p)
        else:
            span = constraint.high - constraint.low
            s2 = max(float(np.var(v, ddof=1)) if n > 1 else span**2 / 4, (span / (n + 2.0)) ** 2)
        var += w * w * s2 / n * (1.0 - n / size)
    return est, est - z * math.sqrt(var)


@dataclass(eq=False)
class _Seen:
    result: ChunkResult  # SensitivityResult over ``positions``
    positions: np.ndarray


@dataclass(eq=False)
class StratifiedJudge:
    """Judges plans on the evaluated positions of ``strata`` (one evaluation each) with the stratified bound
    at ``confidence``; the interface of ``plan_decisions.PlanJudge`` that tune's search and confirmation use.
    ``rule``: the decision rule whose final confidence sets what the holdout can certify (evaluate.tune)."""

    evidence: SplitEvidence
    subset: EvalSubset
    strata: Strata
    constraints: tuple[Constraint, ...]
    run_chunks: RunChunks
    confidence: float
    rule: DecisionRule
    completed_texts: int = 0
    _seen: dict[Plan, _Seen] = field(default_factory=dict)
    _judged: dict[Plan, Judged] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._size_memo: dict[bool, list[int]] = {}
        self._where = np.full(len(self.subset), -1, dtype=np.int64)  # subset position -> stratum
        for h, m in enumerate(self.strata.members):
            self._where[m] = h

    def seed(self, plan: Plan, whole: ChunkResult) -> None:
        """``plan`` already evaluated on the whole subset (texts in its row order)."""
        self._seen.setdefault(plan, _Seen(whole, np.arange(len(self.subset))))

    def judge(self, plans: Sequence[Plan]) -> list[Judged]:
        pos = self.strata.evaluated
        todo = [p for p in dict.fromkeys(plans) if p not in self._seen]
        if todo:
            results = self.run_chunks([(p, chunk_subset(self.subset, pos)) for p in todo])
            for p, r in zip(todo, results, strict=True):
                self._seen[p] = _Seen(r, pos)
        for p in plans:
            if p not in self._judged:
                self._judged[p] = self._decide(self._seen[p])
        return [self._judged[p] for p in plans]

    def _values(self, seen: _Seen) -> tuple[EvalSubset, dict[str, np.ndarray], np.ndarray]:
        """The evaluated rows as a chunk, each constraint's values on them, and their positions in the subset."""
        keep = np.isin(seen.positions, self.strata.evaluated)
        pos = seen.positions[keep]
        result = seen.result
        if not keep.all():  # a whole-subset result: only the evaluated rows count, as for every other plan
            from calibkit.evidence.plan_decisions import restrict

            result = restrict(result, np.flatnonzero(keep))
        chunk = chunk_subset(self.subset, pos)
        return chunk, chunk_values(self.evidence, chunk, result, self.constraints), pos

    def _decide(self, seen: _Seen) -> Judged:
        chunk, values, pos = self._values(seen)
        z = NormalDist().inv_cdf(self.confidence) if self.confidence > 0.5 else 0.0
        decisions, estimates = [], {}
        for c in self.constraints:
            rows = (self.evidence.accuracy_positions(chunk) if c.name == ACCURACY_DROP
                    else self.evidence.agreement_positions(chunk))
            stratum = self._where[pos[rows]]
            sizes = self._sizes(c.name == ACCURACY_DROP)
            per = [values[c.name][stratum == h] for h in range(len(self.strata.names))]
            est, low = stratified_bound(per, sizes, c, z)
            # accuracy is estimated (the holdout verdict checks it); fidelity targets are certified
            meets = est >= c.threshold - 1e-12 if c.name == ACCURACY_DROP else low >= c.threshold
            decisions.append(Decision(c.name, Verdict.MEETS if meets else Verdict.MISSES, int(len(rows)), est,
                                      c.threshold, self.confidence, by=STRATIFIED, lower=low))
            estimates[c.name] = est
        acc = self._accuracy(chunk, seen, pos)
        return Judged(acc, estimates.get("agreement", float("nan")), all(d.verdict is Verdict.MEETS
                                                                          for d in decisions),
                      int(len(pos)), estimates.get("cosine", float("nan")), tuple(decisions))

    def _sizes(self, accuracy: bool) -> list[int]:
        """Members per stratum among the rows a constraint counts: the labelled rows for accuracy, the agreement
        rows for the rest (the same for every plan: computed once)."""
        if accuracy not in self._size_memo:
            everything = chunk_subset(self.subset, np.arange(len(self.subset)))
            rows = (self.evidence.accuracy_positions(everything) if accuracy
                    else self.evidence.agreement_positions(everything))
            self._size_memo[accuracy] = [int(np.sum(self._where[rows] == h)) for h in range(len(self.strata.names))]
        return self._size_memo[accuracy]

    def _accuracy(self, chunk: EvalSubset, seen: _Seen, pos: np.ndarray) -> float:
        """Accuracy on the labelled rows, stratified like the constraints (NaN without labelled rows)."""
        rows = self.evidence.accuracy_positions(chunk)
        if not len(rows):
            return float("nan")
        keep = np.isin(seen.positions, pos)
        pred = np.asarray(getattr(seen.result, "predictions", ()), dtype=np.int64)
        if len(pred) != len(seen.positions):
            return float("nan")
        pred = pred[keep]
        correct = (pred[rows] == self.evidence.labels[chunk.array[rows]]).astype(np.float64)
        stratum = self._where[pos[rows]]
        sizes = self._sizes(True)
        total = float(sum(sizes))
        return float(sum(size / total * float(np.mean(correct[stratum == h]))
                         for h, size in enumerate(sizes) if size and np.any(stratum == h)))

    def complete(self, plan: Plan) -> ChunkResult:  # over the whole subset, in its row order
        """``plan`` on every row of the subset: the rows its decision did not need are evaluated now."""
        from calibkit.evidence.plan_decisions import stitch

        seen = self._seen.get(plan)
        n = len(self.subset)
        if seen is not None and len(seen.positions) == n:
            return seen.result
        done = seen.positions if seen is not None else np.zeros(0, dtype=np.int64)
        rest = np.setdiff1d(np.arange(n), done)
        (r,) = self.run_chunks([(plan, chunk_subset(self.subset, rest))])
        self.completed_texts += len(rest)
        parts = ([seen.result] if seen is not None else []) + [r]
        positions = np.concatenate([done, rest])
        whole = stitch(parts, [done, rest] if seen is not None else [rest], np.argsort(positions, kind="stable"))
        assert whole is not None  # parts holds r: stitch returns None only for no chunks
        self._seen[plan] = _Seen(whole, np.arange(n))
        return whole

    def texts(self) -> dict[Plan, int]:
        """Texts each judged plan's decision rested on."""
        return {p: j.texts for p, j in self._judged.items()}
