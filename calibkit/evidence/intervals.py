"""95 % intervals for predictions of two models on the *same* examples, and whether a difference is real.

- a proportion (accuracy, agreement, flip rate): Wilson score interval (good coverage for small n and for
  proportions near 0 or 1, where the normal approximation fails);
- the paired difference of two proportions (accuracy of B minus A, flips of B minus A): a paired bootstrap,
  vectorised as a multinomial resample of the per-example outcome counts (exactly what resampling rows does to
  a mean of per-example differences), with a fixed seed; and the exact McNemar test on the discordant pairs;
- macro-F1 and its paired difference: a paired bootstrap over rows (same resampled rows for A and B).

A difference whose interval covers zero is "not significant": never a gain or a loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

Z95 = 1.959963984540054
BOOTSTRAP = 2000
SEED = 0


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    level: float = 0.95

    @property
    def covers_zero(self) -> bool:
        return self.low <= 0.0 <= self.high

    def to_dict(self) -> dict[str, float]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "level": self.level}


@dataclass(frozen=True)
class PairedDifference:
    """``b - a`` of a per-example 0/1 outcome (e.g. correct) on the same examples."""

    interval: Interval
    a_only: int  # examples where only A has the outcome
    b_only: int  # examples where only B has it
    n: int
    mcnemar_p: float

    @property
    def significant(self) -> bool:
        return not self.interval.covers_zero

    @property
    def verdict(self) -> str:
        if not self.significant:
            return "not significant"
        return "gain" if self.interval.estimate > 0 else "loss"

    def examples_to_settle(self) -> int | None:
        """About how many examples would make an interval of this width exclude zero, if the effect and the
        discordance rate stayed as measured (None when no effect was measured)."""
        return examples_to_settle(self.interval.estimate, self.a_only, self.b_only, self.n)

    def to_dict(self) -> dict[str, Any]:
        return {**self.interval.to_dict(), "a_only": self.a_only, "b_only": self.b_only, "n": self.n,
                "mcnemar_p": self.mcnemar_p, "significant": self.significant, "verdict": self.verdict,
                "examples_to_settle": None if self.significant else self.examples_to_settle()}


def _wilson_bounds(p: float, n: int, z: float) -> tuple[float, float]:
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(max(p * (1 - p), 0.0) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def wilson(k: int, n: int) -> Interval:
    if n <= 0:
        return Interval(float("nan"), 0.0, 1.0)
    p = k / n
    return Interval(p, *_wilson_bounds(p, n, Z95))


def wilson_lower(p: float, n: int, z: float) -> float:
    """The lower end of the Wilson interval of a proportion ``p`` of ``n`` at ``z`` (one-sided: z 1.2816 for 90 %)."""
    if n <= 0 or math.isnan(p) or z <= 0:
        return p
    return _wilson_bounds(p, n, z)[0]


def proportion(outcome: np.ndarray) -> Interval:
    o = np.asarray(outcome, dtype=bool)
    return wilson(int(o.sum()), int(o.size))


def mean_interval(values: np.ndarray) -> Interval:
    """The mean of per-text values with its normal-approximation 95 % interval (sample standard deviation;
    approximate for small n, as for cosines and token shares). NaN estimate for no values."""
    v = np.asarray(values, dtype=np.float64)
    if not v.size:
        return Interval(float("nan"), float("nan"), float("nan"))
    m = float(v.mean())
    half = Z95 * float(v.std(ddof=1)) / math.sqrt(v.size) if v.size > 1 else 0.0
    return Interval(m, m - half, m + half)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: ``b`` and ``c`` are the two kinds of discordant pairs."""
    m = b + c
    if m == 0:
        return 1.0
    k = min(b, c)
    # P(X <= k), X ~ Binomial(m, 1/2), summed in log space (m may be large)
    logs = [math.lgamma(m + 1) - math.lgamma(i + 1) - math.lgamma(m - i + 1) - m * math.log(2) for i in range(k + 1)]
    top = max(logs)
    cdf = math.exp(top) * sum(math.exp(v - top) for v in logs)
    return min(1.0, 2.0 * cdf)


