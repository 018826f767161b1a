"""Judging candidate plans on the search split: pay for the decision, not for the whole split.

tune's plan search (evaluate.search) asks one question per candidate: does it meet the target? This module
answers it with a decision rule of :mod:`calibkit.evidence.sequential`:

- ``"sequential"`` (the default): :class:`~calibkit.evidence.sequential.ConfidenceSequenceRule`, a betting
  confidence sequence (testing by betting, Waudby-Smith & Ramdas 2023; the module docstring of
  ``evidence.sequential`` says why it and not alpha spending: valid under any number and timing of looks, for
  any bounded per-text value, and its chunk summaries add up, so a ledger can resume). Candidates are evaluated
  in growing chunks of the search split (``first_chunk`` texts, then doubling) and stop as soon as every
  constraint is decided at the configured confidence, or one is missed;
- ``"whole-split"``: :class:`~calibkit.evidence.sequential.WholeSplit`, every candidate on the whole split, then
  one fixed-n test (for agreement the exact binomial test, slightly stricter than the Wilson bound at the same
  confidence that the search used before this module).

The chunks are prefixes of one seeded order of the split (:func:`chunk_order`: the split's own hash order,
interleaved so that every prefix keeps each stratum's share — labelled and traffic rows, each label), except
beside traffic under an accuracy constraint: every labelled row then comes first and the looks count the
traffic rows after them (``PlanJudge._schedule`` says why). Every chunk is its own evaluation job, so tune's
ledger records it under its own key (the key hashes the texts): a resumed run reads finished chunks back and
redoes none. Candidates of one search step run together: the first chunk of all of them, then the next chunk
of those still undecided. Every chunk pays a fixed cost (before the switchboard, which serves every plan from one
session per process, building the variant and starting a session: on the demo at 2 loaded cores 17 s a job against
0.019 s a text, what 900 texts cost), so a look that the candidate's values so far project not to settle is skipped
(:meth:`PlanJudge._worth_looking`): a candidate in the band near the threshold costs two evaluations (the first
chunk, then the rest of the split), not one per doubling. And when the first look would not have settled the last
``BAND_STREAK`` candidates (replayed at no cost for those evaluated whole), the search is in the band and the next
candidate is evaluated on the whole split at once, in one evaluation, until a candidate's first look would have
settled it again. Look times chosen from what was already seen keep the confidence sequence valid.

Constraints (each the mean of per-text values, see evidence.rowfidelity):
- ``agreement``: share of FP32's outputs kept on the agreement rows (traffic rows when there are any), at least
  ``min_agreement`` %; *certified*: a candidate meets it only when the rule says so (a split too small to
  settle it is a miss, as the Wilson bound of the old search made it). One exception: against a 100 % target,
  which no bound can reach, a candidate that changed nothing at all on the whole split meets it;
- ``cosine`` (embeddings, ``min_cosine``): mean cosine to FP32's vectors on the agreement rows; certified;
- ``accuracy_drop`` (labelled rows, absent with ``fidelity_only``): per labelled text, candidate correct minus
  FP32 correct, at least ``-max_drop``; *estimated*: the rule may settle it early either way, and when the whole
  split leaves it undecided the point estimate decides, as before (a labelled set of a thousand texts can
  rarely certify half a point; the holdout verdict is where accuracy is checked).
With ``agreement_confidence`` 0.5 ("the point estimate", as the option has always said) every constraint is
estimated: the rule still stops a candidate early once it is settled either way at 0.5.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Protocol

import numpy as np

from calibkit.evidence.candidates import Plan
from calibkit.evidence.rowfidelity import TextScores
from calibkit.evidence.sequential import (
    ConfidenceSequenceRule,
    Constraint,
    Decision,
    DecisionRule,
    Summary,
    Verdict,
    WholeSplit,
)
from calibkit.evidence.split import SplitEvidence
from calibkit.evidence.subsets import EvalSubset

SEQUENTIAL = "sequential"
WHOLE_SPLIT = "whole-split"
DECISION_RULES = (SEQUENTIAL, WHOLE_SPLIT)
DEFAULT_FIRST_CHUNK = 256

AGREEMENT, COSINE, ACCURACY_DROP = "agreement", "cosine", "accuracy_drop"
ESTIMATED = (ACCURACY_DROP,)  # undecided after the whole split: the point estimate decides


def make_rule(name: str, confidence: float, first_chunk: int = DEFAULT_FIRST_CHUNK) -> DecisionRule:
    if name == SEQUENTIAL:
        return ConfidenceSequenceRule(confidence, first_chunk)
    if name == WHOLE_SPLIT:
        return WholeSplit(confidence)
    raise ValueError(f"unknown decision rule {name!r}: one of {', '.join(DECISION_RULES)}")


def chunk_order(evidence: SplitEvidence, subset: EvalSubset) -> np.ndarray:
    """Positions of ``subset`` (in its canonical, seeded hash order) reordered so that every prefix holds each
    stratum (traffic or labelled, and label) in its share of the split: each row of a stratum of size m at rank
    i gets the key (i + 0.5) / m, rows are sorted by it (ties: stratum, then position). Deterministic."""
    idx = subset.array
    strata = [(bool(evidence.traffic[i]) if evidence.traffic is not None else False, int(evidence.labels[i]))
              for i in idx]
    seen: dict[tuple[bool, int], int] = {}
    sizes: dict[tuple[bool, int], int] = {}
    for s in strata:
        sizes[s] = sizes.get(s, 0) + 1
    keys = []
    for pos, s in enumerate(strata):
        rank = seen.get(s, 0)
        seen[s] = rank + 1
        keys.append(((rank + 0.5) / sizes[s], s, pos))
    return np.asarray([k[2] for k in sorted(keys)], dtype=np.int64)


def chunk_subset(subset: EvalSubset, positions: np.ndarray) -> EvalSubset:
    """The rows of ``subset`` at ``positions`` (in that order), as a subset a job runs on."""
    return EvalSubset(tuple(int(subset.indices[p]) for p in positions), subset.total, subset.seed, "chunk", "")


def constraints_for(*, min_agreement: float | None, min_cosine: float | None, max_drop: float | None,
                    binary_agreement: bool) -> tuple[Constraint, ...]:
    """``min_agreement`` in percent; ``max_drop`` a fraction of accuracy (None: no accuracy constraint)."""
    out: list[Constraint] = []
    if max_drop is not None:
        out.append(Constraint.accuracy_drop(max_drop, ACCURACY_DROP))
    if min_agreement is not None:
        t = min(min_agreement / 100.0, 1.0 - 1e-9)  # 100 %: only "no change at all" meets it (see module doc)
        out.append(Constraint.agreement(t, AGREEMENT) if binary_agreement else Constraint.share(t, AGREEMENT))
    if min_cosine is not None:
        out.append(Constraint.cosine(min_cosine, name=COSINE))
    return tuple(out)


@dataclass(frozen=True)
class Judged:
    """A candidate's decision and its point estimates on the ``texts`` search rows it was evaluated on
    (accuracy on the labelled ones, agreement and cosine on the agreement ones; NaN where none counted)."""

    accuracy: float
    agreement: float
    meets: bool
    texts: int
    cosine: float = float("nan")
    decisions: tuple[Decision, ...] = ()


class ChunkResult(TextScores, Protocol):
    """A plan's evaluation on a chunk, as this module reads it: evaluate.jobs.SensitivityResult, a dataclass
    (:func:`restrict` and :func:`stitch` rebuild it with :func:`dataclasses.replace`); per text, in the order
    of the chunk's texts, the predictions, agreement values and cosine values of
    :class:`~calibkit.evidence.rowfidelity.TextScores` (empty where the task has none)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def accuracy(self) -> float: ...
    @property
    def logit_mse(self) -> float: ...
    @property
    def mean_kl(self) -> float: ...
    @property
    def flip_rate(self) -> float: ...
    @property
    def seconds(self) -> float: ...


