"""Why tune keeps a layer: the reason names a measurement of the plan without it, or says that none was made;
what quantizing the layer alone did is never the only reason given."""

from __future__ import annotations

from calibkit.evaluate.jobs import SensitivityResult
from calibkit.evaluate.tune import _reasons
from calibkit.evidence.candidates import Measured, as_plan

FLOPS = {"big": 60.0, "mid": 30.0, "a": 5.0, "b": 5.0}
BASE = SensitivityResult(mode="all", node=None, accuracy=float("nan"), logit_mse=0.0, mean_kl=1e-4, seconds=0.0,
                         flip_rate=0.3)
HARM = {n: (1e-7, 0.0) for n in FLOPS}  # alone, no layer changes a prediction


def _m(kept: list[str], meets: bool, agreement: float, stage: str = "prune") -> Measured:
    return Measured(plan=as_plan(kept), accuracy=float("nan"), int8_flops_fraction=0.0, stage=stage,
                    meets=meets, agreement=agreement)


def _reasons_for(tried: list[Measured]) -> dict[str, list[str]]:
    plan = as_plan(["big", "mid", "a", "b"])
    return _reasons(plan, HARM, BASE, FLOPS, {}, tried + [_m(list(plan), True, 0.995)])


def test_a_layer_returned_alone_names_that_measurement() -> None:
    r = _reasons_for([_m(["mid", "a", "b"], False, 0.97)])
    assert r["big"][0] == "the same plan with it in INT8 kept 97.00 % of FP32's predictions: short of the target"


def test_small_layers_returned_together_name_the_group_measurement() -> None:
    r = _reasons_for([_m(["big", "mid"], False, 0.98)])
    for n in ("a", "b"):
        assert r[n][0] == ("the same plan with it and 1 other kept layer in INT8 kept 98.00 % of FP32's "
                           "predictions: short of the target"), r[n]


def test_a_layer_whose_return_was_never_measured_says_so_before_its_harmless_effect_alone() -> None:
    r = _reasons_for([_m(["mid", "a", "b"], False, 0.97)])
    assert r["mid"][0] == ("kept for its place in the sensitivity ranking (output damage per FLOP): the search "
                           "never measured this plan with it in INT8")
    assert "changes 0.00 %" in r["mid"][1]


def test_a_smaller_prefix_that_missed_is_no_measurement_of_returning_the_layer() -> None:
    r = _reasons_for([_m([], False, 0.70, "all-int8"), _m(["big"], False, 0.90, "prefix")])
    for n in ("mid", "a", "b"):
        assert r[n][0].startswith("kept for its place in the sensitivity ranking"), r[n]
