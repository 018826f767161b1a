"""A mergeable histogram of |x| over [0, upper] with power-of-two ranges, so re-binning is exact.

``upper`` is always a power of two (2**k for an integer k, negative allowed). When the data outgrows the
range, ``upper`` doubles and neighbouring bin pairs are summed: no count ever moves to a wrong bin, so
merging two histograms with the same number of bins is exact and associative whatever order the batches
(or workers) came in. The price is resolution: the data's maximum lies in the upper half of the range, so
between ``num_bins / 2`` and ``num_bins`` bins are occupied (TensorRT's 2048 bins over [0, max] is the
upper bound). Calibration methods work on the occupied bins (:meth:`Histogram.occupied`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from calibkit.errors import CalibrationError

MIN_EXPONENT = -126  # 2**-126: the smallest normal float32; ranges below are treated as zero


def range_exponent(value: float) -> int:
    """The smallest k with value < 2**k (strictly, so the maximum never sits on the closed upper edge)."""
    if not value > 0:
        return MIN_EXPONENT
    _, e = math.frexp(value)  # value = m * 2**e with 0.5 <= m < 1, so value < 2**e
    return max(int(e), MIN_EXPONENT)


@dataclass(frozen=True, eq=False)
class Histogram:
    """Counts of |x| in ``len(counts)`` equal bins over [0, upper]. ``upper`` is a power of two."""

    counts: np.ndarray  # int64 [num_bins]
    upper: float

    def __post_init__(self) -> None:
        n = len(self.counts)
        if n < 2 or n & (n - 1):
            raise CalibrationError(f"histogram bin count must be a power of two >= 2, got {n}")
        if not (self.upper > 0 and math.frexp(self.upper)[0] == 0.5):
            raise CalibrationError(f"histogram upper bound must be a positive power of two, got {self.upper}")

    # -- construction ------------------------------------------------------------------------------------
    @classmethod
    def empty(cls, num_bins: int = 2048, upper: float = 2.0**MIN_EXPONENT) -> Histogram:
        return cls(np.zeros(num_bins, dtype=np.int64), float(upper))

    @classmethod
    def of(cls, values: np.ndarray, num_bins: int = 2048) -> Histogram:
        """Histogram of |values| (finite values only are expected)."""
        a = np.abs(np.asarray(values, dtype=np.float32)).ravel()
        top = float(a.max()) if a.size else 0.0
        upper = 2.0 ** range_exponent(top)
        return cls(bin_counts(a, upper, num_bins), upper)

    # -- geometry ----------------------------------------------------------------------------------------
    @property
    def num_bins(self) -> int:
        return len(self.counts)

    @property
    def width(self) -> float:
        return self.upper / self.num_bins

    @property
    def edges(self) -> np.ndarray:
        return np.linspace(0.0, self.upper, self.num_bins + 1)

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def occupied(self) -> np.ndarray:
        """Counts up to and including the last non-empty bin (what the methods search over)."""
        nz = np.flatnonzero(self.counts)
        return self.counts[: int(nz[-1]) + 1] if nz.size else self.counts[:0]

    # -- combining ---------------------------------------------------------------------------------------
    def widened(self, upper: float) -> Histogram:
        """The same counts over [0, upper] (upper >= self.upper, a power of two): exact pair merging."""
        if upper < self.upper:
            raise CalibrationError(f"cannot narrow a histogram from {self.upper} to {upper}")
        factor = round(upper / self.upper)
        if factor == 1:
            return self
        n = self.num_bins
        if factor >= n:
            counts = np.zeros(n, dtype=np.int64)
            counts[0] = self.counts.sum()
        else:
            counts = np.zeros(n, dtype=np.int64)
            counts[: n // factor] = self.counts.reshape(n // factor, factor).sum(axis=1)
        return Histogram(counts, float(upper))

    def merge(self, other: Histogram) -> Histogram:
        """Exact union of two histograms with the same number of bins (commutative and associative)."""
        if other.num_bins != self.num_bins:
            raise CalibrationError(
                f"cannot merge histograms with {self.num_bins} and {other.num_bins} bins",
                hint="collect statistics with the same --num-bins",
            )
        upper = max(self.upper, other.upper)
        return Histogram(self.widened(upper).counts + other.widened(upper).counts, upper)

    # -- queries -----------------------------------------------------------------------------------------
    def percentile(self, p: float) -> float:
        """The p-th percentile of |x| (0 < p <= 100), linearly interpolated inside the bin that holds it."""
        if not 0.0 < p <= 100.0:
            raise CalibrationError(f"percentile must be in (0, 100], got {p}")
        total = self.total
        if total == 0:
            return 0.0
        cdf = np.cumsum(self.counts)
        target = total * p / 100.0
        i = int(np.searchsorted(cdf, target, side="left"))
        i = min(i, self.num_bins - 1)
        before = float(cdf[i - 1]) if i > 0 else 0.0
        inside = float(self.counts[i])
        frac = (target - before) / inside if inside > 0 else 1.0
        return (i + min(max(frac, 0.0), 1.0)) * self.width


_CHUNK = 1 << 18  # elements per pass: temporaries stay in the CPU's L2 cache, few Python calls per element
_scratch = threading.local()  # per-thread buffers, shared by every counter the thread runs


def _buffer(dtype: type, n: int) -> np.ndarray:
    key = f"buf_{np.dtype(dtype).name}"
    buf = getattr(_scratch, key, None)
    if buf is None or buf.size < n:
        buf = np.empty(max(n, _CHUNK), dtype=dtype)
        setattr(_scratch, key, buf)
    return buf[:n]


def chunks(x: np.ndarray, limit: int = _CHUNK) -> Iterator[np.ndarray]:
    """Views (never copies) that tile ``x`` in C order, each of at most ``limit`` elements or one innermost row."""
    if x.ndim == 0:
        yield x.reshape(1)
        return
    if x.flags.c_contiguous:
        flat = x.reshape(-1)
        for i in range(0, flat.size, limit):
            yield flat[i : i + limit]
        return
    if x.size <= limit or x.ndim == 1:
        if x.ndim == 1:
            for i in range(0, x.size, limit):
                yield x[i : i + limit]
        else:
            yield x
        return
    inner = x[0].size
    if inner > limit:
        for i in range(x.shape[0]):
            yield from chunks(x[i], limit)
    else:
        rows = max(1, limit // max(inner, 1))
        for i in range(0, x.shape[0], rows):
            yield x[i : i + rows]


KERNELS = ("bincount", "add_at", "sort")


class BinCounter:
    """Counts |x| into power-of-two-range bins chunk by chunk through a per-thread buffer (no copy of the input).

    Bin indices come from one ufunc call: ``trunc(x * num_bins / upper)`` cast straight into an int buffer, then
    an integer abs (truncation toward zero of x·f equals floor(|x|·f), and scaling by a power of two is exact).
    ``kernel``:
    - ``bincount`` (default): np.bincount on the intp indices, the cheapest on one thread. Its counting loop
      releases the GIL but its min/max pre-pass over the indices holds it, so it scales badly with threads;
    - ``sort``: a radix sort of uint16 indices and searchsorted: about 1.8x bincount's CPU, but GIL-free, so it
      is the faster one on many threads (the collector switches on the thread count);
    - ``add_at``: np.add.at(counts, indices, 1), as cheap as bincount on one thread but holding the GIL
      (measured beside them by ``benchmarks/bench_scale.py --kernels``).
    All give the same counts."""

    def __init__(self, num_bins: int, *, kernel: str = "bincount") -> None:
        if kernel not in KERNELS:
            raise CalibrationError(f"unknown histogram kernel {kernel!r} (one of {', '.join(KERNELS)})")
        self.num_bins = num_bins
        self.kernel = kernel if num_bins <= 1 << 15 else "bincount"
        self._starts = np.arange(1, num_bins, dtype=np.uint16) if self.kernel == "sort" else None

    def add(self, counts: np.ndarray, part: np.ndarray, upper: float, *, below_upper: bool = False) -> None:
        """``counts += `` the bin counts of ``part`` (a chunk of at most 256K finite elements, any strides).
        ``below_upper``: every |x| < upper is known (then no clamping pass is needed: scaling by a power of two
        is exact, so |x| * num_bins / upper < num_bins)."""
        n = part.size
        if n == 0:
            return
        factor = self.num_bins / upper
        f = np.float32(factor) if factor < 2.0**100 else np.float64(factor)  # tiny ranges: no float32 overflow
        if self._starts is None:
            ib = _buffer(np.intp, n).reshape(part.shape)
            np.multiply(part, f, out=ib, casting="unsafe")  # truncates toward zero
            np.abs(ib, out=ib)
            if not below_upper:
                np.minimum(ib, self.num_bins - 1, out=ib)
            if self.kernel == "add_at":
                np.add.at(counts, ib.reshape(-1), 1)
            else:
                counts += np.bincount(ib.reshape(-1), minlength=self.num_bins)
            return
        b = _buffer(np.float32 if f.dtype == np.float32 else np.float64, n).reshape(part.shape)
        np.abs(part, out=b, casting="unsafe")
        b *= f
        if not below_upper:
            np.minimum(b, self.num_bins - 1, out=b)
        ib16 = _buffer(np.uint16, n)
        ib16[...] = b.reshape(-1)
        ib16.sort(kind="stable")  # radix sort for 16-bit integers
        edges = np.searchsorted(ib16, self._starts)
        counts[0] += edges[0] if edges.size else n
        if edges.size:
            counts[1:-1] += np.diff(edges)
            counts[-1] += n - edges[-1]


def bin_counts(values: np.ndarray, upper: float, num_bins: int, *, signed: bool = False) -> np.ndarray:
    """Counts of |values| in ``num_bins`` bins over [0, upper]: np.bincount on integer bin indices, several
    times faster than np.histogram. ``upper / num_bins`` is a power of two, so scaling is exact and every
    value lands in exactly the bin ``floor(|x| * num_bins / upper)`` (the top edge joins the last bin).
    ``signed`` is accepted for clarity; |x| is always taken."""
    counts = np.zeros(num_bins, dtype=np.int64)
    x = np.asarray(values)
    if x.size == 0:
        return counts
    counter = BinCounter(num_bins)
    for part in chunks(x):
        counter.add(counts, part, upper)
    return counts
