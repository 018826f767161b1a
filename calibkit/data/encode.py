"""Calibration batches: tokenize, sort by token length, batch neighbours, pad only to each batch's longest.

Variable sequence lengths are the point: no padding to a fixed maximum, so statistics see what production
sees, and padding (which the collector also masks out) stays rare.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from calibkit.data.tokenizer import TextTokenizer
from calibkit.errors import UsageError


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

    def __len__(self) -> int:
        return len(self.order)

    def __iter__(self) -> Iterator[Batch]:
        for idx in self.order:
            enc = self.tokenizer.encode([self.texts[i] for i in idx], max_length=self.max_length)
            yield Batch(feeds=enc.feeds(self.input_names), mask=enc.attention_mask.astype(bool), indices=idx)

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


def bucketed_batches(
    tokenizer: TextTokenizer,
    texts: Sequence[str],
    input_names: Sequence[str],
    *,
    batch_size: int = 32,
    max_length: int | None = None,
) -> BucketedBatches:
    """Batches of texts of similar token length (stable sort by length, then consecutive groups)."""
    if batch_size < 1:
        raise UsageError(f"batch size must be at least 1, got {batch_size}")
    limit = int(max_length or tokenizer.max_length)
    lengths = tokenizer.token_lengths(texts)
    order = np.argsort(np.minimum(lengths, limit), kind="stable")
    groups = tuple(order[i : i + batch_size] for i in range(0, len(order), batch_size))
    return BucketedBatches(tokenizer, tuple(texts), tuple(input_names), groups, lengths, limit)
