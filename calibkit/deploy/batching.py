"""Preferred batch sizes from a token budget, not a guess.

A batch of ``b`` requests padded to ``hi`` tokens costs ``b x hi`` tokens of work and memory (attention is
``b x hi^2`` per head). Given a budget of padded tokens per batch, each bucket's batch is the largest power of
two with ``b x hi <= budget`` (at least 1, at most ``max_batch``); Triton's ``preferred_batch_size`` lists those
sizes, and ``max_batch_size`` is the largest of them. Triton applies one ``max_batch_size`` to every length, so
a batch of the longest bucket can reach ``max_batch_size x max_seq`` tokens: :attr:`BatchingPlan.worst_tokens`
says how much.
"""

from __future__ import annotations

from collections.abc import Sequence

from calibkit.errors import UsageError
from calibkit.results.documents import BatchingPlan  # deploy.json's type, made here

DEFAULT_BATCH_TOKENS = 8192
DEFAULT_MAX_BATCH = 128
DEFAULT_QUEUE_DELAY_US = 1000

__all__ = ["BatchingPlan", "batch_for", "plan_batching"]


def _pow2_floor(v: int) -> int:
    return 1 << (max(v, 1).bit_length() - 1)


def batch_for(length: int, batch_tokens: int, max_batch: int) -> int:
    """The largest power of two ``b`` with ``b * length <= batch_tokens``, within 1..max_batch."""
    return max(1, min(_pow2_floor(batch_tokens // max(length, 1)), _pow2_floor(max_batch)))


def plan_batching(bucket_lengths: Sequence[int], *, batch_tokens: int = DEFAULT_BATCH_TOKENS,
                  max_batch: int = DEFAULT_MAX_BATCH, queue_delay_us: int = DEFAULT_QUEUE_DELAY_US) -> BatchingPlan:
    """Batch sizes for buckets padded to ``bucket_lengths`` tokens."""
    if batch_tokens < 1:
        raise UsageError(f"--batch-tokens must be at least 1 (got {batch_tokens})", hint="e.g. --batch-tokens 8192")
    if max_batch < 1:
        raise UsageError(f"--max-batch must be at least 1 (got {max_batch})", hint="e.g. --max-batch 64")
    if queue_delay_us < 0:
        raise UsageError(f"--queue-delay-us must be 0 or more (got {queue_delay_us})")
    if not bucket_lengths:
        raise UsageError("no buckets to plan batches for")
    per = tuple(batch_for(n, batch_tokens, max_batch) for n in bucket_lengths)
    mbs = max(per)
    return BatchingPlan(batch_tokens=batch_tokens, per_bucket=per, preferred=tuple(sorted(set(per))),
                        max_batch_size=mbs, queue_delay_us=queue_delay_us, worst_tokens=mbs * max(bucket_lengths))
