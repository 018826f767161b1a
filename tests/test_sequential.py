"""Decision rules: exact tests, the betting confidence sequence, resumable chunks, and error rates by simulation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from calibkit.evidence.sequential import (
    ConfidenceSequenceRule,
    Constraint,
    Decision,
    RuleState,
    Summary,
    Verdict,
    WholeSplit,
    binomial_tail,
    fixed_n_test,
    rule_from_dict,
    run_rule,
    texts_needed,
)


def _fake(values: dict[str, np.ndarray], calls: list[tuple[int, int]] | None = None):
    def evaluate(start: int, stop: int) -> dict[str, np.ndarray]:
        if calls is not None:
            calls.append((start, stop))
        return {k: v[start:stop] for k, v in values.items()}

    return evaluate


def test_binomial_tail_matches_brute_force() -> None:
    for n, p in ((10, 0.3), (40, 0.9), (200, 0.99)):
        pmf = [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
        for s in (0, 1, n // 2, n - 1, n):
            assert binomial_tail(s, n, p, upper=True) == pytest.approx(sum(pmf[s:]), rel=1e-9, abs=1e-300)
            assert binomial_tail(s, n, p, upper=False) == pytest.approx(sum(pmf[: s + 1]), rel=1e-9, abs=1e-300)


def test_texts_needed_settles_and_is_near_minimal() -> None:
    n = texts_needed(0.995, 0.99, 0.9)
    assert n is not None and 300 < n < 3000
    s = math.floor(0.995 * n + 1e-9)
    assert binomial_tail(s, n, 0.99, upper=True) <= 0.1
    smaller = int(n * 0.8)
    assert binomial_tail(math.floor(0.995 * smaller), smaller, 0.99, upper=True) > 0.1
    assert texts_needed(0.995, 0.99, 0.95) > n  # more confidence, more texts
    assert texts_needed(0.999, 0.99, 0.9) < n  # further from the target, fewer
    miss = texts_needed(0.985, 0.99, 0.9)
    assert miss is not None and binomial_tail(math.ceil(0.985 * miss), miss, 0.99, upper=False) <= 0.1
    assert texts_needed(0.99, 0.99, 0.9) is None and texts_needed(1.5, 0.99) is None


def test_constraints_validate_and_round_trip() -> None:
    with pytest.raises(ValueError, match="strictly inside"):
        Constraint.agreement(1.0)
    with pytest.raises(ValueError, match="strictly inside"):
        Constraint.cosine(-1.0)
    c = Constraint.accuracy_drop(0.005)
    assert (c.threshold, c.low, c.high, c.binary) == (-0.005, -1.0, 1.0, False)
    assert Constraint.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    rule = ConfidenceSequenceRule(0.95, first_chunk=64)
    assert rule_from_dict(rule.to_dict()) == rule and rule_from_dict(WholeSplit(0.9).to_dict()) == WholeSplit(0.9)
    with pytest.raises(ValueError, match="outside"):
        rule.summarize(Constraint.agreement(0.99), np.array([0.0, 2.0]))


def test_whole_split_evaluates_everything_once() -> None:
    c = Constraint.agreement(0.99)
    vals = np.ones(1000)
    vals[:3] = 0  # 99.7 %
    calls: list[tuple[int, int]] = []
    out = run_rule(WholeSplit(0.9), [c], 1000, _fake({"agreement": vals}, calls))
    assert calls == [(0, 1000)] and out.evaluated == 1000 and out.verdict is Verdict.MEETS
    d = out.decision("agreement")
    assert d.by == "final test" and d.lower is not None and 0.99 < d.lower < 0.997 < d.upper
    vals[:9] = 0  # 99.1 %: not settled on 1,000 texts
    out = run_rule(WholeSplit(0.9), [c], 1000, _fake({"agreement": vals}))
    d = out.decision("agreement")
    assert out.verdict is Verdict.UNDECIDED and not out.certified
    assert d.texts_needed is not None and d.texts_needed > 1000


def test_sequential_stops_early_when_far_from_the_threshold() -> None:
    rule = ConfidenceSequenceRule(0.9)
    c = Constraint.agreement(0.99)
    rng = np.random.default_rng(0)
    bad = (rng.random(4000) > 0.08).astype(float)  # 8 % flips
    calls: list[tuple[int, int]] = []
    out = run_rule(rule, [c], 4000, _fake({"agreement": bad}, calls))
    assert out.verdict is Verdict.MISSES and out.decision("agreement").by == "confidence sequence"
    assert out.evaluated <= 256 and calls[0] == (0, 128)
    good = np.ones(4000)
    out = run_rule(rule, [c], 4000, _fake({"agreement": good}))
    assert out.verdict is Verdict.MEETS and out.evaluated <= 1024
    near = (rng.random(4000) > 0.006).astype(float)  # 99.4 %: the sequence cannot settle it early
    calls = []
    out = run_rule(rule, [c], 4000, _fake({"agreement": near}, calls))
    assert out.evaluated == 4000 and [b for _, b in calls] == [128, 256, 512, 1024, 2048, 4000]
    assert out.decision("agreement").by == "final test" and out.verdict is Verdict.MEETS


def test_several_constraints_stop_on_the_first_miss() -> None:
    rule = ConfidenceSequenceRule(0.9)
    rng = np.random.default_rng(1)
    agree = np.ones(3000)
    cos = np.clip(0.9 + 0.02 * rng.standard_normal(3000), -1, 1)  # far below 0.99
    out = run_rule(rule, [Constraint.agreement(0.99), Constraint.cosine(0.99)], 3000,
                   _fake({"agreement": agree, "cosine": cos}))
    assert out.verdict is Verdict.MISSES and out.decision("cosine").verdict is Verdict.MISSES
    assert out.evaluated == 128
    # accuracy drop: paired differences in {-1, 0, 1}, clearly within half a point
    diff = np.zeros(3000)
    diff[:10], diff[10:20] = 1, -1
    out = run_rule(rule, [Constraint.accuracy_drop(0.05)], 3000, _fake({"accuracy_drop": diff}))
    assert out.verdict is Verdict.MEETS and out.evaluated < 3000


def test_resume_redoes_nothing_and_chunks_add_up() -> None:
    rule = ConfidenceSequenceRule(0.9, first_chunk=100)
    cons = [Constraint.agreement(0.99), Constraint.cosine(0.98, low=0.0)]
    rng = np.random.default_rng(2)
    vals = {"agreement": (rng.random(2000) > 0.004).astype(float), "cosine": rng.uniform(0.97, 1.0, 2000)}
    seen: list[RuleState] = []
    full = run_rule(rule, cons, 2000, _fake(vals), on_chunk=seen.append)
    assert len(seen) >= 2
    saved = json.loads(json.dumps(seen[1].to_dict()))  # what a ledger keeps: plain JSON
    state = RuleState.from_dict(saved)
    calls: list[tuple[int, int]] = []
    resumed = run_rule(rule, cons, 2000, _fake(vals, calls), state=state)
    assert calls and calls[0][0] == state.evaluated == 200
    assert resumed.decisions == full.decisions and resumed.evaluated_now == full.evaluated - 200
    # the summary of the chunks is the summary of all the values, in any order
    whole = rule.summarize(cons[1], vals["cosine"][: full.evaluated])
    merged = full.state.summary("cosine")
    assert merged.n == whole.n and np.allclose(merged.log_wealth_meets, whole.log_wealth_meets)
    rev = rule.summarize(cons[1], vals["cosine"][: full.evaluated][::-1])
    assert np.allclose(rev.log_wealth_misses, whole.log_wealth_misses)
    # a finished state evaluates nothing more; another rule's state is refused
    again = run_rule(rule, cons, 2000, _fake(vals, []), state=full.state)
    assert again.evaluated_now == 0 and again.decisions == full.decisions
    with pytest.raises(ValueError, match="another rule"):
        run_rule(ConfidenceSequenceRule(0.95), cons, 2000, _fake(vals), state=full.state)
    with pytest.raises(ValueError, match="contiguous"):
        RuleState.from_dict({**saved, "chunks": saved["chunks"][1:]})


def test_fixed_n_test_on_bounded_means() -> None:
    c = Constraint.cosine(0.99, low=0.0)
    x = np.full(400, 0.995)
    x[::2] = 0.993
    s = Summary(len(x), float(x.sum()), float((x * x).sum()))
    v, lo, hi = fixed_n_test(c, s, 0.1)
    assert v is Verdict.MEETS and 0.99 < lo < x.mean() < hi


# -- error rates by simulation ---------------------------------------------------------------------------------

def _error_rates(rule, p: float, threshold: float, total: int, runs: int, seed: int) -> tuple[float, float, float]:
    """(share of runs deciding MEETS, MISSES, mean texts evaluated) for agreement at true rate ``p``."""
    c = Constraint.agreement(threshold)
    rng = np.random.default_rng(seed)
    meets = misses = 0
    used = 0
    for _ in range(runs):
        vals = (rng.random(total) < p).astype(np.float64)
        out = run_rule(rule, [c], total, _fake({"agreement": vals}))
        meets += out.verdict is Verdict.MEETS
        misses += out.verdict is Verdict.MISSES
        used += out.evaluated
    return meets / runs, misses / runs, used / runs


def _slack(alpha: float, runs: int) -> float:
    return 3.0 * math.sqrt(alpha * (1 - alpha) / runs)


class _RepeatedFixedN(WholeSplit):
    """An invalid rule, for contrast: a fixed-n test at full alpha at every look (repeated looks inflate error)."""

    def looks(self, total: int) -> tuple[int, ...]:
        return ConfidenceSequenceRule().looks(total)

    def decide(self, constraint, summary, total):  # type: ignore[no-untyped-def]
        s, n, t = int(round(summary.total)), summary.n, constraint.threshold
        alpha = 1 - self.confidence
        v = (Verdict.MEETS if binomial_tail(s, n, t, upper=True) <= alpha else
             Verdict.MISSES if binomial_tail(s, n, t, upper=False) <= alpha else Verdict.UNDECIDED)
        return Decision(constraint.name, v, n, summary.mean, t, self.confidence)


@pytest.mark.parametrize("p,wrong", [(0.99, "both"), (0.987, "meets"), (0.993, "misses")])
def test_error_rate_near_the_boundary_is_at_most_alpha(p: float, wrong: str) -> None:
    alpha, runs = 0.1, 400
    rule = ConfidenceSequenceRule(1 - alpha)
    meets, misses, _ = _error_rates(rule, p, 0.99, 2000, runs, seed=int(p * 1e4))
    if wrong in ("both", "meets"):
        assert meets <= alpha + _slack(alpha, runs)
    if wrong in ("both", "misses"):
        assert misses <= alpha + _slack(alpha, runs)


def test_the_simulation_catches_an_invalid_rule() -> None:
    """The same harness on a rule that peeks with a fixed-n test at every look: its error exceeds alpha, so the
    checks above could fail."""
    alpha, runs = 0.1, 400
    meets, _, _ = _error_rates(_RepeatedFixedN(1 - alpha), 0.99, 0.99, 2000, runs, seed=7)
    assert meets > alpha + _slack(alpha, runs)
    meets, _, _ = _error_rates(ConfidenceSequenceRule(1 - alpha), 0.99, 0.99, 2000, runs, seed=7)
    assert meets <= alpha + _slack(alpha, runs)


def test_bounded_mean_error_rate_at_the_boundary() -> None:
    """Cosines with a long lower tail whose mean is the threshold: neither verdict more often than alpha."""
    alpha, runs, total = 0.1, 200, 1000
    rule = ConfidenceSequenceRule(1 - alpha, first_chunk=64)
    c = Constraint.cosine(0.98, low=0.0)
    rng = np.random.default_rng(11)
    meets = misses = 0
    for _ in range(runs):
        vals = 1.0 - rng.exponential(0.02, total)  # mean 0.98 (values below 0 have probability e^-50)
        out = run_rule(rule, [c], total, _fake({"cosine": vals}))
        meets += out.verdict is Verdict.MEETS
        misses += out.verdict is Verdict.MISSES
    assert meets / runs <= alpha + _slack(alpha, runs) and misses / runs <= alpha + _slack(alpha, runs)


@pytest.mark.slow
@pytest.mark.parametrize("confidence", [0.9, 0.95])
@pytest.mark.parametrize("p", [0.985, 0.989, 0.99, 0.991, 0.995])
def test_error_rate_simulation_slow(confidence: float, p: float) -> None:
    alpha, runs = 1 - confidence, 2000
    rule = ConfidenceSequenceRule(confidence)
    meets, misses, _ = _error_rates(rule, p, 0.99, 4000, runs, seed=int(p * 1e5 + confidence * 100))
    if p <= 0.99:
        assert meets <= alpha + _slack(alpha, runs)
    if p >= 0.99:
        assert misses <= alpha + _slack(alpha, runs)
