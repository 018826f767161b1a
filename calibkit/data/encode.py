"""Calibration batches: tokenize, sort by token length, batch neighbours, pad only to each batch's longest.

Variable sequence lengths are the point: no padding to a fixed maximum, so statistics see what production
sees, and padding (which the collector also masks out) stays rare.

Batches are also bounded by a :class:`TokenBudget`: padded tokens per batch (``max_batch_tokens``) and/or bytes
of tapped tensors per batch (``memory_bytes``, priced by a :class:`BatchCost` that knows attention tensors grow
with sequence²). The batch size is an upper bound: long texts go in smaller batches, short ones in full batches.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from calibkit.data.tokenizer import TextTokenizer, takes_mask
from calibkit.errors import UsageError

DEFAULT_MEMORY_BUDGET = 1 << 30  # bytes of tapped tensors alive per batch: keeps calibrate near plain inference

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str | int) -> int:
    """Bytes from ``4G``, ``512M``, ``1.5G``, ``800K`` or a plain number (binary units; a trailing B is optional)."""
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(?:I?B)?\s*", str(text).upper())
        if not m:
            raise UsageError(f"cannot read the size {text!r}", hint="write e.g. 4G, 512M or 1.5G")
        number = float(m.group(1)) * _UNITS[m.group(2)]
        if not number < 1 << 62:  # 400 digits is an infinity as a float
            raise UsageError(f"the size {text!r} is too large", hint="write e.g. 4G, 512M or 1.5G")
        value = int(number)
    if value < 1:
        raise UsageError(f"a size must be positive, got {text!r}", hint="e.g. --memory-budget 4G")
    return value


@dataclass(frozen=True)
class BatchCost:
    """Float32 elements of the tapped tensors for one text padded to ``s`` tokens: fixed + per_token·s +
    per_pair·s² (attention probabilities [heads, s, s] are the per_pair part)."""

    per_token: float = 0.0
    per_pair: float = 0.0
    fixed: float = 0.0

    def nbytes(self, batch: int, seq: int, itemsize: int = 4) -> float:
        return float(batch) * itemsize * (self.fixed + self.per_token * seq + self.per_pair * seq * seq)


@dataclass(frozen=True)
class TokenBudget:
    """Limits on one batch. ``memory_bytes`` needs a :class:`BatchCost` (the collector measures it by probing
    the model); ``None`` means no limit of that kind."""

    max_batch_tokens: int | None = None
    memory_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.max_batch_tokens is not None and self.max_batch_tokens < 1:
            raise UsageError(f"--max-batch-tokens must be at least 1, got {self.max_batch_tokens}")
        if self.memory_bytes is not None and self.memory_bytes < 1:
            raise UsageError(f"--memory-budget must be positive, got {self.memory_bytes}")

    def fits(self, batch: int, seq: int, cost: BatchCost | None) -> bool:
        if self.max_batch_tokens is not None and batch * seq > self.max_batch_tokens:
            return False
        if self.memory_bytes is not None and cost is not None and cost.nbytes(batch, seq) > self.memory_bytes:
            return False
        return True


def budget_groups(
    lengths: np.ndarray, batch_size: int, budget: TokenBudget | None = None, cost: BatchCost | None = None,
    *, equal_lengths: bool = False,
) -> tuple[np.ndarray, ...]:
    """Indices sorted by length (stable), cut into consecutive groups of at most ``batch_size`` that fit the
    budget when padded to their longest member. A single text over the budget forms a batch of its own.

    ``equal_lengths``: every group holds texts of one length only (no padding at all), for models that take no
    attention mask and so would attend to the padding."""
    groups = _budget_groups(np.asarray(lengths), batch_size, budget, cost)
    if not equal_lengths:
        return groups
    lengths = np.asarray(lengths)
    return tuple(part for g in groups
                 for part in np.split(g, np.flatnonzero(np.diff(lengths[g])) + 1) if len(part))


def _budget_groups(
    lengths: np.ndarray, batch_size: int, budget: TokenBudget | None, cost: BatchCost | None
) -> tuple[np.ndarray, ...]:
    if batch_size < 1:
        raise UsageError(f"batch size must be at least 1, got {batch_size}")
    order = np.argsort(lengths, kind="stable")
    if budget is None or (budget.max_batch_tokens is None and (budget.memory_bytes is None or cost is None)):
        return tuple(order[i : i + batch_size] for i in range(0, len(order), batch_size))
    groups = []
    start = 0
    n = len(order)
    while start < n:
        end = start + 1
        # lengths ascend, so the newest member is the longest: the batch grows while it still fits
        while end < n and end - start < batch_size and budget.fits(end + 1 - start, int(lengths[order[end]]), cost):
            end += 1
        groups.append(order[start:end])
        start = end
    return tuple(groups)


@dataclass(frozen=True)
class Batch:
    """Model feeds for a group of texts. ``mask`` is [batch, seq] bool, True on real tokens."""

    feeds: dict[str, np.ndarray]
    mask: np.ndarray
    indices: np.ndarray  # positions of these texts in the input sequence

    @property
    def padding_fraction(self) -> float:
        return float(1.0 - self.mask.mean()) if self.mask.size else 0.0


@dataclass(frozen=True)
class BucketedBatches:
    """Re-iterable batches over ``texts``; tokenizing happens lazily, one batch at a time."""

    tokenizer: TextTokenizer
    texts: tuple[str, ...]
    input_names: tuple[str, ...]
    order: tuple[np.ndarray, ...]
    lengths: np.ndarray  # untruncated token counts, per text
    max_length: int
    batch_size: int = 32
    budget: TokenBudget | None = None
    cost: BatchCost | None = None

    def __len__(self) -> int:
        return len(self.order)

    def __iter__(self) -> Iterator[Batch]:
        for idx in self.order:
            yield self.batch(idx)

    def batch(self, idx: np.ndarray) -> Batch:
        enc = self.tokenizer.encode([self.texts[i] for i in idx], max_length=self.max_length)
        return Batch(feeds=enc.feeds(self.input_names), mask=enc.attention_mask.astype(bool), indices=idx)

    def priced(self, cost: BatchCost, share: int = 1) -> BucketedBatches:
        """The same texts re-grouped now that the bytes per batch are known (a no-op without a memory budget).

        ``share``: how many batches the consumer holds at once; each then gets ``1/share`` of the memory budget,
        so together they stay within it."""
        if self.budget is None or self.budget.memory_bytes is None:
            return dataclasses.replace(self, cost=cost)
        if share < 1:
            raise UsageError(f"share must be at least 1, got {share}")
        budget = dataclasses.replace(self.budget, memory_bytes=max(1, self.budget.memory_bytes // share))
        clipped = np.minimum(self.lengths, self.max_length)
        return dataclasses.replace(self, order=budget_groups(clipped, self.batch_size, budget, cost,
                                                             equal_lengths=not takes_mask(self.input_names)),
                                   cost=cost)

    @property
    def memory_bounded(self) -> bool:
        return self.budget is not None and self.budget.memory_bytes is not None

    @property
    def needs_cost(self) -> bool:
        return self.budget is not None and self.budget.memory_bytes is not None and self.cost is None

    @property
    def num_texts(self) -> int:
        return len(self.texts)

    @property
    def truncated(self) -> int:
        """How many texts are longer than the model's maximum (they are truncated)."""
        return int((self.lengths > self.max_length).sum())

    @property
    def tokens(self) -> int:
        return int(np.minimum(self.lengths, self.max_length).sum())

    @property
    def padded_tokens(self) -> int:
        """Token positions fed to the model, padding included."""
        clipped = np.minimum(self.lengths, self.max_length)
        return int(sum(len(idx) * int(clipped[idx].max()) for idx in self.order if len(idx)))

    @property
    def peak_batch_bytes(self) -> float:
        """Bytes of tapped tensors of the largest batch under ``cost`` (0 when the cost is unknown)."""
        if self.cost is None:
            return 0.0
        clipped = np.minimum(self.lengths, self.max_length)
        return max((self.cost.nbytes(len(i), int(clipped[i].max())) for i in self.order if len(i)), default=0.0)


def bucketed_batches(
    tokenizer: TextTokenizer,
    texts: Sequence[str],
    input_names: Sequence[str],
    *,
    batch_size: int = 32,
    max_length: int | None = None,
    budget: TokenBudget | None = None,
) -> BucketedBatches:
    """Batches of texts of similar token length (stable sort by length, then consecutive groups within
    ``budget``; a memory budget takes effect once the collector prices the batches, see ``priced``)."""
    if batch_size < 1:
        raise UsageError(f"batch size must be at least 1, got {batch_size}")
    limit = int(max_length or tokenizer.max_length)
    lengths = tokenizer.token_lengths(texts, max_length=limit)
    groups = budget_groups(np.minimum(lengths, limit), batch_size, budget, equal_lengths=not takes_mask(input_names))
    return BucketedBatches(tokenizer, tuple(texts), tuple(input_names), groups, lengths, limit, batch_size, budget)
