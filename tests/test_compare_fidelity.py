"""compare's per-layer sensitivity without labels: on fidelity to the reference for every task with a per-text
fidelity (an embedder judged by nearest-neighbour agreement and cosine, a classifier on an unlabeled eval set or
on traffic judged by flips, a token classifier by per-token agreement), and the verdict that says "not measured"
instead of "no layer needs higher precision" when nothing measured it. Tiny hand-built ONNX models (word-level
tokenizer, Gather/MatMul/Relu), so the whole file runs in seconds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_compare_tiny import WORDS, build_engines, make_texts, make_tokenizer, ort_run

from calibkit.data.evalset import load_eval_set
from calibkit.data.tokenizer import TextTokenizer
from calibkit.enginefiles.artifact import EngineArtifact
from calibkit.evaluate.compare import compare_engines
from calibkit.graph import add_outputs, model_sha256
from calibkit.quantize.qdq import Target, quantize_model, save_model
from calibkit.requests.compare import CompareRequest
from calibkit.resources import Resources
from calibkit.results.codec import parse_result, to_document
from calibkit.results.flags import Flag
from calibkit.types import Backend, CalibrationTable, Method, MethodParams, Precision, TensorRange

H = 8
OPTS = {"batch_size": 16, "sensitivity_samples": 80, "layer_samples": 80, "traffic": None}
ONE_WORKER = Resources(workers=1)


def _net(head: np.ndarray, output: str, out_shape: list) -> onnx.ModelProto:
    """ids -> Gather(E) -> MatMul(W1) -> Relu -> MatMul(head) -> ``output`` (one vector per token). Word i's
    embedding has a large value in dimension i % H, so every word lands somewhere else; "awful" carries an
    outlier that a tight range on ``emb`` cuts."""
    rng = np.random.default_rng(3)
    vocab = len(WORDS) + 4
    emb = (rng.standard_normal((vocab, H)) * 0.3).astype(np.float32)
    for i in range(vocab):
        emb[i, i % H] += 3.0
    emb[WORDS.index("awful") + 4, 1] = 40.0
    w1 = (np.eye(H) + rng.standard_normal((H, H)) * 0.2).astype(np.float32)
    inits = [numpy_helper.from_array(emb, "E"), numpy_helper.from_array(w1, "W1"),
             numpy_helper.from_array(head.astype(np.float32), "W2")]
    nodes = [helper.make_node("Gather", ["E", "input_ids"], ["emb"], name="embed"),
             helper.make_node("MatMul", ["emb", "W1"], ["h1"], name="fc1"),
             helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
             helper.make_node("MatMul", ["r1", "W2"], [output], name="head")]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("input_ids", TensorProto.INT64,
                                                                       ["batch", "seq"]),
                                          helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                                                        ["batch", "seq"])],
                          [helper.make_tensor_value_info(output, TensorProto.FLOAT, out_shape)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _engines(root: Path, model: onnx.ModelProto, config: dict, squeeze: float, *,
             shrunk: tuple[str, ...] = ("emb",), kept: tuple[str, ...] = ("r1",), method: Method = Method.MINMAX,
             texts: int = 120, calibration_texts: int = 60, seed: int = 7) -> dict[str, Path]:
    """FP32 and INT8 engines of ``model``: ranges (labelled ``method``) are the |max| over the first
    ``calibration_texts`` texts, those of ``shrunk`` multiplied by ``squeeze``; the eval set holds ``texts``."""
    tokdir = root / "model"
    make_tokenizer(tokdir)
    (tokdir / "config.json").write_text(json.dumps(config))
    src = tokdir / "model.onnx"
    save_model(model, src)
    texts_all, _ = make_texts(texts, seed=seed)
    enc = TextTokenizer(tokdir).encode(texts_all[:calibration_texts])
    names = [*shrunk, *kept]
    vals = ort_run(add_outputs(model, names), {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask},
                   names)
    amax = {t: float(np.abs(v).max()) * (squeeze if t in shrunk else 1.0) for t, v in zip(names, vals)}
    table = CalibrationTable("sha", "set", method, MethodParams(),
                             tuple(TensorRange(t, a, method) for t, a in amax.items()))
    cal = root / "calibration.json"
    cal.write_text(json.dumps(table.to_dict()))
    fp, int8 = root / "fp32.onnx", root / "int8.onnx"
    save_model(model, fp)
    save_model(quantize_model(model, table, target=Target.TENSORRT).model, int8)
    common = dict(backend=Backend.ONNXRUNTIME, source_model_sha256=model_sha256(src), tokenizer=str(tokdir),
                  source_model=str(src))
    EngineArtifact(path=fp, precision=Precision.FP32, **common).save()  # type: ignore[arg-type]
    EngineArtifact(path=int8, precision=Precision.INT8, calibration_json=str(cal), **common).save()  # type: ignore[arg-type]
    ev = root / "eval.jsonl"
    ev.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts_all))
    return {"fp": fp, "int8": int8, "eval": ev}


def _compare(e: dict[str, Path], **kw):  # type: ignore[no-untyped-def]
    request = CompareRequest(engine_a=EngineArtifact.load(e["fp"]), engine_b=EngineArtifact.load(e["int8"]),
                             eval_set=load_eval_set(e["eval"]), **{**OPTS, **kw})
    return compare_engines(request, ONE_WORKER)


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    head = np.random.default_rng(5).standard_normal((H, H))
    return _engines(tmp_path_factory.mktemp("emb"), _net(head, "last_hidden_state", ["batch", "seq", H]), {},
                    squeeze=0.05)


def _exhaustive(e: dict[str, Path], monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Both sensitivity variants of every layer (none settled by its cost alone), and the default run's result,
    whose flags must be the same."""
    import calibkit.evaluate.compare as cmp

    fast = _compare(e)
    with monkeypatch.context() as m:
        m.setattr(cmp, "cost_settles", lambda thresholds, task: None)
        res = _compare(e)
    assert [(v.node, v.flag) for v in fast.layers] == [(v.node, v.flag) for v in res.layers]
    return res, fast


