"""Guards on tune's evidence: rows shared by the eval set and the traffic, rows that count for agreement, targets
the holdout has no texts for, and options refused before any work."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_traffic_evidence import _texts, _write_log

from calibkit.data.calibset import write_calibration_set
from calibkit.data.dedup import digest, normalize
from calibkit.errors import UsageError
from calibkit.evaluate.traffic import TrafficOptions, draw_traffic
from calibkit.evidence.holdout import NOT_CHECKED, holdout_verdict
from calibkit.evidence.split import split_evidence
from calibkit.requests.tune import TuneRequest
from calibkit.results.runs import Difference, PlanEvidence, Range
from calibkit.tasks import ClassificationTask


def test_traffic_rows_that_are_eval_texts_are_dropped_and_counted(tmp_path: Path) -> None:
    texts = _texts(400)
    log = _write_log(tmp_path / "log.jsonl", texts)
    cset = write_calibration_set(tmp_path / "cset", texts[:20], None)
    ev = draw_traffic(log, TrafficOptions(size=300, seed=1), calibration_set=cset)
    eval_texts = [t.upper() for t in ev.texts[:40]]  # the same texts as the eval set writes them
    kept = ev.without(eval_texts, "eval_set")
    assert len(kept) == len(ev) - 40 and kept.excluded["eval_set"] == 40
    assert not {digest(normalize(t)) for t in kept.texts} & {digest(normalize(t)) for t in eval_texts}
    assert kept.population == ev.population - 40
    assert len(kept.keys) == len(kept.lengths) == len(kept.line_numbers) == len(kept.texts)
    assert ev.without(["nothing like these"], "eval_set") is ev


@pytest.mark.parametrize("labelled", [True, False])
def test_unlabelled_eval_rows_count_for_agreement_beside_traffic(labelled: bool) -> None:
    n, t = 300, 200
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, n + t)
    reference = rng.standard_normal((n + t, 2))
    mask = np.zeros(n + t, dtype=bool)
    mask[n:] = True
    ev = split_evidence([f"text {i}" for i in range(n + t)], labels, reference, labelled=labelled,
                        class_names=["a", "b"], holdout_fraction=0.3, sensitivity_samples=64, seed=0, traffic=mask,
                        kind=ClassificationTask)
    agree = ev.agreement_positions(ev.search)
    acc = ev.accuracy_positions(ev.search)
    if labelled:  # labels carry accuracy, traffic carries agreement
        assert mask[ev.search.array[agree]].all() and not mask[ev.search.array[acc]].any()
    else:  # no labels: no accuracy, and every row is agreement evidence (none is evaluated for nothing)
        assert len(acc) == 0 and len(agree) == len(ev.search)


def _evidence(agreement: Range, n: int = 0, agreement_n: int = 0) -> PlanEvidence:
    none = Difference(None, None, None, 0, 0, 0, None, False, "n/a")
    return PlanEvidence(none, agreement, 0, n, agreement_n=agreement_n)


def test_a_target_the_holdout_has_no_texts_for_is_not_checked_not_dropped() -> None:
    cfg = TuneRequest(model="m", calibration_set="c", max_drop=0.5, min_agreement=99.0)
    v = holdout_verdict(cfg, _evidence(Range(None, 0.0, 1.0)), allowed=float("nan"))
    assert v.by_constraint == {"accuracy": NOT_CHECKED, "agreement": NOT_CHECKED}
    assert v.supported is None and "n/a %" not in v.text and "0.00 to 100.00" not in v.text, v.text
    v = holdout_verdict(cfg, _evidence(Range(0.995, 0.99, 0.998), agreement_n=500), allowed=float("nan"))
    assert v.by_constraint["agreement"] == "supported" and v.supported is None  # accuracy was not checked
    v = holdout_verdict(cfg, _evidence(Range(0.95, 0.93, 0.96), agreement_n=500), allowed=float("nan"))
    assert v.supported is False


@pytest.mark.parametrize("cosine", [1.0, -1.0, 1.5])
def test_min_cosine_outside_minus_one_to_one_is_refused_before_any_work(cosine: float) -> None:
    with pytest.raises(UsageError, match="--min-cosine"):
        TuneRequest(model="m", calibration_set="c", min_cosine=cosine)


@pytest.mark.parametrize(("target", "meets"), [(99.0, False), (100.0, True)])
def test_no_flip_on_a_split_too_small_to_settle_it_meets_only_a_100_percent_target(target: float, meets: bool):
    """Zero flips on 8 texts is no evidence of 99 % agreement (the rule left it undecided); only a 100 % target,
    which no bound can reach, is met by a candidate that changed nothing."""
    from calibkit.evidence.plan_decisions import constraints_for, final_meets
    from calibkit.evidence.sequential import Decision, Verdict

    (c,) = constraints_for(min_agreement=target, min_cosine=None, max_drop=None, binary_agreement=True)
    d = Decision(c.name, Verdict.UNDECIDED, 8, 1.0, c.threshold, 0.9)
    assert final_meets([c], [d], at_end=(True,)) is meets
