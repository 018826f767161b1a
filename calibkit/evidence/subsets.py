"""Seeded, label-stratified subsets of an eval set, recorded so a run can be reproduced.

Every subset calibkit evaluates on (compare's layer statistics and sensitivity samples, ``--limit``, tune's
search/holdout split) is drawn here. Rows are ranked by a seeded hash of their *content* (label and text),
never by their position, so:

- a subset is random, stratified by label (each class keeps its share, largest remainder first), and a
  different ``--seed`` draws a different one;
- the same rows in a different file order give the same subset, in the same (canonical) order, so every
  measurement made on it — and every flag derived from it — is the same.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from calibkit.errors import DataError


@dataclass(frozen=True)
class EvalSubset:
    """Rows of an eval set of ``total`` rows: ``indices`` into it, in canonical (hash) order."""

    indices: tuple[int, ...]
    total: int
    seed: int
    strategy: str  # "all" | "stratified" | "stratified-holdout" | "stratified-search"
    content_sha256: str  # hash of the rows' content in canonical order: equal for the same rows in any file order

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def array(self) -> np.ndarray:
        return np.asarray(self.indices, dtype=np.int64)

    def take(self, values: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(values[i] for i in self.indices)

    def to_dict(self, *, max_indices: int = 5000) -> dict[str, Any]:
        d: dict[str, Any] = {
            "count": len(self.indices), "of": self.total, "seed": self.seed, "strategy": self.strategy,
            "content_sha256": self.content_sha256,
        }
        if len(self.indices) <= max_indices:
            d["indices"] = list(self.indices)
        return d


def _row_keys(texts: Sequence[str], labels: Sequence[Any], seed: int) -> np.ndarray:
    keys = np.empty(len(texts), dtype=np.uint64)
    for i, (t, lab) in enumerate(zip(texts, labels, strict=True)):
        h = hashlib.blake2b(f"{seed}\x00{lab}\x00{t}".encode(), digest_size=8).digest()
        keys[i] = int.from_bytes(h, "big")
    return keys


def _content_sha(texts: Sequence[str], labels: Sequence[Any], order: np.ndarray) -> str:
    h = hashlib.sha256()
    for i in order:
        h.update(f"{labels[i]}\x00{texts[i]}\x01".encode())
    return h.hexdigest()


def _canonical(idx: np.ndarray, keys: np.ndarray) -> np.ndarray:
    # ties (duplicate rows) broken by position: the same content either way
    return idx[np.lexsort((idx, keys[idx]))]


def _quotas(counts: dict[Any, int], size: int) -> dict[Any, int]:
    """Per-class sizes proportional to ``counts`` summing to ``size`` (largest remainder; ties by class)."""
    total = sum(counts.values())
    exact = {c: size * n / total for c, n in counts.items()}
    q = {c: int(np.floor(v)) for c, v in exact.items()}
    rest = size - sum(q.values())
    for c in sorted(counts, key=lambda c: (-(exact[c] - q[c]), str(c)))[:rest]:
        q[c] += 1
    return q


def stratified_subset(
    texts: Sequence[str], labels: Sequence[Any], size: int | None, seed: int = 0
) -> EvalSubset:
    """``size`` rows drawn at random per class in proportion to the class sizes (all rows when ``size`` is None
    or not smaller than the set)."""
    n = len(texts)
    if size is not None and size <= 0:
        raise DataError(f"a subset needs a positive size, got {size}", hint="pass a positive --limit / sample count")
    keys = _row_keys(texts, labels, seed)
    lab = np.asarray([str(v) for v in labels], dtype=object)
    if size is None or size >= n:
        order = _canonical(np.arange(n, dtype=np.int64), keys)
        return EvalSubset(tuple(int(i) for i in order), n, seed, "all", _content_sha(texts, labels, order))
    classes = sorted(set(lab.tolist()))
    counts = {c: int((lab == c).sum()) for c in classes}
    quota = _quotas(counts, size)
    chosen = []
    for c in classes:
        idx = np.flatnonzero(lab == c)
        chosen.append(_canonical(idx, keys)[: quota[c]])
    order = _canonical(np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int64), keys)
    return EvalSubset(tuple(int(i) for i in order), n, seed, "stratified", _content_sha(texts, labels, order))


def stratified_split(
    texts: Sequence[str], labels: Sequence[Any], holdout_fraction: float, seed: int = 0
) -> tuple[EvalSubset, EvalSubset]:
    """(search, holdout): each class split at random, ``holdout_fraction`` of it (rounded) to the holdout."""
    if not 0.0 <= holdout_fraction < 1.0:
        raise DataError(f"--holdout must be in [0, 1), got {holdout_fraction}", hint="pass e.g. --holdout 0.3")
    keys = _row_keys(texts, labels, seed)
    lab = np.asarray([str(v) for v in labels], dtype=object)
    search, hold = [], []
    for c in sorted(set(lab.tolist())):
        idx = _canonical(np.flatnonzero(lab == c), keys)
        k = int(round(len(idx) * holdout_fraction))
        hold.append(idx[:k])
        search.append(idx[k:])
    n = len(texts)

    def make(parts: list[np.ndarray], strategy: str) -> EvalSubset:
        order = _canonical(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64), keys)
        return EvalSubset(tuple(int(i) for i in order), n, seed, strategy, _content_sha(texts, labels, order))

    return make(search, "stratified-search"), make(hold, "stratified-holdout")


def nested(parent: EvalSubset, child: EvalSubset) -> EvalSubset:
    """``child`` (drawn over ``parent``'s rows) expressed as indices into the full set ``parent`` came from."""
    return EvalSubset(tuple(parent.indices[i] for i in child.indices), parent.total, child.seed, child.strategy,
                      child.content_sha256)