RunChunks = Callable[[Sequence[tuple[Plan, EvalSubset]]], Sequence[ChunkResult]]


@dataclass(eq=False)
class _Progress:
    chunks: list[ChunkResult] = field(default_factory=list)
    positions: list[np.ndarray] = field(default_factory=list)
    summaries: dict[str, Summary] = field(default_factory=dict)
    decisions: tuple[Decision, ...] = ()
    done: bool = False
    decided_on: int | None = None  # texts when the search got its decision (completion excluded)

    @property
    def evaluated(self) -> int:
        return sum(len(p) for p in self.positions)


BAND_STREAK = 2  # after this many candidates in a row that the first look could not settle, go whole-split
LOOK_SLACK = 1.0  # log-wealth: a look is taken when the projection comes within a factor e of the bar


def _log_mixture(log_wealth: Sequence[float]) -> float:
    a = np.asarray(log_wealth, dtype=np.float64)
    if not a.size:
        return 0.0
    top = float(a.max())
    return top + math.log(float(np.exp(a - top).mean()))


def restrict(result: ChunkResult, positions: np.ndarray) -> ChunkResult:
    """A whole-split result's per-text values at ``positions`` only."""
    def take(name: str) -> tuple:
        v = tuple(getattr(result, name, ()))
        return tuple(v[i] for i in positions) if len(v) else ()

    return replace(result, predictions=take("predictions"), agreement_values=take("agreement_values"),
                   cosine_values=take("cosine_values"))


