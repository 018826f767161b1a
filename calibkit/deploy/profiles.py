"""Length buckets (TensorRT optimization profiles) chosen from the traffic's token lengths.

Triton's dynamic batcher batches requests only when every input has the same shape (ragged batching aside), so
a client pads each request to the upper bound of its length bucket and requests of one bucket batch together.
The cost of a choice of buckets is then exact: every request of length ``L`` in the bucket ``(lo, hi]`` costs
``hi`` tokens. :func:`choose_buckets` picks the ``k`` upper bounds (among the observed lengths rounded up to
``round_to``) that minimise the padded tokens, by dynamic programming over the length histogram (optimal for
that candidate set; the tests check it against brute force). Lengths above the largest bound (``max_seq``) are
truncated to it and counted.

Each bucket becomes one TensorRT optimization profile: min = the bucket's lower bound, opt = max = its upper
bound, the length padded requests arrive at (a request sent unpadded still runs: the profile covers
``lo..hi``); the bucket's median real length is reported beside it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from calibkit.errors import DataError, UsageError
from calibkit.results.documents import BucketChoice, LengthBucket  # deploy.json's types, made here

MAX_PROFILES = 4
ROUND_TO = 8  # TensorRT kernels prefer sequence lengths that are multiples of 8
AUTO_TOLERANCE = 0.05  # auto k: the fewest profiles within 5 % of the real tokens of the best (k = 4)

__all__ = ["BucketChoice", "LengthBucket", "auto_k", "check_k", "choose_buckets", "largest_max", "padded_by_arrival"]


def round_up(v: int, to: int) -> int:
    return int(math.ceil(v / to) * to)


def largest_max(lengths: np.ndarray, model_max: int, max_seq: int | None, round_to: int = ROUND_TO) -> int:
    """The largest profile max: ``max_seq`` when given, else the longest length rounded up to ``round_to``;
    never above the model's maximum length."""
    if max_seq is not None:
        if not 1 <= max_seq <= model_max:
            raise UsageError(f"--max-seq {max_seq} is outside 1..{model_max} (the model's maximum length)",
                             hint=f"pass --max-seq between 1 and {model_max}, or leave it out")
        return max_seq
    return min(round_up(int(lengths.max()), round_to), model_max)


def check_k(k: int) -> None:
    if not 1 <= k <= MAX_PROFILES:
        raise UsageError(f"--profiles {k} is out of range: choose 1 to {MAX_PROFILES} profiles (or auto)",
                         hint="each profile is one length bucket and one TensorRT optimization profile; "
                              "2-3 cover most traffic")


def _candidates(lengths: np.ndarray, top: int, round_to: int) -> np.ndarray:
    rounded = np.minimum(np.ceil(lengths / round_to).astype(np.int64) * round_to, top)
    return np.unique(np.append(rounded, top))


def choose_buckets(lengths: Sequence[int] | np.ndarray, k: int, *, max_seq: int,
                   round_to: int = ROUND_TO) -> BucketChoice:
    """The ``k`` buckets (at most as many as there are candidate bounds) with the fewest padded tokens."""
    check_k(k)
    arr = np.asarray(lengths, dtype=np.int64)
    if arr.size == 0:
        raise DataError("no token lengths to choose profiles from", hint="pass a --traffic log with texts in it")
    if max_seq < 1:
        raise UsageError(f"max_seq must be >= 1, got {max_seq}")
    over = int((arr > max_seq).sum())
    arr = np.clip(arr, 1, max_seq)
    cands = _candidates(arr, max_seq, round_to)  # sorted bounds; the last is max_seq
    m = len(cands)
    # requests and real tokens with length in (cands[i-1], cands[i]]; prefix sums over candidate index
    idx = np.searchsorted(cands, arr, side="left")
    cnt = np.bincount(idx, minlength=m).astype(np.int64)
    tok = np.bincount(idx, weights=arr, minlength=m).astype(np.int64)
    pc = np.concatenate([[0], np.cumsum(cnt)])
    pt = np.concatenate([[0], np.cumsum(tok)])

    def cost(i: np.ndarray | int, j: int) -> np.ndarray:
        """Padding of candidates i..j (inclusive, vectorised over i) padded to cands[j]."""
        return cands[j] * (pc[j + 1] - pc[i]) - (pt[j + 1] - pt[i])

    k_eff = min(k, m)
    inf = np.iinfo(np.int64).max // 4
    # best[j] = least padding of candidates 0..j with the current number of buckets, the last ending at j
    best = np.array([cost(0, j) for j in range(m)], dtype=np.int64)
    back: list[np.ndarray] = []
    for _ in range(1, k_eff):
        nxt = np.full(m, inf, dtype=np.int64)
        arg = np.zeros(m, dtype=np.int64)
        for j in range(1, m):
            i = np.arange(1, j + 1)  # the last bucket covers candidates i..j, the earlier ones 0..i-1
            total = best[i - 1] + cost(i, j)
            t = int(np.argmin(total))
            nxt[j], arg[j] = total[t], i[t]
        back.append(arg)
        best = nxt
    # walk back from the last candidate (max_seq must be a bound)
    bounds = [m - 1]
    j = m - 1
    for arg in reversed(back):
        first = int(arg[j])  # the first candidate of the bucket ending at j
        bounds.append(first - 1)
        j = first - 1
    bounds.reverse()
    buckets: list[LengthBucket] = []
    lo = 1
    for b in bounds:
        hi = int(cands[b])
        members = arr[(arr >= lo) & (arr <= hi)]
        buckets.append(LengthBucket(lo=lo, hi=hi, requests=int(members.size), real_tokens=int(members.sum()),
                                    median_length=int(np.median(members)) if members.size else hi))
        lo = hi + 1
    return BucketChoice(tuple(buckets), requests=int(arr.size), real_tokens=int(arr.sum()), max_seq=max_seq,
                        over_max=over)


def padded_by_arrival(lengths: Sequence[int] | np.ndarray, batch: int, max_seq: int) -> int:
    """Padded tokens when requests are batched in arrival order, ``batch`` at a time, each batch padded to its
    longest request (the one-profile server that pads per batch)."""
    arr = np.clip(np.asarray(lengths, dtype=np.int64), 1, max_seq)
    total = 0
    for s in range(0, arr.size, batch):
        chunk = arr[s : s + batch]
        total += int(chunk.max()) * int(chunk.size)
    return total


def auto_k(choices: Sequence[BucketChoice], tolerance: float = AUTO_TOLERANCE) -> BucketChoice:
    """The fewest profiles whose padded tokens are within ``tolerance`` x real tokens of the best choice:
    every extra profile costs build time, engine size and a batching split."""
    best = min(c.padded_tokens for c in choices)
    for c in sorted(choices, key=lambda c: c.k):
        if c.padded_tokens - best <= tolerance * c.real_tokens:
            return c
    return min(choices, key=lambda c: c.padded_tokens)  # pragma: no cover - the best always qualifies
