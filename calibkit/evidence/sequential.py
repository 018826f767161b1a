"""Decision rules: does a candidate meet a constraint (agreement >= p, mean cosine >= c, accuracy drop <= d) at
confidence 1 - alpha, and how much evidence does it take to say so?

Two rules share one small interface (:class:`DecisionRule`), so sensitivity, the plan search, the ledger and
the reports do not care which one ran:

- :class:`WholeSplit`: evaluate every row of the split, then one fixed-n test at ``alpha``.
- :class:`ConfidenceSequenceRule`: evaluate in growing chunks (``first_chunk``, then doubling) and stop as soon
  as every constraint is decided (or one is missed).

Every constraint is "the mean of per-text values bounded in [low, high] is at least ``threshold``":
agreement (0/1 per text, or the share of a text's tokens), cosine to FP32 ([-1, 1], or [0, 1] when known), and
the accuracy drop (the paired difference candidate-correct minus reference-correct, in {-1, 0, 1}, at least
``-max_drop``). A constraint is decided either way: *meets* (the mean is above the threshold) or *misses*
(below it); a wrong decision is either kind made on the wrong side of the threshold.

**Which sequential method, and why.** Looking at the data after every chunk and stopping when it looks decided
breaks fixed-n tests (checking a 90 % bound five times errs far more than 10 % of the time). The sequential
rule uses *testing by betting* (Waudby-Smith & Ramdas, "Estimating means of bounded random variables by
betting", JRSS-B 2023; Shafer & Vovk's game-theoretic testing; the confidence-sequence view of Howard et al.,
Ann. Statist. 2021): for "meets", the wealth ``K_n = mean_g prod_i (1 + lambda_g (x_i - t))`` of a uniform
mixture of constant bets ``lambda_g`` (a geometric grid of ``grid`` fractions of the largest safe bet
``1/(t - low)``) is a non-negative supermartingale whenever the true mean is at most ``t``, so by Ville's
inequality it ever reaches ``1/alpha`` with probability at most ``alpha`` — *however often and whenever one
looks*. "misses" bets the other way (``1 - lambda (x - t)``, bets up to ``1/(high - t)``). This is the
confidence sequence of the betting CS evaluated at the threshold (the set of means the mixture has not
rejected), restricted to the one point a decision needs. Chosen over alpha spending because
- it is valid under any number and timing of looks, so chunk sizes can follow batching, executors and resume
  without a pre-registered look schedule;
- it holds for any bounded distribution (cosines, paired differences), not only 0/1 outcomes, with no normal
  approximation;
- with *constant* bets the wealth after n texts depends only on which texts were seen, not their order, and is
  a sum of per-chunk terms: a chunk's summary (:class:`Summary`, a few dozen floats) is all a ledger needs to
  resume, and chunks finished by workers in any order give the same decision.
Its price is evidence near the threshold: an anytime-valid bound needs roughly 2-4x the texts of a fixed-n
bound at the same observed rate. So the rule keeps a share ``final_share`` of ``alpha`` for one fixed-n test at
the *planned* end of the split (the split size is known before the first look, so this test is pre-registered):
the sequence runs at ``alpha * (1 - final_share)``, the final test at ``alpha * final_share``, and by the union
bound the chance of a wrong decision stays at most ``alpha``. Candidates far from the threshold stop after a
chunk or two; those near it cost the whole split, as with :class:`WholeSplit`, at a slightly stricter final
level. For one constraint the error is at most ``alpha``; with several, a plan is certified only when every
constraint meets, so a wrongly certified plan still needs a wrong "meets" on a violated constraint (at most
``alpha``), while rejecting a good plan may cost up to ``alpha`` per constraint.

The fixed-n tests: 0/1 values, the exact one-sided binomial test (Clopper-Pearson); other values, the normal
approximation with the sample standard deviation (approximate for small n, as compare's intervals are).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, Protocol, TypedDict, Unpack

import numpy as np

DEFAULT_CONFIDENCE = 0.9
DEFAULT_FIRST_CHUNK = 128
DEFAULT_FINAL_SHARE = 0.75
DEFAULT_GRID = 16
_MIN_FRACTION = 1.0 / 512
_MAX_FRACTION = 0.95
_EXACT_UP_TO = 20_000


class Verdict(str, enum.Enum):
    MEETS = "meets"
    MISSES = "misses"
    UNDECIDED = "undecided"


@dataclass(frozen=True)
class Constraint:
    """The mean of per-text values in [``low``, ``high``] must be at least ``threshold``. ``binary``: the values
    are 0/1 (agreement, flips), tested exactly."""

    name: str
    threshold: float
    low: float = 0.0
    high: float = 1.0
    binary: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low < self.high):
            raise ValueError(f"constraint {self.name}: bounds [{self.low}, {self.high}] are not an interval")
        if not self.low < self.threshold < self.high:
            raise ValueError(f"constraint {self.name}: threshold {self.threshold} must lie strictly inside "
                             f"[{self.low}, {self.high}] (at a bound it is met or missed without evidence)")
        if self.binary and (self.low, self.high) != (0.0, 1.0):
            raise ValueError(f"constraint {self.name}: 0/1 values need bounds [0, 1]")

    @classmethod
    def agreement(cls, min_agreement: float, name: str = "agreement") -> Constraint:
        """Share of texts whose prediction is FP32's, at least ``min_agreement`` (a fraction: 0.99)."""
        return cls(name, float(min_agreement), 0.0, 1.0, binary=True)

    @classmethod
    def share(cls, min_share: float, name: str) -> Constraint:
        """A mean of per-text shares in [0, 1] (per-token agreement of a text), at least ``min_share``."""
        return cls(name, float(min_share), 0.0, 1.0)

    @classmethod
    def cosine(cls, min_cosine: float, *, low: float = -1.0, name: str = "cosine") -> Constraint:
        """Mean cosine to FP32 at least ``min_cosine``; ``low`` 0.0 when cosines cannot be negative (a tighter
        bound decides sooner)."""
        return cls(name, float(min_cosine), float(low), 1.0)

    @classmethod
    def accuracy_drop(cls, max_drop: float, name: str = "accuracy_drop") -> Constraint:
        """Accuracy lost against the reference at most ``max_drop`` (a fraction: 0.005 = half a point). Values:
        per text, candidate correct minus reference correct (-1, 0, 1)."""
        return cls(name, -float(max_drop), -1.0, 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "threshold": self.threshold, "low": self.low, "high": self.high,
                "binary": self.binary}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Constraint:
        return cls(str(d["name"]), float(d["threshold"]), float(d["low"]), float(d["high"]), bool(d["binary"]))


