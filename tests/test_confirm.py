"""Fixed-sequence confirmation on the holdout (evidence.confirm): the order, the stop at the first failure, and
the error rate with the choice included, against choosing the most INT8 that passes on its own."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from calibkit.evidence.candidates import Measured
from calibkit.evidence.confirm import confirm_order, fixed_sequence


@dataclass(frozen=True)
class _J:
    accuracy: float
    agreement: float
    meets: bool
    texts: int


def _m(name: str, share: float, meets: bool = True, agreement: float = 0.99) -> Measured:
    return Measured((name,), 0.9, share, "prune", meets, agreement)


def test_order_is_the_passing_candidates_least_int8_first() -> None:
    tried = [_m("a", 0.0, False), _m("b", 0.8), _m("c", 0.5), _m("d", 0.9, False), _m("e", 0.5, agreement=0.995),
             _m("f", 0.95)]
    assert confirm_order(tried) == [4, 2, 1, 5]  # e before c: same share, higher agreement


def test_a_limit_keeps_the_fallback_and_the_most_int8_and_still_controls_the_error() -> None:
    """Six passing candidates made the demo's confirmation six passes over the holdout; with a limit of 4 the
    sequence is the least INT8 one (so something can be confirmed) and the three with the most, in order."""
    tried = [_m(c, share) for c, share in zip("abcdef", (0.44, 0.59, 0.63, 0.65, 0.76, 0.83))]
    assert confirm_order(tried, 4) == [0, 3, 4, 5] and confirm_order(tried, 2) == [0, 5]
    assert confirm_order(tried, 1) == [0, 5] and confirm_order(tried, 6) == confirm_order(tried) == list(range(6))
    judged: list[tuple] = []

    def judge(plans):
        judged.extend(plans)
        return [_J(0.9, 0.99, p != ("f",), 100) for p in plans]

    chosen, steps = fixed_sequence(tried, judge, batch=2, limit=4)
    assert chosen == 4 and [s.candidate for s in steps] == [0, 3, 4, 5] and len(judged) == 4


def test_stops_at_the_first_failure_and_keeps_the_last_confirmed() -> None:
    tried = [_m("a", 0.5), _m("b", 0.7), _m("c", 0.8), _m("d", 0.9)]
    verdict = {("a",): True, ("b",): True, ("c",): False, ("d",): True}  # d would pass: never reached
    calls: list[tuple] = []

    def judge(plans):
        calls.extend(plans)
        return [_J(0.9, 0.99, verdict[p], 100) for p in plans]

    chosen, steps = fixed_sequence(tried, judge)
    assert chosen == 1 and [s.candidate for s in steps] == [0, 1, 2] and [s.meets for s in steps] == [True, True, False]
    assert ("d",) not in calls
    # a batch evaluates ahead, but reads the same decisions
    assert fixed_sequence(tried, judge, batch=3)[0] == 1
    verdict[("a",)] = False
    assert fixed_sequence(tried, judge)[0] is None and len(fixed_sequence(tried, judge)[1]) == 1
    assert fixed_sequence([], judge) == (None, ())


def test_the_choice_keeps_the_error_rate_where_picking_the_best_passing_does_not() -> None:
    """Nine candidates with more INT8 than the one good plan, each truly just below the target: confirming them
    in order errs at most alpha; taking the most INT8 of those that pass on their own errs far more often."""
    target, n, z = 0.99, 2000, 1.2816  # one-sided 90 %
    alpha = 0.10
    tried = [_m("good", 0.5)] + [_m(f"bad{k}", 0.6 + 0.03 * k) for k in range(9)]
    truth = {("good",): 0.997, **{(f"bad{k}",): 0.9885 for k in range(9)}}
    rng = random.Random(7)

    def test_once(p):
        s = sum(rng.random() < truth[p] for _ in range(n))
        est = s / n
        return est - z * math.sqrt(est * (1 - est) / n) >= target

    runs, wrong_seq, wrong_best, wrong_limited = 300, 0, 0, 0
    for _ in range(runs):
        verdict = {m.plan: test_once(m.plan) for m in tried}
        chosen, _ = fixed_sequence(tried, lambda plans, v=verdict: [_J(0.9, 0.99, v[p], n) for p in plans])
        wrong_seq += chosen is not None and truth[tried[chosen].plan] < target
        chosen, _ = fixed_sequence(tried, lambda plans, v=verdict: [_J(0.9, 0.99, v[p], n) for p in plans], limit=4)
        wrong_limited += chosen is not None and truth[tried[chosen].plan] < target
        passing = [m for m in tried if verdict[m.plan]]
        best = max(passing, key=lambda m: m.int8_flops_fraction) if passing else None
        wrong_best += best is not None and truth[best.plan] < target
    assert wrong_seq / runs <= alpha and wrong_limited / runs <= alpha
    assert wrong_best / runs > 2 * alpha


def test_holdout_margin_is_what_the_holdout_could_certify() -> None:
    """tune's anchors have margin when a fixed-n exact test at the rule's final confidence (92.5 %) certifies their
    search-split agreement on the holdout's agreement texts: on 1,080 texts 95.79 % does not certify 95 % (the
    demo embedder's first passing prefix), 97 % does; a cosine target must be met too."""
    from types import SimpleNamespace

    from calibkit.evaluate.tune import _holdout_margin
    from calibkit.evidence.plan_decisions import make_rule
    from calibkit.requests.tune import TuneRequest

    rule = make_rule("sequential", 0.9, 256)  # its final test at 92.5 %

    ev = SimpleNamespace(holdout=object(), agreement_positions=lambda subset: range(1080))
    margin = _holdout_margin(TuneRequest(model="m", calibration_set="c", min_agreement=95.0), ev, rule)
    assert margin is not None and _holdout_margin(TuneRequest(model="m", calibration_set="c"), ev, rule) is None
    assert not margin(_m("a", 0.8, agreement=0.9579)) and margin(_m("b", 0.5, agreement=0.97))
    assert not margin(_m("c", 0.5, agreement=float("nan"))) and not margin(_m("d", 0.5, agreement=0.95))
    small = _holdout_margin(TuneRequest(model="m", calibration_set="c", min_agreement=95.0),
                            SimpleNamespace(holdout=object(), agreement_positions=lambda s: range(90)), rule)
    assert small is not None and not small(_m("b", 0.5, agreement=0.97))  # 90 texts cannot certify 97 % > 95 %
    # the search's estimate is noisy: its lower bound over the texts the decision read must be certifiable (the
    # demo embedder: 96.42 % on 571 search texts kept 95.50 % on 1,200 holdout texts, too little to certify 95 %)
    hold = SimpleNamespace(holdout=object(), agreement_positions=lambda subset: range(1200))
    wide = _holdout_margin(TuneRequest(model="m", calibration_set="c", min_agreement=95.0), hold, rule)
    assert wide is not None and wide(_m("f", 0.8, agreement=0.9642))  # the estimate alone: margin
    assert not wide(replace(_m("f", 0.8, agreement=0.9642), texts=571))
    assert wide(replace(_m("g", 0.5, agreement=0.975), texts=571))
    cos = _holdout_margin(TuneRequest(model="m", calibration_set="c", min_agreement=95.0, min_cosine=0.995), ev,
                          rule)
    assert cos is not None
    assert not cos(Measured(("e",), 0.9, 0.5, "prefix", True, 0.97, 0.99))
    assert cos(Measured(("e",), 0.9, 0.5, "prefix", True, 0.97, 0.999))
