"""tune's candidates judged chunk by chunk (evidence.plan_decisions), on fake evidence and fake evaluations:
the same decisions as the whole split on clearly separated candidates for fewer texts, chunks a ledger can
resume, the combined decision's error rate, and the final plan's whole-split numbers."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from calibkit.evaluate.jobs import SensitivityResult
from calibkit.evaluate.search import search_plan
from calibkit.evidence.candidates import as_plan
from calibkit.evidence.plan_decisions import (
    ACCURACY_DROP,
    AGREEMENT,
    PlanJudge,
    chunk_order,
    constraints_for,
    make_rule,
)
from calibkit.evidence.split import SplitEvidence
from calibkit.evidence.subsets import EvalSubset
from calibkit.tasks import ClassificationTask

N = 4000
FLOPS = {"a": 10.0, "b": 10.0, "c": 10.0, "d": 10.0, "e": 10.0}
HARM = {"a": 0.06, "b": 0.03, "c": 0.0, "d": 0.0, "e": 0.0}  # flip rate each node adds in INT8


def _evidence(n: int = N, traffic_every: int | None = None) -> SplitEvidence:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, n)
    ref_pred = np.where(rng.random(n) < 0.9, labels, (labels + 1) % 3)
    reference = np.eye(3)[ref_pred] * 5.0
    traffic = None if traffic_every is None else (np.arange(n) % traffic_every != 0)
    every = EvalSubset(tuple(range(n)), n, 0, "all", "")
    none = EvalSubset((), n, 0, "all", "")
    return SplitEvidence(tuple(f"t{i}" for i in range(n)), labels, reference, True, every, none, none,
                         ClassificationTask, traffic=traffic)


def _u(plan: tuple[str, ...], row: int, seed: int = 0) -> float:
    h = hashlib.blake2b(f"{seed}|{','.join(plan)}|{row}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2.0**64


def _fake_runner(ev: SplitEvidence, rate, calls: list, seed: int = 0):
    """Each text of a chunk flips FP32's prediction with probability ``rate(plan)``, the same for a (plan, text)
    whatever chunk it is in (as a real evaluation)."""
    ref = ev.reference_predictions

    def run(pairs):
        out = []
        for plan, chunk in pairs:
            calls.append((plan, chunk.indices))
            r = rate(plan)
            pred = [int((ref[i] + 1) % 3) if _u(plan, i, seed) < r else int(ref[i]) for i in chunk.indices]
            agree = [float(p == ref[i]) for p, i in zip(pred, chunk.indices)]
            acc = float(np.mean([p == ev.labels[i] for p, i in zip(pred, chunk.indices)]))
            out.append(SensitivityResult("plan", None, acc, 0.0, 0.0, 1.0, flip_rate=1 - float(np.mean(agree)),
                                         predictions=tuple(pred), agreement_values=tuple(agree)))
        return out

    return run


def _rate(plan: tuple[str, ...]) -> float:
    return 0.001 + sum(h for n, h in HARM.items() if n not in plan)


def _judge(ev: SplitEvidence, rule: str, calls: list, rate=_rate, **kw) -> PlanJudge:
    cons = constraints_for(min_agreement=kw.pop("min_agreement", 99.0), min_cosine=None,
                           max_drop=kw.pop("max_drop", None), binary_agreement=True)
    return PlanJudge(ev, ev.search, make_rule(rule, 0.9, 256), cons, _fake_runner(ev, rate, calls, **kw))


def test_chunk_order_is_a_permutation_keeping_each_stratum_share():
    ev = _evidence(1000, traffic_every=4)
    order = chunk_order(ev, ev.search)
    assert sorted(order.tolist()) == list(range(1000))
    assert np.array_equal(order, chunk_order(ev, ev.search))  # deterministic
    first = order[:200]
    assert abs(int(ev.traffic[first].sum()) - 150) <= 2  # 3 traffic rows in 4, in every prefix


def test_sequential_search_decides_as_the_whole_split_for_fewer_texts():
    ev = _evidence()
    outcomes, texts = {}, {}
    for rule in ("whole-split", "sequential"):
        calls: list = []
        judge = _judge(ev, rule, calls)
        outcomes[rule] = search_plan(list(HARM), FLOPS, judge.judge, threshold=0.0)
        texts[rule] = sum(len(c[1]) for c in calls)
    whole, seq = outcomes["whole-split"], outcomes["sequential"]
    assert [(m.plan, m.meets) for m in whole.tried] == [(m.plan, m.meets) for m in seq.tried]
    assert seq.best is not None and seq.best.plan == as_plan(["a", "b"])
    assert texts["sequential"] < texts["whole-split"] / 2
    assert all(m.texts == N for m in whole.tried)
    assert min(m.texts for m in seq.tried) == 256  # all-INT8 (6.1 % flips) is rejected on the first chunk


def test_resume_reruns_no_finished_chunk():
    ev = _evidence()
    ledger: dict = {}
    ran: list = []
    inner = _fake_runner(ev, _rate, [])

    def run(pairs, stop_after=None):
        out = []
        for plan, chunk in pairs:
            key = (plan, tuple(ev.texts[i] for i in chunk.indices))  # tune's ledger keys the texts too
            if key not in ledger:
                if stop_after is not None and len(ran) >= stop_after:
                    raise KeyboardInterrupt
                ran.append(key)
                ledger[key] = inner([(plan, chunk)])[0]
            out.append(ledger[key])
        return out

    cons = constraints_for(min_agreement=99.0, min_cosine=None, max_drop=None, binary_agreement=True)
    first = PlanJudge(ev, ev.search, make_rule("sequential", 0.9, 256), cons, lambda p: run(p, stop_after=4))
    with pytest.raises(KeyboardInterrupt):
        search_plan(list(HARM), FLOPS, first.judge, threshold=0.0)
    done = set(ran)
    assert len(done) == 4
    ran.clear()
    second = PlanJudge(ev, ev.search, make_rule("sequential", 0.9, 256), cons, run)
    out = search_plan(list(HARM), FLOPS, second.judge, threshold=0.0)
    assert not done & set(ran)  # every finished chunk was read back, none evaluated again
    assert out.best is not None and out.best.plan == as_plan(["a", "b"])


def test_the_final_plan_is_completed_over_the_whole_split():
    ev = _evidence()
    calls: list = []
    judge = _judge(ev, "sequential", calls)
    (j,) = judge.judge([as_plan(["a", "b"])])
    assert j.meets and j.texts < N
    whole = judge.complete(as_plan(["a", "b"]))
    assert len(whole.predictions) == N and judge.completed_texts == N - j.texts
    ref = ev.reference_predictions
    expect = [int((ref[i] + 1) % 3) if _u(as_plan(["a", "b"]), i) < 0.001 else int(ref[i]) for i in range(N)]
    assert list(whole.predictions) == expect  # in the split's own row order
    assert judge.texts()[as_plan(["a", "b"])] == j.texts  # the cost counts the decision, not the completion


def test_accuracy_is_estimated_at_the_end_and_agreement_certified():
    ev = _evidence(400)
    calls: list = []
    # 0.5 % flips on 400 texts: agreement >= 99 % cannot be certified at 90 %, so it is a miss
    judge = _judge(ev, "sequential", calls, rate=lambda p: 0.005, max_drop=0.005)
    (j,) = judge.judge([()])
    assert not j.meets and j.texts == 400
    d = {x.constraint: x for x in j.decisions}
    assert d[ACCURACY_DROP].verdict.value in ("undecided", "meets") and d[AGREEMENT].verdict.value == "undecided"
    # no flip at all: met (no flip is no evidence of any; the old search's rule)
    (j0,) = _judge(ev, "sequential", [], rate=lambda p: 0.0, max_drop=0.005).judge([()])
    assert j0.meets


def test_combined_decision_wrongly_certifies_at_most_alpha():
    """Agreement exactly at the 99 % boundary (1 % flips), accuracy well within the drop: a plan that is
    certified is certified wrongly; over repetitions that happens at most alpha (0.1) of the time."""
    ev = _evidence(2000)
    wrong = 0
    reps = 200
    for seed in range(reps):
        judge = _judge(ev, "sequential", [], rate=lambda p: 0.01, max_drop=0.05, seed=seed + 1)
        (j,) = judge.judge([()])
        wrong += j.meets
    assert wrong / reps <= 0.1 + 2 * (0.1 * 0.9 / reps) ** 0.5


def test_a_seeded_whole_split_result_is_judged_without_evaluating_again():
    ev = _evidence(1000)
    calls: list = []
    judge = _judge(ev, "sequential", calls)
    (whole,) = _fake_runner(ev, _rate, [])([((), ev.search)])
    judge.seed((), whole)
    (j,) = judge.judge([()])
    assert calls == [] and not j.meets and j.texts == 1000


def test_a_candidate_near_the_threshold_skips_looks_that_cannot_settle_it():
    """1.5 % flips against a 99 % target: no look before the end could settle it, so it costs the first chunk
    and then the rest of the split (two evaluations), not one evaluation per doubling."""
    ev = _evidence()
    calls: list = []
    (j,) = _judge(ev, "sequential", calls, rate=lambda p: 0.015).judge([()])
    assert j.texts == N and len(calls) == 2 and len(calls[0][1]) == 256


def test_in_the_band_the_next_candidates_go_whole_split_at_once():
    ev = _evidence()
    calls: list = []
    judge = _judge(ev, "sequential", calls, rate=lambda p: 0.015 if len(p) < 3 else 0.2)
    for plan in [("a",), ("a", "b")]:  # two band candidates: first chunk, then the rest (two jobs each)
        judge.judge([plan])
    assert len(calls) == 4 and judge.early == [False, False]
    judge.judge([("a", "b", "c")])  # in the band: one whole-split job, though this one was far (20 % flips)
    assert len(calls) == 5 and len(calls[-1][1]) == N
    assert judge.early[-1] is True  # its first look would have settled it (replayed): chunks again next
    judge.judge([("a", "b", "c", "d")])
    assert len(calls[-1][1]) == 256


def test_beside_traffic_the_labelled_rows_come_first_so_agreement_can_stop_early():
    """Accuracy on labelled rows needs all of them (a few hundred texts cannot settle half a point before the
    last); interleaved with the traffic rows that carry agreement, a plan far above the agreement target read
    the whole split. Labelled rows first, it stops once agreement is settled on part of the traffic."""
    ev = _evidence(N, traffic_every=6)
    labelled = int((~ev.traffic).sum())
    calls: list = []
    (j,) = _judge(ev, "sequential", calls, rate=lambda p: 0.0005, max_drop=0.005).judge([()])
    assert j.meets and j.texts < N
    read = [i for _, rows in calls for i in rows]
    assert not ev.traffic[read[:labelled]].any() and ev.traffic[read[labelled:]].all()
    d = {x.constraint: x for x in j.decisions}
    assert d[ACCURACY_DROP].n == labelled and d[AGREEMENT].n == j.texts - labelled
    assert calls[0][1] and len(calls[0][1]) == labelled + 256  # the first look: every labelled row, a chunk more


def test_beside_traffic_a_plan_at_the_boundary_is_wrongly_certified_at_most_alpha():
    ev = _evidence(2000, traffic_every=5)
    reps = 200
    wrong = sum(_judge(ev, "sequential", [], rate=lambda p: 0.01, max_drop=0.05, seed=s + 1).judge([()])[0].meets
                for s in range(reps))
    assert wrong / reps <= 0.1 + 2 * (0.1 * 0.9 / reps) ** 0.5