def stitch(chunks: Sequence[ChunkResult], positions: Sequence[np.ndarray], order: np.ndarray | None = None
           ) -> ChunkResult | None:
    """The chunks' results as one (each chunk's texts at ``positions``), texts in chunk order (or reordered by
    ``order``)."""
    if not chunks:
        return None
    rs = list(chunks)
    w = np.asarray([len(p) for p in positions], dtype=np.float64)

    def mean(name: str) -> float:
        v = np.asarray([getattr(r, name) for r in rs], dtype=np.float64)
        return float((v * w).sum() / w.sum()) if w.sum() else float("nan")

    def cat(name: str, kind: type) -> tuple:
        parts = [tuple(getattr(r, name)) for r in rs]
        if any(len(p) != n for p, n in zip(parts, w.astype(int))):
            return ()
        flat = [kind(v) for p in parts for v in p]
        return tuple(flat[i] for i in order) if order is not None else tuple(flat)

    return replace(rs[0], accuracy=mean("accuracy"), logit_mse=mean("logit_mse"), mean_kl=mean("mean_kl"),
                   flip_rate=mean("flip_rate"), seconds=float(sum(r.seconds for r in rs)),
                   predictions=cat("predictions", int), agreement_values=cat("agreement_values", float),
                   cosine_values=cat("cosine_values", float))


def chunk_values(evidence: SplitEvidence, chunk: EvalSubset, result: ChunkResult,
                 constraints: Sequence[Constraint]) -> dict[str, np.ndarray]:
    """Per constraint, one value per text of ``chunk`` that counts for it (see the module docstring)."""
    idx = chunk.array
    pred = np.asarray(getattr(result, "predictions", ()), dtype=np.int64)
    agr_p, acc_p = evidence.agreement_positions(chunk), evidence.accuracy_positions(chunk)
    out: dict[str, np.ndarray] = {}
    for c in constraints:
        if c.name == AGREEMENT:
            av = np.asarray(getattr(result, "agreement_values", ()), dtype=np.float64)
            if len(av) != len(idx):
                _check(pred, idx, "predictions")
                av = (pred == evidence.reference_predictions[idx]).astype(np.float64)
            out[c.name] = np.clip(av[agr_p], 0.0, 1.0)
        elif c.name == COSINE:
            cv = np.asarray(getattr(result, "cosine_values", ()), dtype=np.float64)
            _check(cv, idx, "cosine values")
            out[c.name] = np.clip(np.nan_to_num(cv[agr_p], nan=-1.0), -1.0, 1.0)
        elif c.name == ACCURACY_DROP:
            _check(pred, idx, "predictions")
            rows = idx[acc_p]
            labels = evidence.labels[rows]
            out[c.name] = ((pred[acc_p] == labels).astype(np.float64)
                           - (evidence.reference_predictions[rows] == labels).astype(np.float64))
        else:
            raise ValueError(f"unknown plan constraint {c.name!r}")
    return out


