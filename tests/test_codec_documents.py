"""The documents of what ships (plan.json, deploy.json) go through the one codec: read back as their own type,
another kind of document refused by name, derived fields written for the reader and recomputed on reading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibkit._io import write_json
from calibkit.errors import DataError
from calibkit.results.codec import PLAN_FORMAT, load_result, load_typed, parse_result, to_document
from calibkit.results.documents import BucketChoice, LengthBucket, PlanDocument
from calibkit.results.runs import (
    HoldoutVerdict,
    MethodChoice,
    TuneEvalSet,
    TunePlan,
    TuneResult,
    TuneTarget,
)


def _tune() -> TuneResult:
    plan = TunePlan(("fc1",), 0.75, "entropy", 0.91, accuracy_holdout=0.9, agreement_search=0.99,
                    agreement_holdout=0.985, holdout_verdict=HoldoutVerdict(True, "supported"),
                    reasons={"fc1": ("costs 25 % of the MatMul/Gemm FLOPs",)})
    return TuneResult("0.2.0", TuneEvalSet("eval.jsonl", 100, 80, 20, 32, "given"),
                      TuneTarget(False, 0.92, 0.91, 0.915, True), MethodChoice("auto", "entropy"), plan)


def test_the_plan_document_records_the_layout_and_reads_back(tmp_path: Path) -> None:
    result = _tune()
    plan = PlanDocument.of(result, "onnxruntime")
    write_json(tmp_path / "plan.json", to_document(plan))
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert doc["format"] == PLAN_FORMAT and doc["layout"] == "onnxruntime" and doc["kept_nodes"] == ["fc1"]
    agreement = doc["agreement_with_fp32"]
    assert (agreement["search"], agreement["holdout"]) == (0.99, 0.985) and doc["claim"] == result.claim
    assert load_typed(tmp_path / "plan.json", PlanDocument) == plan


def test_another_kind_of_document_is_refused_by_name(tmp_path: Path) -> None:
    write_json(tmp_path / "plan.json", to_document(PlanDocument.of(_tune(), "tensorrt")))
    write_json(tmp_path / "tune.json", to_document(_tune()))
    with pytest.raises(DataError, match=r"is a calibkit-plan/2 document, not calibkit-tune/1"):
        load_typed(tmp_path / "plan.json", TuneResult)
    with pytest.raises(DataError, match=r"is a calibkit-tune/1 document, not calibkit-plan/2"):
        load_typed(tmp_path / "tune.json", PlanDocument)
    with pytest.raises(DataError, match="not calibkit-compare/1 or calibkit-tune/1"):  # not a report
        load_result(tmp_path / "plan.json")


def test_derived_fields_are_written_and_recomputed() -> None:
    choice = BucketChoice((LengthBucket(1, 8, 10, 50, 5), LengthBucket(9, 16, 5, 60, 12)), requests=15,
                          real_tokens=110, max_seq=16, over_max=1)
    doc = to_document(_wrap(choice))
    body = doc["profiles"]["choices"][0]
    assert body["padded_tokens"] == 160 and body["waste"] == pytest.approx(50 / 110) and body["k"] == 2
    body["waste"] = 99.0  # a derived value is not read: it is recomputed from the buckets
    assert parse_result(doc).profiles.choices[0].waste == pytest.approx(50 / 110)


def _wrap(choice: BucketChoice):  # type: ignore[no-untyped-def]
    """A random deploy result whose one profile choice is ``choice``."""
    import dataclasses
    import random

    from test_results import _random

    from calibkit.results.documents import DeployResult, ProfileChoice

    res = _random(DeployResult, random.Random(0))
    return dataclasses.replace(res, profiles=ProfileChoice(choice.k, None, 8, (choice,), res.profiles.baseline))
