"""Numbers that explain themselves: counts that add up and say what they count, one name per layer in the
terminal and the reports, no "0 texts" for a phase that read none."""

from __future__ import annotations

import dataclasses
import html
import re

import pytest
from test_report_render import fake_compare, fake_tune

from calibkit.cli import compare as compare_cli
from calibkit.cli.tune import phase_words
from calibkit.evaluate.decisions import recommend
from calibkit.report.content import build_document
from calibkit.report.html import render_html
from calibkit.results.codec import parse_result
from calibkit.results.flags import Flag
from calibkit.results.runs import Comparison, PhaseCost, SensitivityEvidence, TuneResult

EVIDENCE = SensitivityEvidence(True, task="classification", source="eval set", samples=400,
                               basis="accuracy (labels) and flips", layers=3, all_int8_agreement=0.97)


def _comparison() -> Comparison:
    """Three nodes, five quantized inputs: ``attn.scores`` kept (one input keep-fp16, its other one not
    settled), ``attn.context`` not settled on both inputs, ``ffn`` fine."""
    base = parse_result(fake_compare(5), strict=False)
    assert isinstance(base, Comparison)
    spec = [("attn_scores", "bert.layer.0.attention.self", Flag.KEEP_FP16),
            ("attn_scores", "bert.layer.0.attention.self", Flag.INSUFFICIENT),
            ("attn_context", "bert.layer.0.attention.self", Flag.INSUFFICIENT),
            ("attn_context", "bert.layer.0.attention.self", Flag.INSUFFICIENT),
            ("ffn_matmul", "bert.layer.0.output.dense", Flag.OK)]
    layers = tuple(dataclasses.replace(v, node=node, module=module, flag=flag, op_type="MatMul",
                                       tensor=f"{node}_in{i % 2}")
                   for i, (v, (node, module, flag)) in enumerate(zip(base.layers, spec)))
    return dataclasses.replace(base, layers=layers, recommendation=recommend(layers, EVIDENCE), sensitivity=EVIDENCE,
                               findings=())


def test_the_nodes_not_settled_are_the_ones_not_kept_and_listed_after_their_own_count(
        monkeypatch: pytest.MonkeyPatch) -> None:
    c = _comparison()
    assert c.recommendation.keep_in_higher_precision == ("attn_scores",)
    # attn_scores is kept: its unsettled second input does not make it one "more" node not settled
    assert "; 1 more node not settled" in c.recommendation.verdict
    lines: list[str] = []
    monkeypatch.setattr(compare_cli, "say", lines.append)
    compare_cli._print_verdict(c)
    keep = next(x for x in lines if x.startswith("recommendation:"))
    assert keep.startswith("recommendation: keep 1 node in fp16 (from per-layer sensitivity")
    assert keep.endswith("): bert.layer.0.attention.self (attn_scores)")  # the list follows "keep 1 node"
    assert "not settled" not in keep
    unsettled = next(x for x in lines if x.startswith("1 more node not settled"))
    assert unsettled.endswith(": bert.layer.0.attention.self (attn_context)")
    assert "3 quantized layer inputs of 2 nodes: insufficient evidence" in lines[-1]


def test_the_flagged_table_counts_inputs_and_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not compare_cli.out.is_terminal  # piped: plain lines
    lines: list[str] = []
    monkeypatch.setattr(compare_cli, "say", lines.append)
    compare_cli._print_layers(_comparison())
    # "flagged" is every flag but ok: what each count counts is said, and the counts add up
    assert lines[0] == ("4 of 5 quantized layer inputs flagged (2 nodes of 3): 1 keep-fp16, "
                        "3 insufficient-evidence")


def _html_text(c: Comparison | TuneResult) -> str:
    page = render_html(build_document(c, ()), ())
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def test_the_html_report_names_layers_as_the_terminal_does() -> None:
    c = _comparison()
    text = _html_text(c)
    assert "bert.layer.0.attention.self (attn_scores)" in text and "bert.layer.0.attention.self (attn_context)" in text
    # the keep sentence counts nodes, as the verdict does: 1 of 3 nodes kept, 1 more not settled
    assert "Keep 1 of 3 quantized layers in FP16; 1 more is not settled" in text
    tune = parse_result(fake_tune(), strict=False)
    assert isinstance(tune, TuneResult)
    node = tune.final.kept_nodes[0]
    tune = dataclasses.replace(tune, final=dataclasses.replace(tune.final, kept_modules={node: "encoder.layer.0"}))
    assert tune.final.label(node) == f"encoder.layer.0 ({node})"
    assert f"encoder.layer.0 ({node})" in _html_text(tune)


