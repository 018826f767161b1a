"""`calibkit demo run --fast` end to end on the fast demo assets."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest


@pytest.mark.slow
@pytest.mark.longest
def test_demo_workflow_fast(demo_assets_fast: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from calibkit.data.evalset import label_ids, load_eval_set
    from calibkit.data.modeldir import ModelDir
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.demo.prepare import PrepareOptions
    from calibkit.demo.workflow import WorkflowOptions, run_workflow
    from calibkit.engines.onnxruntime import EXACT_QDQ, OnnxRuntimeRunner
    from calibkit.evaluate.predict import predict_logits

    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    # the workflow's runs/ beside the cached assets are this test's own output: a run left by another calibkit
    # version (whose markers vouch for less) is not this run's to replace
    shutil.rmtree(demo_assets_fast / "runs", ignore_errors=True)
    # --fast's steps on smaller budgets (the suite's longest test: a floor of the suite's 2-core wall time):
    # sensitivity (compare's and tune's: tune's per-layer sensitivity of the embedder runs each of its 48 MatMuls
    # alone in INT8) on 16 texts, not 64, over compare's worst 3 layers, not 6; per-layer statistics on 32 texts,
    # not 128; a 64-text calibration set, not 128; 120 eval texts, not 400; 100 traffic texts for tune and
    # compare, not 200, and 200 for the embedder, not 300; 8 tune evaluations, not 12. Every step still runs, on
    # the same code paths; the checks below compare the workflow with itself, not with --fast's numbers.
    opts = WorkflowOptions.quick(workdir=demo_assets_fast, log_lines=PrepareOptions(fast=True).log_lines,
                                 reports_dir=tmp_path / "reports", calibration_sets_dir=tmp_path / "sets",
                                 workers=1, sensitivity_samples=16, tune_sensitivity_samples=16,
                                 sensitivity_layers=3, layer_samples=32, sample_size=64, eval_limit=120,
                                 traffic_size=100, compare_traffic_size=100, embedder_traffic_size=200,
                                 tune_max_evaluations=8)
    res = run_workflow(opts)
    s = res.summary
    assert res.index_html.is_file() and res.index_md.is_file()
    from calibkit.demo.workflow import SMOOTHED, calibrate_dir

    methods = {"entropy", "minmax", "percentile", "mse"}
    assert set(s["method_accuracy"]) == methods | {m + SMOOTHED for m in methods}
    # statistics were collected once per model (original, smoothed): every other method reused them
    assert sum(not r for r in s["statistics_reused"].values()) == 2
    assert s["smoothing"]["smoothed"] > 0 and s["smoothing"]["max_output_deviation"] < 1e-4
    # every link of the index page resolves
    html = res.index_html.read_text()
    for href in re.findall(r'href="([^"]+)"', html):
        assert (res.index_html.parent / href).resolve().is_file(), href
    # the last step deploys the tuned plan; the index links the repository's README
    assert "Triton model repository" in html and (res.index_html.parent / s["deploy"]["link"]).name == "README.md"
    assert (Path(s["deploy"]["repository"]) / s["deploy"]["name"] / "config.pbtxt").is_file()
    # the reported INT8 accuracy of the best method is what ONNX Runtime measures on that model
    md = ModelDir.resolve(demo_assets_fast / "model")
    from calibkit.evaluate.inputs import limit_eval_set

    ev, _ = limit_eval_set(load_eval_set(demo_assets_fast / "data" / "test.jsonl"), opts.eval_limit, opts.seed)
    y = label_ids(ev, md.id2label, 2)
    best = s["best_method"]
    # TensorRT layout: measured as exact Q/DQ arithmetic, what TensorRT computes (engines.onnxruntime)
    int8_path = demo_assets_fast / "runs" / calibrate_dir(best) / "model.int8.onnx"
    with OnnxRuntimeRunner(int8_path, optimization=EXACT_QDQ) as r:
        acc = float(np.mean(predict_logits(r, TextTokenizer(md.tokenizer_path), ev.texts).argmax(1) == y))
    assert s["method_accuracy"][best] == pytest.approx(acc)
    summary = json.loads((res.index_html.parent / "summary.json").read_text())
    assert summary["tune"]["int8_flops_fraction"] == pytest.approx(s["tune"]["int8_flops_fraction"])
    # one story: the compared INT8 engine is in the TensorRT layout; the best method is the most faithful one
    assert summary["int8_engine"]["layout"] == "tensorrt"
    # tune and deploy serve on ONNX Runtime: the layout tuned is the one shipped, and both say how fast it serves
    assert summary["tune"]["layout"] == "onnxruntime" and summary["deploy"]["layout"] == "onnxruntime"
    assert [b["batch_size"] for b in summary["tune"]["speed"]["at"]] == [1, 32]
    assert summary["deploy"]["speed"]["reference"] == "FP32" and summary["deploy"]["agreement_texts"] > 0
    fid = summary["method_fidelity"]
    assert best == min(fid, key=lambda m: (fid[m]["flips"], fid[m]["mean_kl"]))
    with OnnxRuntimeRunner(md.onnx_path) as r:
        ref = predict_logits(r, TextTokenizer(md.tokenizer_path), ev.texts).argmax(1)
    with OnnxRuntimeRunner(int8_path, optimization=EXACT_QDQ) as r:
        pred = predict_logits(r, TextTokenizer(md.tokenizer_path), ev.texts).argmax(1)
    assert fid[best]["flips"] == int((pred != ref).sum())
    # the embedder row: tuned from the log alone, judged on traffic texts the search never saw
    emb = summary["embedder"]
    assert emb["traffic_holdout"] > 0 and emb["min_cosine"] == 0.995 and emb["min_agreement_percent"] == 95.0
    assert 0.0 < emb["int8_flops_fraction"] <= 1.0 and emb["cosine_holdout"] > 0.9
    assert emb["agreement_holdout"] >= emb["all_int8_agreement_holdout"] - 0.05
    assert "sentence embedder" in res.index_md.read_text() and "compare-embedder/report.html" in html
    index = res.index_md.read_text()
    assert "agreement with FP32" in index and "flips" in index and "TensorRT Q/DQ layout" in index
    # the README generator accepts the summary the demo writes
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_measured", Path(__file__).resolve().parents[1] / "tools"
                                                  / "readme_measured.py")
    assert spec and spec.loader
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.summary_of(summary) == res.document  # the summary read back is the summary written
    assert "| what | result | command |" in tool.render_block(res.document)


def test_the_demos_compare_reads_compares_own_traffic_default_not_tunes() -> None:
    """tune's larger traffic evidence (10,500 texts by default) is tune's: the demo's compare draws what `calibkit
    compare --traffic auto` draws by itself; --fast sets its own small size for both."""
    from calibkit.demo.workflow import WorkflowOptions, _compare_traffic
    from calibkit.requests.compare import CompareRequest

    full = WorkflowOptions()
    assert full.traffic_size > CompareRequest(engine_a="a", engine_b="b").traffic_size
    assert _compare_traffic(full) == {}
    assert _compare_traffic(WorkflowOptions.quick()) == {"traffic_size": 200}