@dataclass(frozen=True)
class Summary:
    """Sufficient statistics of some texts' values for one constraint under one rule: count, sum, sum of
    squares, and the log-wealth of each constant bet of the grid, on each side. Chunk summaries add up
    (:meth:`merge`), in any order."""

    n: int = 0
    total: float = 0.0
    total_sq: float = 0.0
    log_wealth_meets: tuple[float, ...] = ()
    log_wealth_misses: tuple[float, ...] = ()

    @property
    def mean(self) -> float | None:
        return self.total / self.n if self.n else None

    def merge(self, other: Summary) -> Summary:
        if not self.n:
            return other
        if not other.n:
            return self
        return Summary(self.n + other.n, self.total + other.total, self.total_sq + other.total_sq,
                       _add(self.log_wealth_meets, other.log_wealth_meets),
                       _add(self.log_wealth_misses, other.log_wealth_misses))

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "total": self.total, "total_sq": self.total_sq,
                "log_wealth_meets": list(self.log_wealth_meets), "log_wealth_misses": list(self.log_wealth_misses)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Summary:
        return cls(int(d["n"]), float(d["total"]), float(d["total_sq"]),
                   tuple(float(x) for x in d["log_wealth_meets"]), tuple(float(x) for x in d["log_wealth_misses"]))


def _add(a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, ...]:
    if len(a) != len(b):
        raise ValueError("chunk summaries of different bet grids cannot be merged")
    return tuple(x + y for x, y in zip(a, b))


