"""One story per tune run: the claim plan.json and deploy repeat leads the report's summary, and what the holdout
is said to find never contradicts the claim (an estimate on a holdout that confirmed no plan supports nothing)."""

from __future__ import annotations

import dataclasses

import pytest

from calibkit.report.content import build_document
from calibkit.report.markdown import render_markdown
from calibkit.results.runs import (
    Confirmation,
    HoldoutVerdict,
    MethodChoice,
    TuneEvalSet,
    TunePlan,
    TuneResult,
    TuneTarget,
)

VERDICT = "on the holdout split it keeps 99.17 % of FP32's predictions; agreement target: supported"


def _tune(chosen: int | None, supported: bool | None) -> TuneResult:
    plan = TunePlan(("fc1",), 0.75, "entropy", 0.91, accuracy_holdout=0.9, agreement_search=0.995,
                    agreement_holdout=0.9917, holdout_verdict=HoldoutVerdict(supported, VERDICT),
                    reasons={"fc1": ("costs 25 % of the MatMul/Gemm FLOPs",)})
    res = TuneResult("0.2.0", TuneEvalSet("eval.jsonl", 100, 80, 20, 32, "given"),
                     TuneTarget(False, 0.92, 0.91, 0.915, True), MethodChoice("auto", "entropy"), plan)
    return dataclasses.replace(res, confirmation=Confirmation("sequential", 0.95, 0.925, 600, chosen, 8))


def _summary(res: TuneResult) -> str:
    md = render_markdown(build_document(res, ()), ())
    return md.split("## Summary", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize(("chosen", "supported", "says"), [
    (None, True, "the holdout's estimate meets the target, but the holdout confirmed no plan"),
    (8, True, "the holdout supports the claim"),
    (8, False, "the holdout does NOT support the claim"),
    (None, False, "the holdout does NOT support the claim"),
])
def test_the_report_leads_with_the_claim_and_the_holdout_agrees_with_it(
        chosen: int | None, supported: bool, says: str) -> None:
    res = _tune(chosen, supported)
    assert res.holdout_says == says
    summary = _summary(res)
    assert summary.lstrip().startswith(f"Claim: **{res.claim}**.")
    assert f"**{says[0].upper() + says[1:]}**: {VERDICT}" in summary
    if "NOT" in res.claim:  # an unconfirmed or unsupported plan is never said to be supported
        assert "supports the claim" not in summary