def _check(values: np.ndarray, idx: np.ndarray, what: str) -> None:
    if len(values) != len(idx):
        raise ValueError(f"a chunk of {len(idx)} texts came back with {len(values)} {what}")


def final_meets(constraints: Sequence[Constraint], decisions: Sequence[Decision], at_end: Sequence[bool],
                estimated: Sequence[str] = ESTIMATED) -> bool | None:
    """True / False once settled, None while more texts could settle it (see the module docstring for what an
    undecided constraint means after the whole split; ``estimated``: the constraints the point estimate then
    decides). ``at_end``: per constraint, whether all of its rows were read."""
    pending = False
    for c, d, end in zip(constraints, decisions, at_end, strict=True):
        if d.verdict is Verdict.MISSES:
            return False
        if d.verdict is Verdict.MEETS:
            continue
        if not end:
            pending = True
            continue
        if c.name in estimated:
            ok = d.estimate is None or d.estimate >= c.threshold - 1e-12
        else:  # certified: unsettled is a miss, except a candidate that changed nothing against a 100 % target
            # (no bound ever reaches 100 %); below 100 % a split where no flip settles nothing is too small
            ok = (c.name == AGREEMENT and c.threshold >= 1.0 - 1e-8 and d.estimate is not None
                  and d.estimate >= 1.0 - 1e-12)
        if not ok:
            return False
    return None if pending else True