class _DecisionFacts(TypedDict, total=False):
    """What a rule adds to a :class:`Decision` beside the constraint, verdict and summary: its optional fields."""

    by: str
    lower: float | None
    upper: float | None
    log_e_value: float | None
    texts_needed: int | None


@dataclass(frozen=True)
class Decision:
    """One constraint's verdict after ``n`` texts. ``by``: what decided it ("confidence sequence", "final test",
    or "" while undecided). ``lower``/``upper``: the fixed-n one-sided bounds at ``confidence`` (None until a
    fixed-n test ran). ``log_e_value``: the larger of the two mixture log-wealths (sequential rule only).
    ``texts_needed``: when undecided after the whole split, about how many texts at the observed mean would
    settle it (None when it is already decided, or exactly at the threshold)."""

    constraint: str
    verdict: Verdict
    n: int
    estimate: float | None
    threshold: float
    confidence: float
    by: str = ""
    lower: float | None = None
    upper: float | None = None
    log_e_value: float | None = None
    texts_needed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"constraint": self.constraint, "verdict": self.verdict.value, "n": self.n, "estimate": self.estimate,
                "threshold": self.threshold, "confidence": self.confidence, "by": self.by, "lower": self.lower,
                "upper": self.upper, "log_e_value": self.log_e_value, "texts_needed": self.texts_needed}


class DecisionRule(Protocol):
    """The interface a plan search or sensitivity uses; :func:`run_rule` drives it."""

    @property
    def name(self) -> str: ...
    @property
    def confidence(self) -> float: ...

    @property
    def final_confidence(self) -> float:
        """The one-sided confidence of the fixed-n test that decides a constraint once the whole split is
        seen: what "how many texts would certify it" must be computed at."""
        ...

    def looks(self, total: int) -> tuple[int, ...]:
        """The cumulative numbers of texts after which the rule decides (increasing, ending at ``total``)."""
        ...

    def summarize(self, constraint: Constraint, values: np.ndarray) -> Summary: ...

    def decide(self, constraint: Constraint, summary: Summary, total: int) -> Decision: ...

    def to_dict(self) -> dict[str, Any]: ...


# -- fixed-n tests --------------------------------------------------------------------------------------------

def binomial_tail(successes: int, n: int, p: float, *, upper: bool) -> float:
    """P(S >= successes) (``upper``) or P(S <= successes) for S ~ Binomial(n, p): the exact one-sided p-value,
    through the regularized incomplete beta function (constant time in ``n``, full relative precision in the
    far tail; summing the n + 1 terms of the distribution made the final tests of a long split slow)."""
    from scipy.special import bdtr, bdtrc

    if n <= 0:
        return 1.0
    if p <= 0.0:
        return 1.0 if (not upper or successes <= 0) else 0.0
    if p >= 1.0:
        return 1.0 if (upper or successes >= n) else 0.0
    if upper:
        return 1.0 if successes <= 0 else 0.0 if successes > n else float(bdtrc(successes - 1, n, p))
    return 0.0 if successes < 0 else 1.0 if successes >= n else float(bdtr(successes, n, p))


def _clopper_pearson(successes: int, n: int, alpha: float) -> tuple[float, float]:
    """One-sided exact bounds at level 1 - alpha each: (lower, upper). The lower bound is the p at which
    P(S >= s | p) = alpha, the upper the p at which P(S <= s | p) = alpha: quantiles of beta distributions."""
    from scipy.special import betaincinv

    lower = 0.0 if successes <= 0 else float(betaincinv(successes, n - successes + 1, alpha))
    upper = 1.0 if successes >= n else float(betaincinv(successes + 1, n - successes, 1.0 - alpha))
    return lower, upper


def clopper_pearson(successes: int, n: int, alpha: float) -> tuple[float, float]:
    """One-sided exact (lower, upper) bounds of a binomial share at level 1 - alpha each."""
    return _clopper_pearson(successes, n, alpha)


def _z(alpha: float) -> float:
    return NormalDist().inv_cdf(1.0 - alpha)


