"""Which rows a decision rests on: the search / holdout / sensitivity subsets tune draws from its evidence.

The evidence is the labelled eval set and, with ``--traffic``, unlabeled texts drawn from the log
(``evaluate.traffic``): labelled rows carry what needs labels (accuracy), traffic rows carry agreement with FP32
(which needs no labels, and of which the log holds thousands). Every subset is seeded, stratified by label (and by
where a row came from) and keyed by row content (``evidence.subsets``). This module only chooses rows and says
what the choice cannot support (warnings); measuring and deciding happen elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from calibkit.errors import DataError
from calibkit.evidence.intervals import evidence_warnings
from calibkit.evidence.rowfidelity import TextScores
from calibkit.evidence.subsets import EvalSubset, nested, stratified_split, stratified_subset

MIN_SEARCH_ROWS = 10


class EvidenceKind(Protocol):
    """What the evidence reads of the task kind it is of (the kinds of ``calibkit.tasks`` are ones, as classes):
    ``kind``, its name; ``classifies``: one class per text, so labels are class ids and accuracy counts;
    ``binary_agreement``: a text's agreement is 0 or 1 (else a share, e.g. of its tokens); ``margin_scale``:
    "absolute" where its flip margins are probabilities the risk design's fixed thresholds apply to,
    "quantile" where strata are cut at quantiles of them, None where it has none; ``flip_margins``: FP32's
    margin per row of its reference (larger: further from changing), None where there is none."""

    @property
    def kind(self) -> str: ...
    @property
    def classifies(self) -> bool: ...
    @property
    def binary_agreement(self) -> bool: ...
    @property
    def margin_scale(self) -> str | None: ...

    def flip_margins(self, reference: np.ndarray) -> np.ndarray | None: ...


class Scores(NamedTuple):
    """A variant on one subset: accuracy (labelled rows), agreement and mean cosine (agreement rows); NaN where
    it does not apply."""

    accuracy: float
    agreement: float
    cosine: float = float("nan")
SMALL_HOLDOUT = 200


def split_subsets(labels: np.ndarray, holdout_fraction: float, seed: int, texts: Sequence[str] | None = None,
                  strata: Sequence[object] | None = None) -> tuple[EvalSubset, EvalSubset]:
    """Stratified (by label, or by ``strata``) seeded search/holdout split, by row content when ``texts`` are
    given."""
    keys = list(texts) if texts is not None else [str(i) for i in range(len(labels))]
    return stratified_split(keys, list(strata) if strata is not None else [int(v) for v in labels],
                            holdout_fraction, seed)


@dataclass(frozen=True, eq=False)
class SplitEvidence:
    """The eval rows tune judges on: ``labels`` (class ids; FP32's own predictions when the set has none, zeros
    for tasks without classes) and ``reference`` per row in the terms of its task ``kind`` (FP32 logits,
    vectors, or tag ids per token: see ``evidence.rowfidelity``), split into ``search`` (every decision),
    ``holdout`` (measured only at the end) and ``sensitivity`` (a subset of the search split for the per-layer
    ranking)."""

    texts: tuple[str, ...]
    labels: np.ndarray
    reference: np.ndarray
    labelled: bool
    search: EvalSubset
    holdout: EvalSubset
    sensitivity: EvalSubset
    kind: EvidenceKind
    warnings: tuple[str, ...] = ()
    # per row: drawn from traffic (its label is FP32's prediction); None when there is no traffic evidence
    traffic: np.ndarray | None = None

    @property
    def task(self) -> str:
        """The task kind's name."""
        return self.kind.kind

    @property
    def classifies(self) -> bool:
        return self.kind.classifies

    @property
    def reference_predictions(self) -> np.ndarray:
        """FP32's class per row (classification; tasks without classes: the zero labels)."""
        return self.reference.argmax(axis=1) if self.classifies else np.zeros(len(self.texts), dtype=np.int64)

    def accuracy_positions(self, subset: EvalSubset) -> np.ndarray:
        """Positions in ``subset``'s row order whose accuracy counts: the labelled eval rows when there is
        traffic beside them, else every row. None without labels (FP32's own predictions stand in for them,
        and accuracy against those is agreement, not accuracy) or for tasks without classes."""
        idx = subset.array
        if not self.classifies or not self.labelled:
            return np.zeros(0, dtype=np.int64)
        if self.traffic is None:
            return np.arange(len(idx))
        return np.flatnonzero(~self.traffic[idx])

    def agreement_positions(self, subset: EvalSubset) -> np.ndarray:
        """Positions in ``subset``'s row order whose agreement with FP32 counts: the traffic rows when there are
        any beside labelled classification rows (which carry accuracy), else every row."""
        idx = subset.array
        if self.traffic is None or not (self.labelled and self.classifies):
            return np.arange(len(idx))
        return np.flatnonzero(self.traffic[idx])

    def accuracy_of_reference(self, subset: EvalSubset) -> float:
        idx = subset.array[self.accuracy_positions(subset)]
        if not len(idx):
            return float("nan")
        return float(np.mean(self.reference[idx].argmax(axis=1) == self.labels[idx]))

    def sample(self, subset: EvalSubset, size: int, seed: int) -> EvalSubset:
        """``size`` rows of ``subset`` drawn at random, each kind of row (label; eval set or traffic) in
        proportion (all of them when it has no more), as indices into the whole evidence."""
        strata = _strata(self.labels, self.traffic)
        return nested(subset, stratified_subset(subset.take(self.texts), [strata[i] for i in subset.array], size,
                                                seed))

    def scores(self, subset: EvalSubset, result: TextScores) -> Scores:
        """A variant's result on ``subset`` (in its row order): accuracy on the rows whose accuracy counts,
        agreement with FP32 and mean cosine (embeddings) on the rows whose agreement counts; NaN where no row
        counts or the result does not cover the subset."""
        idx = subset.array
        acc_p, agr_p = self.accuracy_positions(subset), self.agreement_positions(subset)
        agree = np.asarray(result.agreement_values, dtype=np.float64)
        cos = np.asarray(result.cosine_values, dtype=np.float64)
        pred = np.asarray(result.predictions, dtype=np.int64)
        nan = float("nan")
        acc = (float(np.mean(pred[acc_p] == self.labels[idx[acc_p]]))
               if len(acc_p) and len(pred) == len(idx) else nan)
        agr = float(agree[agr_p].mean()) if len(agr_p) and len(agree) == len(idx) else nan
        c = float(cos[agr_p].mean()) if len(agr_p) and len(cos) == len(idx) else nan
        return Scores(acc, agr, c)