def test_a_phase_that_read_no_texts_does_not_say_0_texts() -> None:
    assert phase_words(PhaseCost("plan search", 12.4, 0, utilisation=0.5)) == "plan search 12 s (CPU 50 %)"
    assert phase_words(PhaseCost("confirm", 3.0)) == "confirm 3 s"
    assert phase_words(PhaseCost("FP32 reference", 7.0, 400, utilisation=0.9)) == (
        "FP32 reference 7 s (400 texts, CPU 90 %)")


def _plan_result(task: str):  # type: ignore[no-untyped-def]
    from test_codec_documents import _tune

    from calibkit.results.runs import Difference, PlanEvidence, Range

    diff = Difference(0.0, -0.01, 0.01, 0, 0, 0, None, False, "not significant")
    search = PlanEvidence(diff, Range(0.99, 0.975, 0.996), 4, 400, agreement_n=1200)
    holdout = PlanEvidence(diff, Range(0.985, 0.97, 0.993), 6, 400)
    result = _tune()
    final = dataclasses.replace(result.final, search_evidence=search, holdout_evidence=holdout)
    return dataclasses.replace(result, final=final, target=dataclasses.replace(result.target, task=task))


def test_plan_json_agreement_carries_its_interval_and_what_it_is_measured_on() -> None:
    from calibkit.results.codec import to_document
    from calibkit.results.documents import PlanDocument

    doc = to_document(PlanDocument.of(_plan_result("classification"), "onnxruntime"))["agreement_with_fp32"]
    assert doc["search_interval"] == {"estimate": 0.99, "low": 0.975, "high": 0.996, "level": 0.95}
    assert doc["holdout_interval"]["low"] == 0.97 and doc["holdout_interval"]["high"] == 0.993
    # agreement on the traffic's 1,200 texts, the holdout's on its 400
    assert (doc["search_texts"], doc["holdout_texts"], doc["kept"]) == (1200, 400, "FP32's predictions")
    assert doc["search_index_size"] is None  # no index: a classifier's agreement is per text
    emb = to_document(PlanDocument.of(_plan_result("embedding"), "onnxruntime"))["agreement_with_fp32"]
    # nearest neighbours are looked up among the split's own texts: the index size is that count
    assert (emb["search_index_size"], emb["holdout_index_size"]) == (1200, 400)
    assert "nearest neighbours" in emb["kept"]


def test_the_demo_summary_gives_every_verdict_with_its_interval_unconfirmed_first() -> None:
    from test_calibration_document import _demo_summary

    from calibkit.demo.workflow import _index, verdict_lines
    from calibkit.results.runs import HoldoutVerdict, PlanEvidence, Range

    s = _demo_summary()
    assert s.embedder is not None
    not_confirmed = HoldoutVerdict(None, "the agreement's lower bound is below the target",
                                   {"agreement": "not confirmed", "cosine": "supported"})
    diff = s.tune.holdout_evidence.accuracy_minus_fp32  # type: ignore[union-attr]
    emb_ev = PlanEvidence(diff, Range(0.96, 0.93, 0.98), 4, 100, cosine=Range(0.999, 0.998, 0.9995))
    s = dataclasses.replace(s, embedder=dataclasses.replace(s.embedder, holdout_verdict=not_confirmed,
                                                            holdout_evidence=emb_ev))
    lines = verdict_lines(s)
    assert len(lines) == 3
    emb, plan, cmp = lines
    # the embedder's unconfirmed verdict leads, with its interval, its texts and the index it was judged in
    assert emb.startswith("sentence embedder plan (1 layer kept) (nearest neighbours looked up among the 100 "
                          "holdout texts): holdout not confirmed (agreement: not confirmed; cosine: supported)")
    assert "nearest neighbour in the FP32 index kept 96.00 % [93.00, 98.00] on 100 holdout texts" in emb
    assert "mean cosine 0.9990 [0.9980, 0.9995]" in emb
    assert plan.startswith("tuned plan (1 layer kept, 90.0 % of FLOPs in INT8): holdout supported")
    assert "FP32's predictions kept 98.00 % [85.00, 95.00] on 60 holdout texts" in plan
    assert "accuracy -1.00 points [-3.00, +1.00] vs FP32 (not significant)" in plan
    assert cmp == ("compare FP32 vs INT8 (mse) on 200 test texts: FP32's predictions kept 98.00 % [85.00, 95.00], "
                   "accuracy -1.00 points [-3.00, +1.00] (not significant)")
    md, page = _index(s)
    assert all(f"- {line}" in md for line in lines)
    assert md.index("sentence embedder plan") < md.index("tuned plan (1 layer")
    assert "Verdicts (95 % intervals" in page


