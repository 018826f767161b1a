"""Streaming per-tensor accumulators: nothing holds more than one batch of activations, and float64 work is
done 256K elements at a time.

``RangeAccumulator`` keeps min/max/abs-max, a fine |x| histogram (for percentiles), non-finite counts and the
exact number of values outside given clipping ranges. ``ErrorAccumulator`` keeps the sums that give SQNR and
cosine similarity between two models' versions of one tensor.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from calibkit.calibrate.histogram import Histogram, chunks
from calibkit.calibrate.stats import ActivationStats, StatsAccumulator

HIST_BINS = 16384  # 8 x 2048: percentiles stay precise when a few outliers stretch the range
SQNR_CAP_DB = 200.0  # identical tensors: no noise at all


def valid_mask(shape: Sequence[int], attention_mask: np.ndarray | None) -> np.ndarray | None:
    """A boolean mask broadcastable to ``shape`` that is False at padding positions (None: nothing to mask).

    Layouts recognised: [B, S, H], [B, heads, S, S], [B, heads, S, d], [B, heads, d, S], [B*S, H]. Rank-2
    tensors [B, X] are never masked: X == S by coincidence (pooled [B, H]) is far likelier than a [B, S] activation.
    """
    if attention_mask is None or attention_mask.ndim != 2:
        return None
    m = attention_mask.astype(bool)
    if m.all():
        return None
    b, s = m.shape
    rank = len(shape)
    if rank >= 2 and shape[0] == b:
        if rank == 3:
            axes = [1] if shape[1] == s else ([2] if shape[2] == s else [])
        elif rank == 4:
            axes = [ax for ax in (2, 3) if shape[ax] == s]
        else:
            axes = []
        if not axes:
            return None
        mask = np.ones((b,) + (1,) * (rank - 1), dtype=bool)
        for ax in axes:
            view = [b] + [1] * (rank - 1)
            view[ax] = s
            mask = mask & m.reshape(view)
        return mask
    if rank >= 2 and shape[0] == b * s and s > 1:
        return m.reshape((b * s,) + (1,) * (rank - 1))
    return None


def _select(x: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    if mask is None:
        return x.reshape(-1)
    return x[np.broadcast_to(mask, x.shape)]


class RangeAccumulator:
    """Observed range of one tensor over many batches: calibration's StatsAccumulator (power-of-two |x|
    histogram, non-finite counts) with a finer histogram, plus exact counts outside given clipping ranges."""

    def __init__(
        self,
        tensor: str,
        clip_ranges: Sequence[tuple[float, float]] = (),
        bins: int = HIST_BINS,
        quantizers: Sequence[Any] = (),
    ) -> None:
        """``quantizers[i]`` (an object with ``fake_quantize(x)``, or None) belongs to ``clip_ranges[i]``: the
        accumulator also sums the noise it adds, for :meth:`quant_sqnr_db`."""
        self.bins = bins
        self.quantizers = tuple(quantizers) + (None,) * (len(clip_ranges) - len(quantizers))
        self._signal = 0.0
        self._noise = [0.0] * len(clip_ranges)
        self._acc = StatsAccumulator(tensor, bins)
        self._frozen: ActivationStats | None = None
        self.clip_ranges = tuple(clip_ranges)
        self.clipped = [0] * len(self.clip_ranges)

    def update(self, x: np.ndarray, mask: np.ndarray | None = None) -> None:
        v = _select(np.asarray(x), mask)
        self._acc.observe(v)
        self._frozen = None
        if self.clip_ranges:
            for part in chunks(v):  # float64 temporaries of 256K elements, not of the whole tensor
                c = part.astype(np.float64)
                c = c[np.isfinite(c)]
                self._signal += float(np.dot(c, c))
                for i, (clo, chi) in enumerate(self.clip_ranges):
                    self.clipped[i] += int(np.count_nonzero((c < clo) | (c > chi)))
                    if self.quantizers[i] is not None:
                        d = c - self.quantizers[i].fake_quantize(c)
                        self._noise[i] += float(np.dot(d, d))

    @property
    def stats(self) -> ActivationStats:
        if self._frozen is None:
            self._frozen = self._acc.freeze()
        return self._frozen

    @property
    def count(self) -> int:
        return self._acc.count

    @property
    def nonfinite(self) -> int:
        return self.stats.non_finite

    @property
    def min(self) -> float:
        return self.stats.min

    @property
    def max(self) -> float:
        return self.stats.max

    @property
    def absmax(self) -> float:
        return self.stats.absmax if self.count else math.nan

    def percentile(self, p: float) -> float:
        """The p-th percentile of |x| (error below one bin width, i.e. below absmax / (bins / 2))."""
        if not self.count:
            return math.nan
        return min(self.stats.histogram.percentile(p), self.absmax)

    def clipped_fraction(self, i: int = 0) -> float:
        return self.clipped[i] / self.count if self.count else math.nan

    def quant_sqnr_db(self, i: int = 0) -> float:
        """SQNR (dB) of the FP values against their fake-quantized copies by ``quantizers[i]``: the noise this
        layer's own activation quantizer adds, clipping included, apart from anything earlier layers did."""
        if not self.count or self.quantizers[i] is None:
            return math.nan
        if self._noise[i] == 0.0:
            return SQNR_CAP_DB
        if self._signal == 0.0:
            return -SQNR_CAP_DB
        return min(SQNR_CAP_DB, 10.0 * math.log10(self._signal / self._noise[i]))

    def coarse_stats(self, num_bins: int = 2048) -> ActivationStats:
        """The statistics with the histogram merged down to ``num_bins`` (what calibration methods expect)."""
        s = self.stats
        h = s.histogram
        factor = max(1, h.num_bins // num_bins)
        counts = h.counts.reshape(-1, factor).sum(axis=1)
        return dataclasses.replace(s, histogram=Histogram(counts, h.upper))


class ErrorAccumulator:
    """Sums for SQNR = 10 log10(sum x^2 / sum (x - y)^2) and cosine(x, y); x is the baseline."""

    def __init__(self) -> None:
        self.sxx = 0.0
        self.syy = 0.0
        self.sxy = 0.0
        self.see = 0.0
        self.count = 0
        self.nonfinite = 0

    def update(self, x: np.ndarray, y: np.ndarray, mask: np.ndarray | None = None) -> None:
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape:
            raise ValueError(f"tensor shapes differ: {x.shape} vs {y.shape}")
        xs, ys = _select(x, mask), _select(y, mask)
        for px, py in zip(chunks(xs), chunks(ys)):  # float64 copies of 256K elements at a time
            a, b = px.astype(np.float64), py.astype(np.float64)
            ok = np.isfinite(a) & np.isfinite(b)
            if not ok.all():
                self.nonfinite += int(ok.size - ok.sum())
                a, b = a[ok], b[ok]
            self.count += int(a.size)
            self.sxx += float(np.dot(a, a))
            self.syy += float(np.dot(b, b))
            self.sxy += float(np.dot(a, b))
            d = a - b
            self.see += float(np.dot(d, d))

    @property
    def sqnr_db(self) -> float:
        if self.count == 0:
            return math.nan
        if self.see == 0.0:
            return SQNR_CAP_DB
        if self.sxx == 0.0:
            return -SQNR_CAP_DB
        return min(SQNR_CAP_DB, 10.0 * math.log10(self.sxx / self.see))

    @property
    def cosine(self) -> float:
        if self.count == 0:
            return math.nan
        if self.sxx == 0.0 and self.syy == 0.0:
            return 1.0
        if self.sxx == 0.0 or self.syy == 0.0:
            return 0.0
        return self.sxy / math.sqrt(self.sxx * self.syy)
