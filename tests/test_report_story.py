"""One verdict per layer, one story per run: reports built from random per-layer measurements state the same
thing in the verdict, the keep section, the layer tables and report.json, in Markdown, HTML and JSON alike."""

from __future__ import annotations

import dataclasses
import html
import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st
from test_report_render import fake_compare

from calibkit.evaluate.decisions import recommend
from calibkit.evidence.intervals import Interval, PairedDifference
from calibkit.report.content import build_document
from calibkit.report.html import render_html
from calibkit.report.markdown import render_markdown
from calibkit.results.codec import parse_result, to_document
from calibkit.results.flags import Flag, Thresholds, flag_layer, gate_on_overall
from calibkit.results.runs import (
    Comparison,
    Difference,
    LayerSensitivity,
    SensitivityEvidence,
    SensitivityRun,
)

KEEP = (Flag.KEEP_FP16, Flag.KEEP_FP32)


def _diff(a_only: int, b_only: int, half: float, n: int = 400) -> PairedDifference:
    """B minus A on ``n`` paired texts, ``a_only``/``b_only`` discordant: the estimate ± ``half``."""
    estimate = (b_only - a_only) / n
    return PairedDifference(Interval(estimate, estimate - half, estimate + half), a_only, b_only, n, 0.5)


effects = st.one_of(st.none(), st.builds(_diff, st.integers(0, 30), st.integers(0, 30), st.floats(0.0005, 0.04)))


@st.composite
def layers(draw):  # type: ignore[no-untyped-def]
    """Inputs of flag_layer: heuristics and, sometimes, measured accuracy effects with their intervals."""
    return {
        "quant_sqnr_db": draw(st.floats(5.0, 45.0)),
        "sqnr_db": draw(st.floats(5.0, 45.0)),
        "clipped_fraction": draw(st.sampled_from([0.0, 1e-5, 5e-3])),
        "outlier_ratio": draw(st.floats(1.0, 20.0)),
        "nonfinite": draw(st.sampled_from([0, 0, 0, 0, 2])),
        "fp_absmax": draw(st.sampled_from([10.0, 10.0, 7e4])),
        "recovery": draw(effects),
        "cost": draw(effects),
    }


def _verdicts(specs: list[dict], overall: PairedDifference | None, measured: bool) -> tuple:
    base = parse_result(fake_compare(len(specs)), strict=False)
    assert isinstance(base, Comparison)
    out = []
    for layer, spec in zip(base.layers, specs):
        rec, cost = (spec["recovery"], spec["cost"]) if measured else (None, None)
        f = flag_layer(Thresholds(), sqnr_db=spec["sqnr_db"], clipped_fraction=spec["clipped_fraction"],
                       outlier_ratio=spec["outlier_ratio"], nonfinite=spec["nonfinite"],
                       fp_absmax=spec["fp_absmax"], quant_sqnr_db=spec["quant_sqnr_db"],
                       all_but_this_delta=rec.interval.estimate if rec else None, all_but_this_diff=rec,
                       only_this_delta=cost.interval.estimate if cost else None, only_this_diff=cost)
        f = gate_on_overall(f, overall)
        sens = None
        if rec is not None or cost is not None:
            def run(d: PairedDifference | None) -> SensitivityRun:
                dd = Difference.of(d)
                return SensitivityRun(None, d.interval.estimate if d else None, None, None,
                                      delta_low=dd.low if dd else None, delta_high=dd.high if dd else None,
                                      significant=dd.significant if dd else None)
            sens = LayerSensitivity(run(cost), run(rec), None)
        out.append(dataclasses.replace(layer, flag=f.flag, reasons=f.reasons, sensitivity=sens,
                                       quant_sqnr_db=spec["quant_sqnr_db"], sqnr_db=spec["sqnr_db"]))
    return base, tuple(out)


def _plain(text: str, markup: str) -> str:
    if markup == "html":
        text = html.unescape(re.sub(r"<[^>]+>", " ", text))
    else:
        text = re.sub(r"\\(.)", r"\1", text.replace("**", ""))
    return re.sub(r"\s+", " ", text)


def _story(text: str, markup: str) -> dict:
    """What a rendering says about the layers, read from its words."""
    t = _plain(text, markup)
    verdict = re.search(r"Verdict: (keep \d+ nodes?|not settled|not measured|no layer|no single layer)", t)
    keep = re.search(r"Keep (\d+) of (\d+) quantized layers", t)
    watch = re.search(r"(\d+) layers? to watch", t)
    unsure = re.search(r"(\d+) layers? with insufficient evidence", t)
    return {"verdict": verdict.group(1) if verdict else None, "keep": int(keep.group(1)) if keep else 0,
            "all_int8": bool(re.search(r"None: all \d+ quantized layers can run in INT8", t)),
            "watch": int(watch.group(1)) if watch else 0, "unsure": int(unsure.group(1)) if unsure else 0,
            "none_shown": "None shown to need it" in t}