def test_flips_are_said_one_way_and_a_report_without_class_flips_says_why_none_are_listed() -> None:
    c = dataclasses.replace(_comparison(), agreement=0.9, disagreements=())
    c = dataclasses.replace(c, eval_set=dataclasses.replace(c.eval_set, count=200))
    text = _html_text(c)
    assert "on 200 texts (flips, texts whose prediction changed: 10.00 %)" in text
    # 20 texts changed, none listed (no class predictions to list): not "Disagreements: 0" beside 10 % flips
    assert "Flips listed below: none of 20" in text and "Disagreements" not in text
    listed = parse_result(fake_compare(5), strict=False)
    assert isinstance(listed, Comparison)
    assert f"Flips listed below: {len(listed.disagreements)}" in _html_text(listed)


def test_tune_json_names_its_traffic_log_relative_to_its_own_folder(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from test_codec_documents import _tune

    from calibkit.evaluate.tune import _traffic_beside
    from calibkit.provenance import document_path
    from calibkit.results.runs import Evidence

    monkeypatch.chdir(tmp_path)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "prod.jsonl").write_text("{}\n")
    result = _tune()
    result = dataclasses.replace(result, eval_set=dataclasses.replace(
        result.eval_set, traffic=Evidence("logs/prod.jsonl", 10)))  # as given, from the folder tune ran in
    written = _traffic_beside(result, tmp_path / "runs" / "tune-model")
    assert written.eval_set.traffic is not None and written.eval_set.traffic.path == "../../logs/prod.jsonl"
    monkeypatch.chdir(tmp_path / "logs")  # read from anywhere: against tune.json's folder
    assert document_path(tmp_path / "runs" / "tune-model" / "tune.json", written.eval_set.traffic.path, {}) == (
        tmp_path / "logs" / "prod.jsonl")


def test_tune_prints_the_plans_agreement_with_its_interval_and_texts() -> None:
    from rich.console import Console

    from calibkit.cli.tune import _table

    def shown(task: str) -> str:
        console = Console(width=400, record=True)
        console.print(_table(_plan_result(task)))
        return " ".join(console.export_text().split())

    text = shown("classification")
    assert "99.00 % [97.50, 99.60] on 1,200" in text and "98.50 % [97.00, 99.30] on 400" in text
    assert "with its 95 % interval and texts" in text and "FP32 index" not in text
    assert "FP32 index of each split's texts, so the agreement depends on its size: search 1,200, holdout 400" in (
        shown("embedding"))


def test_the_two_attention_products_of_a_layer_have_a_name_each() -> None:
    from calib_helpers import tiny_model

    from calibkit.evaluate.layers import find_layers
    from calibkit.names import CONTEXT, SCORES, attention_products

    model = tiny_model()
    assert attention_products(model) == {"scores": SCORES, "context": CONTEXT}  # weights' MatMuls are neither
    legacy = {"proj": "/bert/layer.0/attention/self/query/MatMul", "scores": "/bert/layer.0/attention/self/MatMul",
              "context": "/bert/layer.0/attention/self/MatMul_1"}
    for node in model.graph.node:
        node.name = legacy.get(node.name, node.name)
    labels = {spec.label for spec in find_layers(model)}
    assert "bert.layer.0.attention.self: attention scores QK^T (/bert/layer.0/attention/self/MatMul)" in labels
    assert "bert.layer.0.attention.self: attention context PV (/bert/layer.0/attention/self/MatMul_1)" in labels
    assert "bert.layer.0.attention.self.query (/bert/layer.0/attention/self/query/MatMul)" in labels


def test_an_embedders_report_says_its_neighbour_index_is_the_texts_it_measured() -> None:
    from calibkit.report.content import _fidelity_rows
    from calibkit.results.runs import Fidelity

    rows = dict((name, why) for name, _, why in _fidelity_rows("embedding", Fidelity(0.9, 0.99, 0.9), 823))
    assert "the FP32 index is those 823 texts, so the value depends on its size" in rows["same nearest neighbour"]