def fixed_n_test(constraint: Constraint, summary: Summary, alpha: float) -> tuple[Verdict, float, float]:
    """(verdict, lower, upper) of one fixed-n test at one-sided level ``alpha`` per side."""
    n = summary.n
    if n == 0:
        return Verdict.UNDECIDED, constraint.low, constraint.high
    t = constraint.threshold
    if constraint.binary:
        s = int(round(summary.total))
        lower, upper = _clopper_pearson(s, n, alpha)
        if binomial_tail(s, n, t, upper=True) <= alpha:
            return Verdict.MEETS, lower, upper
        if binomial_tail(s, n, t, upper=False) <= alpha:
            return Verdict.MISSES, lower, upper
        return Verdict.UNDECIDED, lower, upper
    mean = summary.total / n
    var = max(summary.total_sq / n - mean * mean, 0.0) * n / max(n - 1, 1)
    half = _z(alpha) * math.sqrt(var / n)
    lower, upper = max(constraint.low, mean - half), min(constraint.high, mean + half)
    if n >= 2 and lower > t:
        return Verdict.MEETS, lower, upper
    if n >= 2 and upper < t:
        return Verdict.MISSES, lower, upper
    return Verdict.UNDECIDED, lower, upper


def texts_needed(p_hat: float, target: float, confidence: float = DEFAULT_CONFIDENCE) -> int | None:
    """About how many texts a fixed-n exact test needs to settle ``rate >= target`` either way if the observed
    rate stayed ``p_hat`` (agreement 0.995 against 0.99 at confidence 0.9: the smallest n whose one-sided exact
    bound clears 0.99). None when ``p_hat`` equals ``target`` (no finite number settles it) or is not a rate."""
    if not (0.0 <= p_hat <= 1.0) or not (0.0 < target < 1.0) or not (0.0 < confidence < 1.0):
        return None
    if abs(p_hat - target) < 1e-12:
        return None
    alpha = 1.0 - confidence
    meets = p_hat > target
    rough = _z(alpha) ** 2 * target * (1.0 - target) / (p_hat - target) ** 2
    if rough > _EXACT_UP_TO:  # the exact test's discreteness no longer matters: the normal approximation
        return int(math.ceil(rough))

    def settles(n: int) -> bool:
        s = int(math.floor(p_hat * n + 1e-9)) if meets else int(math.ceil(p_hat * n - 1e-9))
        return binomial_tail(s, n, target, upper=meets) <= alpha

    hi = 1
    while not settles(hi):
        hi *= 2
        if hi > 1 << 26:
            return None
    lo = hi // 2
    while hi - lo > 1:  # discreteness makes ``settles`` nearly, not strictly, monotone: a close estimate
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if settles(mid) else (mid, hi)
    return hi


def _mean_texts_needed(constraint: Constraint, summary: Summary, alpha: float) -> int | None:
    if constraint.binary:
        return texts_needed(summary.total / summary.n, constraint.threshold, 1.0 - alpha)
    n = summary.n
    mean = summary.total / n
    gap = mean - constraint.threshold
    var = max(summary.total_sq / n - mean * mean, 0.0) * n / max(n - 1, 1)
    if gap == 0 or var == 0:
        return None
    return int(math.ceil(_z(alpha) ** 2 * var / (gap * gap)))


# -- the rules ------------------------------------------------------------------------------------------------

def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def _moments(constraint: Constraint, values: np.ndarray) -> tuple[np.ndarray, int, float, float]:
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size and (not np.isfinite(x).all() or x.min() < constraint.low - 1e-9 or x.max() > constraint.high + 1e-9):
        raise ValueError(f"constraint {constraint.name}: values outside [{constraint.low}, {constraint.high}] "
                         "or not finite")
    x = np.clip(x, constraint.low, constraint.high)
    return x, int(x.size), float(x.sum()), float((x * x).sum())


