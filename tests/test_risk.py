"""Evidence where the risk is (evidence.risk): strata by flip risk, the stratified bound and its error rate."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from calibkit.evidence.plan_decisions import constraints_for, make_rule
from calibkit.evidence.risk import RISKY, SAFE, RiskDesign, StratifiedJudge, margins, stratified_bound, stratify
from calibkit.evidence.sequential import Constraint
from calibkit.evidence.split import split_evidence
from calibkit.tasks import ClassificationTask, EmbeddingTask


def _evidence(n: int = 3000, seed: int = 0, traffic: bool = True):
    rng = np.random.default_rng(seed)
    gap = rng.beta(0.6, 0.6, size=n) * 6 - 3  # logit gaps: many confident texts, some near the boundary
    logits = np.stack([np.zeros(n), gap], axis=1)
    pred = logits.argmax(axis=1)
    mask = np.zeros(n, dtype=bool)
    if traffic:
        mask[n // 5:] = True
    labels = pred.copy()
    labels[:n // 5] = np.where(rng.random(n // 5) < 0.9, pred[:n // 5], 1 - pred[:n // 5])
    texts = [f"text {i}" for i in range(n)]
    return split_evidence(texts, labels, logits, labelled=True, class_names=["a", "b"], holdout_fraction=0.3,
                          sensitivity_samples=64, seed=0, traffic=mask if traffic else None, kind=ClassificationTask)


def test_margins_are_the_top2_probability_gap_and_the_neighbour_gap():
    ev = _evidence(50)
    m = margins(ev)
    p = 1 / (1 + np.exp(-ev.reference[:, 1]))
    np.testing.assert_allclose(m, np.abs(2 * p - 1))
    emb = split_evidence([f"t{i}" for i in range(40)], np.zeros(40, dtype=np.int64),
                         np.random.default_rng(1).normal(size=(40, 8)), labelled=False, class_names=[],
                         holdout_fraction=0.3, sensitivity_samples=8, seed=0, kind=EmbeddingTask)
    assert (margins(emb) >= 0).all()


def test_strata_put_changed_and_low_margin_texts_in_full_and_sample_the_rest():
    ev = _evidence()
    sub = ev.search
    base = np.ones(len(sub))
    base[[3, 7]] = 0.0  # all-INT8 changed these: risky whatever their margin
    st = stratify(ev, sub, base, RiskDesign(), seed=0)
    assert st is not None
    m = margins(ev)[sub.array]
    risky = np.concatenate([mem for name, mem in zip(st.names, st.members) if name.endswith(RISKY)])
    assert {3, 7} <= set(risky.tolist()) and set(np.flatnonzero(m < 0.2)) <= set(risky.tolist())
    for name, mem, smp in zip(st.names, st.members, st.sampled):
        assert set(smp.tolist()) <= set(mem.tolist())
        if name.endswith(RISKY):
            assert len(smp) == len(mem)
        if name.endswith(SAFE):
            assert len(smp) < len(mem)
    assert sorted(np.concatenate(st.members).tolist()) == list(range(len(sub)))  # a partition
    again = stratify(ev, sub, base, RiskDesign(), seed=0)
    assert all((a == b).all() for a, b in zip(st.sampled, again.sampled))  # seeded
    assert len(st.evaluated) < len(sub) / 2


def test_the_bound_of_a_stratum_evaluated_in_full_has_no_width_and_a_sampled_one_weighs_up_its_changes():
    c = Constraint.agreement(0.99)
    full = [np.ones(100), np.concatenate([np.ones(95), np.zeros(5)])]
    est, low = stratified_bound(full, [100, 100], c, 1.64)
    assert est == pytest.approx(0.975) and low == pytest.approx(est)
    # one change in a 10 % sample of 1,000 stands for about ten
    est, low = stratified_bound([np.ones(100), np.concatenate([np.ones(99), np.zeros(1)])], [100, 1000], c, 1.64)
    assert est == pytest.approx(100 / 1100 + 1000 / 1100 * 0.99)
    assert low < est
    # nothing changed in the sample: the add-one variance keeps a width
    est, low = stratified_bound([np.ones(100), np.ones(50)], [100, 1000], c, 1.64)
    assert est == 1.0 and low < 0.99


def _result(agree: np.ndarray, positions: np.ndarray) -> SimpleNamespace:
    """What an evaluation of the rows at ``positions`` gives back, for the judge."""
    return SimpleNamespace(predictions=(), agreement_values=tuple(agree[positions]), cosine_values=())


def test_the_stratified_decision_errs_at_most_its_alpha_for_a_plan_just_below_the_target():
    """A plan whose agreement on the population is 98.8 % against a 99 % target: the search split is a sample
    of it; the judge must call it meeting at most 1 - confidence of the time (10 %), however its flips spread
    over the strata. Seeded: 400 replications."""
    target, conf = 0.99, 0.9
    ev = _evidence(6000, seed=3)
    sub = ev.search
    agr = ev.agreement_positions(sub)
    m = margins(ev)[sub.array][agr]
    wrong = 0
    reps = 400
    rng = np.random.default_rng(7)
    for rep in range(reps):
        # population agreement 98.8 %: 70 % of the flips in the risky stratum, the rest spread over the others
        share = np.array([np.mean(m < 0.2), np.mean((m >= 0.2) & (m < 0.5)), np.mean(m >= 0.5)])
        flips = 0.012 * np.array([0.7, 0.2, 0.1]) / share
        p = np.where(m < 0.2, flips[0], np.where(m < 0.5, flips[1], flips[2]))
        agree = np.ones(len(sub))
        agree[agr] = (rng.random(len(agr)) >= p).astype(np.float64)
        base = agree.copy()
        base[agr] = np.where(rng.random(len(agr)) < 0.5, agree[agr], 1.0)  # all-INT8 saw half of the flips
        st = stratify(ev, sub, base, RiskDesign(), seed=rep)
        cons = constraints_for(min_agreement=100 * target, min_cosine=None, max_drop=None, binary_agreement=True)
        judge = StratifiedJudge(ev, sub, st, cons, lambda pairs, st=st, a=agree: [_result(a, st.evaluated)
                                                                                  for _ in pairs],
                                conf, make_rule("sequential", conf))
        (j,) = judge.judge([("x",)])
        wrong += j.meets
    assert wrong / reps <= 0.1 + 0.03  # alpha plus three standard errors of 400 replications


def test_a_plan_well_above_the_target_is_found_to_meet_it_on_a_fraction_of_the_texts():
    ev = _evidence(6000, seed=4)
    sub = ev.search
    agr = ev.agreement_positions(sub)
    m = margins(ev)[sub.array][agr]
    rng = np.random.default_rng(0)
    agree = np.ones(len(sub))
    agree[agr] = (rng.random(len(agr)) >= np.where(m < 0.2, 0.03, 0.0)).astype(np.float64)  # ~99.6 %
    st = stratify(ev, sub, agree, RiskDesign(), seed=0)
    cons = constraints_for(min_agreement=99.0, min_cosine=None, max_drop=None, binary_agreement=True)
    judge = StratifiedJudge(ev, sub, st, cons, lambda pairs: [_result(agree, st.evaluated) for _ in pairs], 0.9,
                            make_rule("sequential", 0.9))
    (j,) = judge.judge([("y",)])
    assert j.meets and j.texts < len(sub) / 2
    assert j.agreement == pytest.approx(float(agree[agr].mean()), abs=0.003)