class PlanJudge:
    """Judges plans on ``subset`` (the search split) chunk by chunk with ``rule``; ``run_chunks`` evaluates
    (plan, chunk) pairs together (through tune's ledger) and returns one result per pair, in order."""

    def __init__(self, evidence: SplitEvidence, subset: EvalSubset, rule: DecisionRule,
                 constraints: Sequence[Constraint], run_chunks: RunChunks, *,
                 estimated: Sequence[str] = ESTIMATED) -> None:
        if not constraints:
            raise ValueError("a plan needs at least one constraint to be judged")
        self.evidence, self.subset, self.rule = evidence, subset, rule
        self.constraints = tuple(constraints)
        self.run_chunks = run_chunks
        self.estimated = tuple(estimated)
        counts = {c.name: self._counts_for(c) for c in self.constraints}  # per subset position
        self.order, self.look_at = self._schedule(counts)
        self.totals = {name: int(m.sum()) for name, m in counts.items()}
        # per constraint, how many of its rows the first k texts of the order hold
        self._rows_before = {name: np.concatenate([[0], np.cumsum(m[self.order])]) for name, m in counts.items()}
        self.progress: dict[Plan, _Progress] = {}
        self.early: list[bool] = []  # per judged candidate: would its first look have settled it
        self.completed_texts = 0  # texts evaluated after the decision, to give the final plan whole-split numbers

    def _counts_for(self, c: Constraint) -> np.ndarray:
        """Per position of the subset, whether its value counts for ``c``."""
        every = chunk_subset(self.subset, np.arange(len(self.subset)))
        mask = np.zeros(len(self.subset), dtype=bool)
        mask[self.evidence.accuracy_positions(every) if c.name == ACCURACY_DROP
             else self.evidence.agreement_positions(every)] = True
        return mask

    def _schedule(self, counts: dict[str, np.ndarray]) -> tuple[np.ndarray, tuple[int, ...]]:
        """The order chunks take rows in, and the looks (texts read by then). With an accuracy constraint on
        labelled rows beside traffic rows that carry agreement, every labelled row comes first: accuracy is
        decided on all of them at once (a thousand labelled texts can rarely settle half a point before the
        last), and the looks then count traffic rows, so agreement can stop early. Interleaved, a plan far
        above the agreement target still read the whole holdout, its accuracy undecided until the end. Each
        constraint still reads its own rows in one seeded order fixed before any is seen."""
        order = chunk_order(self.evidence, self.subset)
        n = len(self.subset)
        if ACCURACY_DROP not in counts or len(counts) == 1 or self.evidence.traffic is None:
            return order, self.rule.looks(n)
        labelled = counts[ACCURACY_DROP][order]
        if labelled.all() or not labelled.any():
            return order, self.rule.looks(n)
        first = int(labelled.sum())
        return (np.concatenate([order[labelled], order[~labelled]]),
                tuple(first + k for k in self.rule.looks(n - first)))

    def _complete(self, pr: _Progress) -> tuple[bool, ...]:
        """Per constraint, whether every row it counts has been read."""
        return tuple(pr.summaries.get(c.name, Summary()).n >= self.totals[c.name] for c in self.constraints)

    def seed(self, plan: Plan, whole: ChunkResult) -> None:
        """``plan`` already evaluated on the whole split (``whole``, texts in the split's order; tune measured
        all-INT8 there to choose the table): its decision reads it instead of evaluating chunks again."""
        pr = self.progress.setdefault(plan, _Progress())
        if not pr.chunks:
            self._add(pr, np.arange(len(self.subset), dtype=np.int64), whole)

    def judge(self, plans: Sequence[Plan]) -> list[Judged]:
        """Each plan decided: the first chunk of all of them, then the next chunk of the undecided ones."""
        n = len(self.subset)
        prog = {p: self.progress.setdefault(p, _Progress()) for p in plans}
        direct = len(self.early) >= BAND_STREAK and not any(self.early[-BAND_STREAK:])
        for look in self.look_at:
            todo = [p for p in dict.fromkeys(plans) if not prog[p].done and prog[p].evaluated < look
                    and (look == n or (not direct and self._worth_looking(prog[p], look)))]
            if not todo:
                continue
            batch = [(p, self._positions(prog[p].evaluated, look)) for p in todo]
            results = self.run_chunks([(p, chunk_subset(self.subset, pos)) for p, pos in batch])
            for (p, pos), r in zip(batch, results, strict=True):
                self._add(prog[p], pos, r)
        return [self._judged(prog[p]) for p in plans]

    def _first_look_settles(self, pr: _Progress) -> bool:
        """Whether the rule's first look would have settled this candidate (for one evaluated on the whole split
        at once: replayed on that look's rows, at no cost)."""
        looks = self.look_at
        if not looks or looks[0] >= len(self.subset) or not pr.chunks:
            return False
        first = looks[0]
        if len(pr.positions[0]) <= first:  # chunked: settled when it stopped there
            return pr.evaluated <= first
        pos = self.order[:first]  # rows of the first look, in the whole result's split order
        ch = chunk_subset(self.subset, pos)
        values = chunk_values(self.evidence, ch, restrict(pr.chunks[0], pos), self.constraints)
        decisions = [self.rule.decide(c, self.rule.summarize(c, values[c.name]), self.totals[c.name])
                     for c in self.constraints]
        complete = tuple(len(values[c.name]) >= self.totals[c.name] for c in self.constraints)
        return final_meets(self.constraints, decisions, complete, self.estimated) is not None

    def _worth_looking(self, pr: _Progress, look: int) -> bool:
        """Whether a look after ``look`` texts could settle the candidate, were its per-text values to go on as
        observed so far: a betting wealth grows about linearly in log with n, so each side's log-wealth is
        projected to ``look`` and compared with the bar (with slack ``LOOK_SLACK``). A look that cannot settle
        anything only pays another evaluation's fixed cost (building the variant): it is skipped, and the
        candidate goes on to the next look that might settle it, or to the end of the split. Skipping looks on
        what was seen keeps the sequence valid (its guarantee holds at any data-dependent look time)."""
        rule = self.rule
        if not pr.positions or not isinstance(rule, ConfidenceSequenceRule):
            return True
        bar = math.log(1.0 / rule.alpha_sequence) - LOOK_SLACK
        for c, d in zip(self.constraints, pr.decisions, strict=True):
            if d.verdict is not Verdict.UNDECIDED:
                continue
            sm = pr.summaries.get(c.name, Summary())
            if not sm.n:  # none of its rows read yet: nothing to project from
                return True
            scale = self._rows_before[c.name][min(look, len(self.order))] / sm.n  # its own rows, not all texts
            best = max(_log_mixture([v * scale for v in sm.log_wealth_meets]),
                       _log_mixture([v * scale for v in sm.log_wealth_misses]))
            if best >= bar:
                return True
        return False

    def _positions(self, start: int, stop: int) -> np.ndarray:
        if start == 0 and stop == len(self.subset):  # the whole split: in its own order, the job a
            return np.arange(stop, dtype=np.int64)    # whole-split evaluation runs (one ledger record)
        return self.order[start:stop]

    def _add(self, pr: _Progress, positions: np.ndarray, result: ChunkResult) -> None:
        ch = chunk_subset(self.subset, positions)
        values = chunk_values(self.evidence, ch, result, self.constraints)
        for c in self.constraints:
            s = self.rule.summarize(c, values[c.name])
            pr.summaries[c.name] = pr.summaries.get(c.name, Summary()).merge(s)
        pr.chunks.append(result)
        pr.positions.append(positions)
        pr.decisions = tuple(self.rule.decide(c, pr.summaries.get(c.name, Summary()), self.totals[c.name])
                             for c in self.constraints)
        pr.done = final_meets(self.constraints, pr.decisions, self._complete(pr), self.estimated) is not None

    def _judged(self, pr: _Progress) -> Judged:
        meets = final_meets(self.constraints, pr.decisions, self._complete(pr), self.estimated)
        if pr.decided_on is None:
            pr.decided_on = pr.evaluated
            self.early.append(self._first_look_settles(pr))
        acc, agr, cos = self._estimates(pr)
        return Judged(acc, agr, bool(meets), pr.evaluated, cos, pr.decisions)

    def _estimates(self, pr: _Progress) -> tuple[float, float, float]:
        r = self._stitched(pr)
        ch = chunk_subset(self.subset, np.concatenate(pr.positions) if pr.positions else np.zeros(0, np.int64))
        idx = ch.array
        acc = agr = cos = float("nan")
        pred = np.asarray(r.predictions, dtype=np.int64) if r is not None else np.zeros(0, np.int64)
        acc_p, agr_p = self.evidence.accuracy_positions(ch), self.evidence.agreement_positions(ch)
        if len(pred) == len(idx) and len(acc_p):
            acc = float(np.mean(pred[acc_p] == self.evidence.labels[idx[acc_p]]))
        if r is not None and len(r.agreement_values) == len(idx) and len(agr_p):
            agr = float(np.mean(np.asarray(r.agreement_values)[agr_p]))
        elif len(pred) == len(idx) and len(agr_p):
            agr = float(np.mean(pred[agr_p] == self.evidence.reference_predictions[idx[agr_p]]))
        if r is not None and len(r.cosine_values) == len(idx) and len(agr_p):
            cos = float(np.mean(np.asarray(r.cosine_values)[agr_p]))
        return acc, agr, cos

    @staticmethod
    def _stitched(pr: _Progress, order: np.ndarray | None = None) -> ChunkResult | None:
        """The chunks' results as one, texts in chunk order (or reordered by ``order``)."""
        return stitch(pr.chunks, pr.positions, order)

    def complete(self, plan: Plan) -> ChunkResult | None:  # the whole split in its row order (None: it is empty)
        """``plan`` on every row of the split: the rows its decision did not need are evaluated now (one more
        chunk, ledger-recorded), so the final plan's numbers rest on the whole search split."""
        pr = self.progress.setdefault(plan, _Progress())
        n = len(self.subset)
        if pr.evaluated < n:
            pos = self._positions(pr.evaluated, n)
            (r,) = self.run_chunks([(plan, chunk_subset(self.subset, pos))])
            self.completed_texts += len(pos)
            self._add(pr, pos, r)
        return self._stitched(pr, np.argsort(np.concatenate(pr.positions), kind="stable"))

    def texts(self) -> dict[Plan, int]:
        """Texts each judged plan's decision rested on (completion excluded)."""
        return {p: pr.decided_on for p, pr in self.progress.items() if pr.decided_on is not None}
