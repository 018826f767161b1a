"""Which rows a decision rests on: the search / holdout / sensitivity subsets tune draws from its eval set.

Every subset is seeded, stratified by label and keyed by row content (``evaluate.subsets``). This module only
chooses rows and says what the choice cannot support (warnings); measuring and deciding happen elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calibkit.errors import DataError
from calibkit.evaluate.subsets import EvalSubset, nested, stratified_split, stratified_subset
from calibkit.evaluate.uncertainty import evidence_warnings

MIN_SEARCH_ROWS = 10
SMALL_HOLDOUT = 200


def split_subsets(labels: np.ndarray, holdout_fraction: float, seed: int, texts: Sequence[str] | None = None
                  ) -> tuple[EvalSubset, EvalSubset]:
    """Stratified (by label) seeded search/holdout split, by row content when ``texts`` are given."""
    keys = list(texts) if texts is not None else [str(i) for i in range(len(labels))]
    return stratified_split(keys, [int(v) for v in labels], holdout_fraction, seed)


@dataclass(frozen=True, eq=False)
class SplitEvidence:
    """The eval rows tune judges on: ``labels`` (class ids; FP32's own predictions when the set has none) and
    ``reference`` (FP32 logits) per row, split into ``search`` (every decision), ``holdout`` (measured only
    at the end) and ``sensitivity`` (a subset of the search split for the per-layer ranking)."""

    texts: tuple[str, ...]
    labels: np.ndarray
    reference: np.ndarray
    labelled: bool
    search: EvalSubset
    holdout: EvalSubset
    sensitivity: EvalSubset
    warnings: tuple[str, ...] = ()

    @property
    def reference_predictions(self) -> np.ndarray:
        return self.reference.argmax(axis=1)

    def accuracy_of_reference(self, subset: EvalSubset) -> float:
        idx = subset.array
        if not len(idx):
            return float("nan")
        return float(np.mean(self.reference[idx].argmax(axis=1) == self.labels[idx]))


def split_evidence(texts: Sequence[str], labels: np.ndarray, reference: np.ndarray, *, labelled: bool,
                   class_names: Sequence[str], holdout_fraction: float, sensitivity_samples: int, seed: int
                   ) -> SplitEvidence:
    """Draw the search, holdout and sensitivity subsets (DataError when the search split would be too small)."""
    search, holdout = split_subsets(labels, holdout_fraction, seed, texts)
    if len(search) < MIN_SEARCH_ROWS:
        raise DataError(f"the eval set is too small to tune on ({len(texts)} examples)",
                        hint="use at least a few hundred examples")
    warnings = list(evidence_warnings(labels, list(class_names))) if labelled else []
    if len(holdout) < SMALL_HOLDOUT:
        warnings.append(f"the holdout split has {len(holdout)} examples: its verdict has wide intervals")
    search_texts = search.take(texts)
    sens = nested(search, stratified_subset(search_texts, [int(v) for v in labels[search.array]],
                                            sensitivity_samples, seed + 1))
    return SplitEvidence(tuple(texts), labels, reference, labelled, search, holdout, sens, tuple(warnings))