def paired_difference(a: np.ndarray, b: np.ndarray, *, seed: int = SEED, resamples: int = BOOTSTRAP
                      ) -> PairedDifference:
    """95 % paired-bootstrap interval of mean(b) - mean(a) for 0/1 outcomes ``a``, ``b`` on the same examples."""
    a = np.asarray(a, dtype=bool)
    b = np.asarray(b, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"paired outcomes differ in shape: {a.shape} vs {b.shape}")
    n = int(a.size)
    a_only = int((a & ~b).sum())
    b_only = int((b & ~a).sum())
    if n == 0:
        return PairedDifference(Interval(float("nan"), float("-inf"), float("inf")), 0, 0, 0, 1.0)
    est = (b_only - a_only) / n
    if a_only + b_only == 0:
        iv = Interval(0.0, 0.0, 0.0)
    else:
        rng = np.random.default_rng(seed)
        draws = rng.multinomial(n, [a_only / n, b_only / n, 1 - (a_only + b_only) / n], size=resamples)
        diffs = (draws[:, 1] - draws[:, 0]) / n
        lo, hi = np.quantile(diffs, [0.025, 0.975])
        iv = Interval(est, float(lo), float(hi))
    return PairedDifference(iv, a_only, b_only, n, mcnemar_exact(a_only, b_only))


def examples_to_settle(effect: float, a_only: int, b_only: int, n: int) -> int | None:
    if n <= 0 or effect == 0 or a_only + b_only == 0:
        return None
    pa, pb = a_only / n, b_only / n
    var = pa + pb - (pb - pa) ** 2  # variance of one example's difference in {-1, 0, 1}
    return int(math.ceil(Z95 * Z95 * var / (effect * effect)))


def _macro_f1_rows(y: np.ndarray, p: np.ndarray, k: int, weights: np.ndarray) -> np.ndarray:
    """Macro-F1 under each row of ``weights`` [resamples, n] (counts of each example in the resample)."""
    f1 = np.zeros(weights.shape[0])
    for c in range(k):
        tp = weights @ ((y == c) & (p == c)).astype(np.float64)
        fp = weights @ ((y != c) & (p == c)).astype(np.float64)
        fn = weights @ ((y == c) & (p != c)).astype(np.float64)
        denom = 2 * tp + fp + fn
        f1 += np.where(denom > 0, 2 * tp / np.where(denom > 0, denom, 1.0), 0.0)
    return f1 / max(k, 1)


def _resample_weights(n: int, seed: int, resamples: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples, n)) + n * np.arange(resamples)[:, None]
    return np.bincount(idx.ravel(), minlength=resamples * n).reshape(resamples, n).astype(np.float64)


def macro_f1_intervals(y_true: np.ndarray, pred_a: np.ndarray, pred_b: np.ndarray, num_classes: int, *,
                       seed: int = SEED, resamples: int = 1000) -> tuple[Interval, Interval, Interval]:
    """Bootstrap intervals of macro-F1 of A, of B and of B - A (the same resampled rows for both)."""
    y, pa, pb = (np.asarray(v, dtype=np.int64) for v in (y_true, pred_a, pred_b))
    n = int(y.size)
    if n == 0:
        nan = Interval(float("nan"), float("nan"), float("nan"))
        return nan, nan, nan
    ones = np.ones((1, n))
    w = _resample_weights(n, seed, resamples)
    fa, fb = _macro_f1_rows(y, pa, num_classes, w), _macro_f1_rows(y, pb, num_classes, w)
    ea, eb = float(_macro_f1_rows(y, pa, num_classes, ones)[0]), float(_macro_f1_rows(y, pb, num_classes, ones)[0])

    def iv(est: float, samples: np.ndarray) -> Interval:
        lo, hi = np.quantile(samples, [0.025, 0.975])
        return Interval(est, float(lo), float(hi))

    return iv(ea, fa), iv(eb, fb), iv(eb - ea, fb - fa)


# -- evidence: is the eval set big enough to support a verdict? -----------------------------------------------
MIN_EXAMPLES = 200
MIN_PER_CLASS = 30


def evidence_warnings(y_true: np.ndarray, labels: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Plain-language warnings when the eval set is too small or a class too rare for a verdict."""
    y = np.asarray(y_true, dtype=np.int64)
    out: list[str] = []
    if y.size < MIN_EXAMPLES:
        out.append(f"the eval set has only {y.size} examples (< {MIN_EXAMPLES}): accuracy differences of a few "
                   "points are within noise; per-layer advice is not reliable")
    present = np.unique(y)
    if y.size and len(present) < 2:
        out.append(f"the eval set holds one class only ({labels[int(present[0])] if len(labels) else present[0]}):"
                   " accuracy says nothing about the other classes")
    for c, name in enumerate(labels):
        k = int((y == c).sum())
        if 0 < k < MIN_PER_CLASS:
            out.append(f"class {name!r} has only {k} examples (< {MIN_PER_CLASS}): its recall and the macro-F1 "
                       "are not reliable")
    return tuple(out)