def _expected(c: Comparison) -> dict:
    """The story the layers' own flags tell (report.json's layers, parsed back)."""
    flags = [v.flag for v in c.layers]
    keep = sum(f in KEEP for f in flags)
    unsure = flags.count(Flag.INSUFFICIENT)
    measured = c.recommendation.measured
    verdict = (f"keep {keep} node{'s' * (keep != 1)}" if keep else "not measured" if not measured else
               "not settled" if unsure else None)
    shows = keep or measured  # without measurement and nothing to keep, the section stops at the verdict
    return {"verdict": verdict, "keep": keep,
            "all_int8": bool(measured and not keep and not unsure), "watch": flags.count(Flag.WATCH) if shows else 0,
            "unsure": unsure if shows else 0, "none_shown": bool(measured and not keep and unsure)}


@settings(max_examples=60, deadline=None)
@given(st.lists(layers(), min_size=1, max_size=12), st.one_of(st.none(), effects), st.booleans(),
       st.floats(0.9, 1.0))
def test_every_rendering_tells_the_story_of_the_layer_decisions(specs, overall, measured, all_int8) -> None:
    base, verdicts = _verdicts(specs, overall, measured)
    evidence = (SensitivityEvidence(True, task="classification", source="eval set", samples=400,
                                    basis="accuracy (labels) and flips", layers=len(verdicts),
                                    all_int8_agreement=all_int8)
                if measured else SensitivityEvidence(False, "it was turned off (--no-sensitivity)"))
    c = dataclasses.replace(base, layers=verdicts, recommendation=recommend(verdicts, evidence),
                            sensitivity=evidence, findings=())
    back = parse_result(json.loads(json.dumps(to_document(c))))
    assert isinstance(back, Comparison)
    expected = _expected(back)
    assert set(back.keep_in_higher_precision) == {v.node for v in back.layers if v.flag in KEEP}
    doc = build_document(back, ())
    for markup, rendering in (("markdown", render_markdown(doc, ())), ("html", render_html(doc, ()))):
        story = _story(rendering, markup)
        if expected["verdict"] is None:
            assert story["verdict"] in ("no layer", "no single layer")
            story["verdict"] = None
        assert story == expected
    for v in back.layers:  # a reason never argues against its own flag
        settled_harm = [r for r in v.reasons if re.match(r"(keeping only|quantizing only) this layer", r)
                        and "insufficient evidence" not in r]
        if v.flag in (Flag.WATCH, Flag.OK, Flag.INSUFFICIENT):
            assert not settled_harm, (v.flag, v.reasons)


def test_a_settled_measured_cost_keeps_the_layer_whatever_the_overall_difference() -> None:
    """Quantizing only this layer costs 3.12 points (95 % CI -5.47 to -0.78) while the whole INT8 model is not
    significantly less accurate: the layer's own measurement decides; it used to be listed as one where INT8
    costs nothing."""
    cost = PairedDifference(Interval(-0.0312, -0.0547, -0.0078), 20, 7, 400, 0.01)
    overall = PairedDifference(Interval(-0.004, -0.012, 0.004), 9, 7, 2000, 0.6)
    f = gate_on_overall(flag_layer(Thresholds(), sqnr_db=31.0, clipped_fraction=0.0, outlier_ratio=2.0,
                                   nonfinite=0, fp_absmax=10.0, quant_sqnr_db=31.0, only_this_delta=-0.0312,
                                   only_this_diff=cost, all_but_this_delta=0.001,
                                   all_but_this_diff=PairedDifference(Interval(0.001, -0.002, 0.004), 2, 3, 400, 1)),
                        overall)
    assert f.flag is Flag.KEEP_FP16
    assert f.reasons[0].startswith("quantizing only this layer costs 3.12 points (95 % CI -5.47 to -0.78)")
    assert not any("SQNR" in r for r in f.reasons)  # 31 dB supports nothing here


def test_a_recovery_whose_upper_bound_reaches_past_the_threshold_is_not_settled() -> None:
    rec = PairedDifference(Interval(0.002, -0.004, 0.009), 4, 6, 300, 0.7)
    f = flag_layer(Thresholds(), sqnr_db=35.0, clipped_fraction=0.0, outlier_ratio=2.0, nonfinite=0,
                   fp_absmax=10.0, all_but_this_delta=0.002, all_but_this_diff=rec, only_this_delta=0.0,
                   only_this_diff=PairedDifference(Interval(0.0, -0.002, 0.002), 1, 1, 300, 1.0))
    assert f.flag is Flag.INSUFFICIENT
    assert "recovers +0.20 points (95 % CI -0.40 to +0.90), whose upper bound reaches past 0.5" in f.reasons[0]
    assert "about 1,634 examples would settle it" in f.reasons[0]  # 300 x (0.7 / 0.3)^2 = 1633.3


def test_kept_layers_that_a_finding_explains_point_to_it() -> None:
    """The keep table and a clipping finding name the same nodes: the keep section says the finding's fix is
    the alternative, instead of the two sections giving two unrelated pieces of advice."""
    from calibkit.results.runs import FindingResult

    c = parse_result(fake_compare(), strict=False)
    assert isinstance(c, Comparison)
    kept = c.keep_in_higher_precision
    finding = FindingResult("clipping", "softmax outputs", "percentile", kept[:2], ("t1", "t2"), (),
                            {"keep-fp16": 2}, "calibrate them with minmax", "2 softmax outputs are clipped")
    md = render_markdown(build_document(dataclasses.replace(c, findings=(finding,)), ()), ())
    assert "2 of them share a clipped range with other flagged layers (Findings, below)" in md
    plain = render_markdown(build_document(c, ()), ())
    assert "share a clipped range" not in plain