def split_evidence(texts: Sequence[str], labels: np.ndarray, reference: np.ndarray, *, labelled: bool,
                   class_names: Sequence[str], holdout_fraction: float, sensitivity_samples: int, seed: int,
                   kind: EvidenceKind, traffic: np.ndarray | None = None) -> SplitEvidence:
    """Draw the search, holdout and sensitivity subsets (DataError when the search split would be too small).
    ``traffic``: per row, whether it was drawn from traffic; each part keeps its share of both kinds of row."""
    strata = _strata(labels, traffic)
    search, holdout = split_subsets(labels, holdout_fraction, seed, texts, None if traffic is None else strata)
    if len(search) < MIN_SEARCH_ROWS:
        raise DataError(f"the eval set is too small to tune on ({len(texts)} examples)",
                        hint="use at least a few hundred examples")
    own = np.ones(len(labels), dtype=bool) if traffic is None else ~traffic
    warnings = list(evidence_warnings(labels[own], list(class_names))) if labelled else []
    if len(holdout) < SMALL_HOLDOUT:
        warnings.append(f"the holdout split has {len(holdout)} examples: its verdict has wide intervals")
    search_texts = search.take(texts)
    sens = nested(search, stratified_subset(search_texts, [strata[i] for i in search.array],
                                            sensitivity_samples, seed + 1))
    return SplitEvidence(tuple(texts), labels, reference, labelled, search, holdout, sens, kind, tuple(warnings),
                         traffic)


def _strata(labels: np.ndarray, traffic: np.ndarray | None) -> list[object]:
    """Each row's stratum: its label, and with traffic beside the eval set, where the row came from."""
    if traffic is None:
        return [int(v) for v in labels]
    return [("t" if t else "e") + str(int(v)) for v, t in zip(labels, traffic)]