@dataclass(frozen=True)
class WholeSplit:
    """Evaluate the whole split, then one fixed-n test at ``1 - confidence``."""

    confidence: float = DEFAULT_CONFIDENCE
    name: str = "whole-split"

    def __post_init__(self) -> None:
        _check_confidence(self.confidence)

    @property
    def final_confidence(self) -> float:
        return self.confidence

    def looks(self, total: int) -> tuple[int, ...]:
        return (total,) if total > 0 else ()

    def summarize(self, constraint: Constraint, values: np.ndarray) -> Summary:
        _, n, s, s2 = _moments(constraint, values)
        return Summary(n, s, s2)

    def decide(self, constraint: Constraint, summary: Summary, total: int) -> Decision:
        alpha = 1.0 - self.confidence
        if summary.n < total:
            return Decision(constraint.name, Verdict.UNDECIDED, summary.n, summary.mean, constraint.threshold,
                            self.confidence)
        verdict, lower, upper = fixed_n_test(constraint, summary, alpha)
        need = _mean_texts_needed(constraint, summary, alpha) if verdict is Verdict.UNDECIDED and summary.n else None
        return Decision(constraint.name, verdict, summary.n, summary.mean, constraint.threshold, self.confidence,
                        "final test" if verdict is not Verdict.UNDECIDED else "", lower, upper, None, need)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "confidence": self.confidence}


@dataclass(frozen=True)
class ConfidenceSequenceRule:
    """Evaluate in chunks of ``first_chunk``, then doubling, and stop once decided (see the module docstring):
    a betting confidence sequence at ``alpha * (1 - final_share)`` at every look, and an exact/normal fixed-n
    test at ``alpha * final_share`` when the whole split has been seen (``final_share`` 0: the sequence alone;
    a constraint it has not decided by then stays undecided)."""

    confidence: float = DEFAULT_CONFIDENCE
    first_chunk: int = DEFAULT_FIRST_CHUNK
    growth: float = 2.0
    final_share: float = DEFAULT_FINAL_SHARE
    grid: int = DEFAULT_GRID
    name: str = "confidence-sequence"
    fractions: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_confidence(self.confidence)
        if self.first_chunk < 1 or self.growth <= 1.0 or not 0.0 <= self.final_share < 1.0 or self.grid < 1:
            raise ValueError("first_chunk >= 1, growth > 1, final_share in [0, 1) and grid >= 1 are required")
        fr = np.geomspace(_MIN_FRACTION, _MAX_FRACTION, self.grid) if self.grid > 1 else np.array([0.5])
        object.__setattr__(self, "fractions", tuple(float(f) for f in fr))

    @property
    def alpha_sequence(self) -> float:
        return (1.0 - self.confidence) * (1.0 - self.final_share)

    @property
    def alpha_final(self) -> float:
        return (1.0 - self.confidence) * self.final_share

    @property
    def final_confidence(self) -> float:
        # final_share 0: the sequence alone decides, at its own level, which a fixed-n bound understates
        return 1.0 - (self.alpha_final if self.final_share > 0 else self.alpha_sequence)

    def looks(self, total: int) -> tuple[int, ...]:
        out: list[int] = []
        n = float(self.first_chunk)
        while int(n) < total:
            if not out or int(n) > out[-1]:
                out.append(int(n))
            n *= self.growth
        if total > 0:
            out.append(total)
        return tuple(out)

    def _bets(self, constraint: Constraint) -> tuple[np.ndarray, np.ndarray]:
        f = np.asarray(self.fractions)
        return f / (constraint.threshold - constraint.low), f / (constraint.high - constraint.threshold)

    def summarize(self, constraint: Constraint, values: np.ndarray) -> Summary:
        x, n, s, s2 = _moments(constraint, values)
        up, down = self._bets(constraint)
        d = x - constraint.threshold
        if constraint.binary:  # two distinct values: count them instead of n x grid logs
            ones = int(round(s))
            zeros = n - ones
            t = constraint.threshold
            lw_meets = ones * np.log1p(up * (1 - t)) + zeros * np.log1p(-up * t)
            lw_misses = ones * np.log1p(-down * (1 - t)) + zeros * np.log1p(down * t)
        else:
            lw_meets = np.log1p(np.outer(d, up)).sum(axis=0) if n else np.zeros(len(up))
            lw_misses = np.log1p(-np.outer(d, down)).sum(axis=0) if n else np.zeros(len(down))
        return Summary(n, s, s2, tuple(float(v) for v in lw_meets), tuple(float(v) for v in lw_misses))

    @staticmethod
    def _mixture(log_wealth: tuple[float, ...]) -> float:
        a = np.asarray(log_wealth, dtype=np.float64)
        if not a.size:
            return 0.0
        top = float(a.max())
        return top + math.log(float(np.exp(a - top).mean()))

    def decide(self, constraint: Constraint, summary: Summary, total: int) -> Decision:
        def make(verdict: Verdict, **kw: Unpack[_DecisionFacts]) -> Decision:
            return Decision(constraint.name, verdict, summary.n, summary.mean, constraint.threshold, self.confidence,
                            **kw)

        if summary.n == 0:
            return make(Verdict.UNDECIDED)
        meets, misses = self._mixture(summary.log_wealth_meets), self._mixture(summary.log_wealth_misses)
        log_e = max(meets, misses)
        bar = math.log(1.0 / self.alpha_sequence)
        if meets >= bar:
            return make(Verdict.MEETS, by="confidence sequence", log_e_value=log_e)
        if misses >= bar:
            return make(Verdict.MISSES, by="confidence sequence", log_e_value=log_e)
        if summary.n < total:
            return make(Verdict.UNDECIDED, log_e_value=log_e)
        if self.final_share == 0.0:
            return make(Verdict.UNDECIDED, log_e_value=log_e,
                        texts_needed=_mean_texts_needed(constraint, summary, 1.0 - self.confidence))
        verdict, lower, upper = fixed_n_test(constraint, summary, self.alpha_final)
        if verdict is Verdict.UNDECIDED:
            return make(verdict, lower=lower, upper=upper, log_e_value=log_e,
                        texts_needed=_mean_texts_needed(constraint, summary, self.alpha_final))
        return make(verdict, by="final test", lower=lower, upper=upper, log_e_value=log_e)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "confidence": self.confidence, "first_chunk": self.first_chunk,
                "growth": self.growth, "final_share": self.final_share, "grid": self.grid}