def test_an_embedder_gets_per_layer_sensitivity_without_labels(embedder: dict[str, Path],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    res, fast = _exhaustive(embedder, monkeypatch)
    assert fast.layer("fc1").sensitivity.all_but_this.agreement is None  # its cost settled the keep
    assert res.task.kind == "embedding" and not res.eval_set.labelled
    ev = res.sensitivity
    assert ev is not None and ev.measured and ev.source == "eval set" and ev.samples == 80
    assert "nearest-neighbour agreement" in ev.basis and ev.all_int8_cosine is not None
    assert ev.all_int8_agreement is not None and ev.all_int8_agreement < 0.95  # the clipped range moves neighbours
    fc1 = res.layer("fc1")
    assert fc1 is not None and fc1.sensitivity is not None
    s = fc1.sensitivity
    assert s.all_but_this.accuracy is None and s.all_but_this.delta is None  # no labels: no accuracy
    assert s.flips_removed is not None and s.flips_removed.significant and s.flips_removed.estimate > 0
    assert s.cosine_recovered is not None and s.cosine_recovered.estimate > 0
    assert s.all_but_this.agreement == pytest.approx(ev.all_int8_agreement + s.flips_removed.estimate)
    assert fc1.flag is Flag.KEEP_FP16
    assert any("points of nearest-neighbour agreement" in r for r in fc1.reasons)
    assert "fc1" in res.keep_in_higher_precision and res.recommendation.measured
    assert "nearest-neighbour agreement" in res.recommendation.verdict
    assert not any("needs a labelled" in w for w in res.warnings)
    assert parse_result(to_document(res)) == res


@pytest.fixture(scope="module")
def tagger(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    head = np.random.default_rng(6).standard_normal((H, 3))
    cfg = {"id2label": {"0": "O", "1": "B-ENT", "2": "I-ENT"}}
    return _engines(tmp_path_factory.mktemp("tok"), _net(head, "logits", ["batch", "seq", 3]), cfg, squeeze=0.05)


def test_a_token_classifier_gets_sensitivity_on_per_token_agreement(tagger: dict[str, Path],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    res, _ = _exhaustive(tagger, monkeypatch)
    assert res.task.kind == "token-classification"
    ev = res.sensitivity
    assert ev is not None and ev.measured and "per-token agreement" in ev.basis
    assert ev.all_int8_agreement is not None and ev.all_int8_agreement < 1.0
    fc1 = res.layer("fc1")
    assert fc1 is not None and fc1.sensitivity is not None and fc1.sensitivity.flips_removed is not None
    assert fc1.sensitivity.flips_removed.estimate > 0 and fc1.sensitivity.agreement_cost is not None
    assert fc1.sensitivity.cosine_recovered is None  # cosine is the embedder's
    assert parse_result(to_document(res)) == res


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_engines(tmp_path_factory.mktemp("cls"), squeeze=0.05)


def test_a_classifier_on_an_unlabeled_eval_set_is_judged_on_flips(classifier: dict[str, Path], tmp_path: Path
                                                                  ) -> None:
    rows = [json.loads(x) for x in classifier["eval"].read_text().splitlines()]
    unl = tmp_path / "unlabeled.jsonl"
    unl.write_text("".join(json.dumps({"text": r["text"]}) + "\n" for r in rows))
    res = _compare({**classifier, "eval": unl})
    ev = res.sensitivity
    assert ev is not None and ev.measured and ev.reference_accuracy is None and "flips" in ev.basis
    fc1 = res.layer("fc1")
    assert fc1 is not None and fc1.sensitivity is not None and fc1.sensitivity.only_this_int8.accuracy is None
    assert fc1.sensitivity.flips_removed is not None


def test_a_classifier_with_traffic_runs_sensitivity_on_the_traffic(classifier: dict[str, Path],
                                                                   tmp_path: Path) -> None:
    import calibkit as ck

    rows = [json.loads(x) for x in classifier["eval"].read_text().splitlines()]
    unl = tmp_path / "unlabeled.jsonl"
    unl.write_text("".join(json.dumps({"text": r["text"]}) + "\n" for r in rows[:30]))
    texts, _ = make_texts(300, seed=29)
    log = tmp_path / "traffic.jsonl"
    log.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    res = ck.compare(classifier["fp"], classifier["int8"], unl, batch_size=16, traffic=log, traffic_size=150,
                     sensitivity_samples=100, workers=1)
    ev = res.sensitivity
    assert ev is not None and ev.measured and ev.source == "traffic" and ev.samples == 100
    assert res.subsets.sensitivity is None  # not rows of the eval set
    assert any(v.sensitivity is not None and v.sensitivity.flips_removed is not None for v in res.layers)


def test_without_sensitivity_the_verdict_says_not_measured(embedder: dict[str, Path], tmp_path: Path) -> None:
    res = _compare(embedder, sensitivity=False)
    rec = res.recommendation
    assert not rec.measured and rec.verdict.startswith(("not measured", "keep"))
    assert "no layer needs higher precision" not in rec.verdict
    assert res.sensitivity is not None and "--no-sensitivity" in res.sensitivity.why_not
    assert any("not measured" in w for w in res.warnings)
    doc = to_document(res)
    assert doc["recommendation"]["measured"] is False and "--no-sensitivity" in doc["sensitivity"]["why_not"]
    from calibkit.report.render import render_report

    out = render_report(res, tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert "Per-layer sensitivity: **not measured**" in md and "Verdict:" in md and out is not None
    assert "passed the thresholds" not in md


def test_the_cli_prints_the_verdict_and_na_never_nan(embedder: dict[str, Path]) -> None:
    from typer.testing import CliRunner

    from calibkit.cli import app

    r = CliRunner().invoke(app, ["compare", str(embedder["fp"]), str(embedder["int8"]), "-e",
                                 str(embedder["eval"]), "--no-sensitivity", "--no-report", "--batch-size", "16",
                                 "--layer-samples", "40"])
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    assert "nan" not in flat.lower().replace("nanosec", "")
    assert "mean KL n/a" in flat
    assert "no layer needs higher precision" not in flat
    assert "not measured" in flat


def test_regression_says_sensitivity_is_not_measured() -> None:
    from calibkit.evaluate.compare import sensitivity_texts
    from calibkit.tasks import choose_task

    task = choose_task({"logits": 2}, {"problem_type": "regression", "num_labels": 1}, "regression")
    request = CompareRequest(engine_a="a.onnx", engine_b="b.onnx", eval_set="e.jsonl", **OPTS)
    ev, why = sensitivity_texts(task, [], [], None, None, None, request)  # type: ignore[arg-type]
    assert ev is None and "not measured for regression models" in why


def _softmax_net() -> onnx.ModelProto:
    """Two attention-like Softmax outputs, each feeding a MatMul: a family of tensors one range rule clips."""
    rng = np.random.default_rng(4)
    vocab = len(WORDS) + 4
    inits = [numpy_helper.from_array((rng.standard_normal((vocab, H)) * 3).astype(np.float32), "E"),
             *(numpy_helper.from_array((rng.standard_normal((H, H)) * 2).astype(np.float32), f"W{i}")
               for i in (1, 2, 3))]
    nodes = [helper.make_node("Gather", ["E", "input_ids"], ["emb"], name="embed"),
             helper.make_node("Softmax", ["emb"], ["p1"], name="attn1", axis=-1),
             helper.make_node("MatMul", ["p1", "W1"], ["h1"], name="ctx1"),
             helper.make_node("Softmax", ["h1"], ["p2"], name="attn2", axis=-1),
             helper.make_node("MatMul", ["p2", "W2"], ["h2"], name="ctx2"),
             helper.make_node("MatMul", ["h2", "W3"], ["last_hidden_state"], name="out")]
    g = helper.make_graph(nodes, "softmaxes", [helper.make_tensor_value_info("input_ids", TensorProto.INT64,
                                                                             ["batch", "seq"]),
                                               helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                                                             ["batch", "seq"])],
                          [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                                         ["batch", "seq", H])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_flags_sharing_a_clipped_family_are_one_finding(tmp_path: Path) -> None:
    """Both Softmax outputs cut at a tenth of their values: compare reports one finding with the fix, typed,
    in the document and on the terminal (one line each when piped)."""
    engines = _engines(tmp_path, _softmax_net(), {}, 0.1, shrunk=("p1", "p2"), kept=("h2",),
                       method=Method.ENTROPY, texts=60, calibration_texts=60, seed=8)
    fp, int8, ev = engines["fp"], engines["int8"], engines["eval"]
    res = _compare({"fp": fp, "int8": int8, "eval": ev}, sensitivity=False)
    assert len(res.findings) == 1
    f = res.findings[0]
    assert f.cause == "clipping" and f.family == "attention Softmax outputs" and f.method == "entropy"
    assert set(f.tensors) == {"p1", "p2"} and set(f.nodes) >= {"ctx1", "ctx2"} and f.fix
    assert parse_result(to_document(res)) == res
    assert to_document(res)["findings"][0]["message"] == f.message
    from calibkit.report.render import render_report

    render_report(res, tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Findings (1)" in md and f.fix in md

    from typer.testing import CliRunner

    from calibkit.cli import app

    r = CliRunner().invoke(app, ["compare", str(fp), str(int8), "-e", str(ev), "--no-sensitivity", "--no-report",
                                 "--batch-size", "16"])
    assert r.exit_code == 0, r.output
    lines = [x for x in r.output.splitlines() if x.startswith("finding: ")]
    assert len(lines) == 1 and "attention Softmax outputs are clipped by entropy" in lines[0]


def test_paired_values_uses_mcnemar_for_0_1_and_a_bootstrap_for_the_rest() -> None:
    from calibkit.evaluate.sensitivity import PairedMeanDifference, paired_values

    a = np.r_[np.zeros(40), np.ones(160)]
    b = np.ones(200)
    d = paired_values(a, b)
    assert not isinstance(d, PairedMeanDifference) and d.b_only == 40 and d.significant
    cos = paired_values(np.ones(200), np.linspace(0.95, 1.0, 200))
    assert isinstance(cos, PairedMeanDifference)
    assert cos.interval.estimate == pytest.approx(-0.025) and cos.interval.high < 0 and cos.significant
    noisy = paired_values(np.full(20, 0.5), np.r_[np.full(10, 0.45), np.full(10, 0.56)])
    assert not noisy.significant and noisy.examples_to_settle() is not None


def test_recommend_says_no_layer_only_when_every_layer_is_settled() -> None:
    from calibkit.evaluate.decisions import recommend
    from calibkit.results.runs import (
        Difference,
        LayerSensitivity,
        LayerVerdict,
        SensitivityEvidence,
        SensitivityRun,
    )

    run = SensitivityRun(None, None, None, None)
    ev = SensitivityEvidence(True, task="classification", source="traffic", samples=400, basis="agreement",
                             all_int8_agreement=0.995)

    def verdict(low: float, high: float) -> LayerVerdict:
        # the flag comes from the same measurement the verdict reads: one decision per layer
        from calibkit.evidence.intervals import Interval, PairedDifference
        from calibkit.results.flags import Thresholds, flag_layer

        removed = PairedDifference(Interval(0.001, low, high), 0, 1, 400, 1.0)
        f = flag_layer(Thresholds(), sqnr_db=None, clipped_fraction=None, outlier_ratio=None, nonfinite=0,
                       fp_absmax=None, flips_removed=removed)
        d = Difference(0.001, low, high, 0, 1, 400, None, False, "not significant")
        return LayerVerdict(0, "n", "MatMul", "t", f.flag, f.reasons, sensitivity=LayerSensitivity(run, run, d))

    assert verdict(0.0, 0.002).flag is Flag.OK
    unsettled = verdict(0.0, 0.02)
    assert unsettled.flag is Flag.INSUFFICIENT and "upper bound reaches past 0.5" in unsettled.reasons[0]

    assert recommend([verdict(0.0, 0.002)], ev).verdict.startswith("no layer needs higher precision")
    assert recommend([verdict(0.0, 0.02)], ev).verdict.startswith("not settled")
    spread = recommend([verdict(0.0, 0.002)], SensitivityEvidence(True, task="embedding", source="traffic",
                                                                   samples=400, basis="b", all_int8_agreement=0.7))
    assert "70.0 % nearest-neighbour agreement" in spread.verdict and "spread" in spread.verdict
    off = recommend([verdict(0.0, 0.002)], SensitivityEvidence(False, "it was turned off (--no-sensitivity)"))
    assert off.verdict.startswith("not measured: it was turned off") and not off.measured
