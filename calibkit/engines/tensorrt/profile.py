"""Optimization-profile shapes from the sequence lengths a model will really see (pure: no TensorRT)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calibkit.errors import UsageError

ROUND_TO = 8  # TensorRT kernels prefer multiples of 8 on the sequence axis


@dataclass(frozen=True)
class SeqProfile:
    """min/opt/max of the sequence axis (and of the batch axis) of every [batch, seq] input."""

    min_seq: int
    opt_seq: int
    max_seq: int
    min_batch: int = 1
    opt_batch: int = 16
    max_batch: int = 64

    def shapes(self) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        return (self.min_batch, self.min_seq), (self.opt_batch, self.opt_seq), (self.max_batch, self.max_seq)

    def to_dict(self) -> dict[str, int]:
        return {
            "min_seq": self.min_seq, "opt_seq": self.opt_seq, "max_seq": self.max_seq,
            "min_batch": self.min_batch, "opt_batch": self.opt_batch, "max_batch": self.max_batch,
        }


def _round_up(v: float, to: int) -> int:
    return int(math.ceil(v / to) * to)


def profile_from_lengths(
    lengths: Sequence[int] | np.ndarray | None,
    *,
    model_max: int,
    min_seq: int | None = None,
    opt_seq: int | None = None,
    max_seq: int | None = None,
    opt_batch: int = 16,
    max_batch: int = 64,
) -> SeqProfile:
    """min 1, opt = median length, max = 99th percentile rounded up to a multiple of 8, capped at ``model_max``.

    Without lengths: opt = min(128, model_max), max = model_max. Explicit ``min_seq/opt_seq/max_seq`` win.
    """
    if model_max < 1:
        raise UsageError(f"model maximum length must be >= 1, got {model_max}")
    arr = np.asarray(lengths if lengths is not None else [], dtype=np.int64)
    if arr.size:
        auto_opt = int(np.ceil(np.median(arr)))
        auto_max = min(_round_up(float(np.percentile(arr, 99)), ROUND_TO), model_max)
    else:
        auto_opt, auto_max = min(128, model_max), model_max
    lo = 1 if min_seq is None else min_seq
    hi = auto_max if max_seq is None else max_seq
    mid = min(max(auto_opt, lo), hi) if opt_seq is None else opt_seq
    if not (1 <= lo <= mid <= hi):
        raise UsageError(
            f"sequence profile must satisfy 1 <= min <= opt <= max (got min {lo}, opt {mid}, max {hi})",
            hint="adjust --min-seq/--opt-seq/--max-seq",
        )
    if hi > model_max:
        raise UsageError(f"--max-seq {hi} exceeds the model's maximum length {model_max}")
    if not (1 <= opt_batch <= max_batch):
        raise UsageError(f"batch profile must satisfy 1 <= opt <= max (got opt {opt_batch}, max {max_batch})")
    return SeqProfile(lo, mid, hi, 1, opt_batch, max_batch)