def rule_from_dict(d: Mapping[str, Any]) -> WholeSplit | ConfidenceSequenceRule:
    if d.get("name") == "whole-split":
        return WholeSplit(float(d["confidence"]))
    if d.get("name") == "confidence-sequence":
        return ConfidenceSequenceRule(float(d["confidence"]), int(d["first_chunk"]), float(d["growth"]),
                                      float(d["final_share"]), int(d["grid"]))
    raise ValueError(f"unknown decision rule {d.get('name')!r}")


# -- running a rule over a split, in chunks, resumably --------------------------------------------------------

@dataclass(frozen=True)
class ChunkRecord:
    """Rows [start, stop) of the split, evaluated, and each constraint's summary of them."""

    start: int
    stop: int
    summaries: Mapping[str, Summary]

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "stop": self.stop,
                "summaries": {k: v.to_dict() for k, v in self.summaries.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ChunkRecord:
        return cls(int(d["start"]), int(d["stop"]),
                   {str(k): Summary.from_dict(v) for k, v in dict(d["summaries"]).items()})


@dataclass(frozen=True)
class RuleState:
    """Everything a ledger needs to resume a candidate's evaluation without redoing a chunk: the rule, the
    constraints, the split size and the evaluated chunks (contiguous from row 0). Plain JSON via
    :meth:`to_dict` / :meth:`from_dict`."""

    rule: Mapping[str, Any]
    constraints: tuple[Constraint, ...]
    total: int
    chunks: tuple[ChunkRecord, ...] = ()

    @property
    def evaluated(self) -> int:
        return self.chunks[-1].stop if self.chunks else 0

    def summary(self, name: str) -> Summary:
        out = Summary()
        for c in self.chunks:
            out = out.merge(c.summaries[name])
        return out

    def matches(self, rule: DecisionRule, constraints: Sequence[Constraint], total: int) -> bool:
        return (dict(self.rule) == rule.to_dict() and tuple(self.constraints) == tuple(constraints)
                and self.total == total)

    def to_dict(self) -> dict[str, Any]:
        return {"rule": dict(self.rule), "constraints": [c.to_dict() for c in self.constraints],
                "total": self.total, "chunks": [c.to_dict() for c in self.chunks]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RuleState:
        chunks = tuple(ChunkRecord.from_dict(c) for c in d["chunks"])
        at = 0
        for c in chunks:
            if c.start != at or c.stop <= c.start:
                raise ValueError("the recorded chunks are not contiguous from row 0")
            at = c.stop
        return cls(dict(d["rule"]), tuple(Constraint.from_dict(c) for c in d["constraints"]), int(d["total"]),
                   chunks)


@dataclass(frozen=True)
class Outcome:
    """The decisions after the last look, the state to record, and how many rows this call evaluated."""

    decisions: tuple[Decision, ...]
    state: RuleState
    evaluated_now: int

    @property
    def evaluated(self) -> int:
        return self.state.evaluated

    @property
    def verdict(self) -> Verdict:
        """MISSES when any constraint misses, MEETS when all meet, else UNDECIDED."""
        vs = [d.verdict for d in self.decisions]
        if Verdict.MISSES in vs:
            return Verdict.MISSES
        return Verdict.MEETS if vs and all(v is Verdict.MEETS for v in vs) else Verdict.UNDECIDED

    @property
    def certified(self) -> bool:
        return self.verdict is Verdict.MEETS

    def decision(self, name: str) -> Decision:
        for d in self.decisions:
            if d.constraint == name:
                return d
        raise KeyError(name)


Evaluate = Callable[[int, int], Mapping[str, np.ndarray]]


def run_rule(
    rule: DecisionRule,
    constraints: Sequence[Constraint],
    total: int,
    evaluate: Evaluate,
    *,
    state: RuleState | None = None,
    on_chunk: Callable[[RuleState], None] | None = None,
    stop_on_miss: bool = True,
) -> Outcome:
    """Evaluate a split of ``total`` rows (in the split's fixed order) chunk by chunk until ``rule`` has
    decided every constraint (or one misses, with ``stop_on_miss``), or the split is used up.

    ``evaluate(start, stop)`` returns, for rows [start, stop), one value per row for each constraint's name.
    ``state``: a recorded state of the same rule, constraints and split (a ledger's): its chunks are reused,
    not evaluated again. ``on_chunk`` sees the state after each new chunk (append it to the ledger there)."""
    names = [c.name for c in constraints]
    if len(set(names)) != len(names) or not constraints:
        raise ValueError("constraints need distinct names, and at least one")
    if state is None:
        state = RuleState(rule.to_dict(), tuple(constraints), total)
    elif not state.matches(rule, constraints, total):
        raise ValueError("the recorded state belongs to another rule, constraint set or split size")
    evaluated_now = 0

    def decisions(st: RuleState) -> tuple[Decision, ...]:
        return tuple(rule.decide(c, st.summary(c.name), total) for c in constraints)

    def settled(ds: tuple[Decision, ...]) -> bool:
        if stop_on_miss and any(d.verdict is Verdict.MISSES for d in ds):
            return True
        return all(d.verdict is not Verdict.UNDECIDED for d in ds)

    current = decisions(state)
    for look in rule.looks(total):
        if look <= state.evaluated:
            continue
        if state.evaluated and settled(current):
            break
        start = state.evaluated
        values = evaluate(start, look)
        summaries = {}
        for c in constraints:
            v = np.asarray(values[c.name])
            if v.shape[0] != look - start:
                raise ValueError(f"evaluate({start}, {look}) returned {v.shape[0]} values for {c.name}")
            summaries[c.name] = rule.summarize(c, v)
        state = RuleState(state.rule, state.constraints, total, (*state.chunks, ChunkRecord(start, look, summaries)))
        evaluated_now += look - start
        if on_chunk is not None:
            on_chunk(state)
        current = decisions(state)
        if settled(current):
            break
    return Outcome(current, state, evaluated_now)


__all__: Sequence[str] = (
    "Verdict", "Constraint", "Summary", "Decision", "DecisionRule", "WholeSplit", "ConfidenceSequenceRule",
    "ChunkRecord", "RuleState", "Outcome", "run_rule", "texts_needed", "binomial_tail", "fixed_n_test",
    "rule_from_dict",
)
