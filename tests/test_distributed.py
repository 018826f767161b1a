"""Calibration, a sensitivity sweep and tune through a real local Dask cluster (2 worker processes, 1 thread
each): results equal the local ones; an interrupted distributed tune leaves the cluster clean and resumes
without redoing a finished evaluation; a dying worker loses only its unit."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import numpy as np
import pytest
from calib_helpers import texts, write_model_dir
from executor_units import die_once
from test_tune_pipeline import sensitive_folder
from typer.testing import CliRunner

from calibkit.calibrate.collect import collect_stats
from calibkit.calibrate.pipeline import calibrate
from calibkit.calibrate.sharded import collect_stats_sharded
from calibkit.calibrate.stats import StatsStore
from calibkit.cli import app
from calibkit.data.calibset import write_calibration_set
from calibkit.data.encode import bucketed_batches
from calibkit.data.evalset import load_eval_set
from calibkit.data.modeldir import ModelDir
from calibkit.data.tokenizer import TextTokenizer
from calibkit.engines.onnxruntime import OnnxRuntimeRunner
from calibkit.evaluate.boardjobs import run_board_unit
from calibkit.evaluate.predict import predict_logits
from calibkit.evaluate.sensitivity import analyse_sensitivity
from calibkit.evaluate.shipping import run_shipped_job
from calibkit.evaluate.tune import run_tune
from calibkit.executors import InProcessExecutor
from calibkit.requests.calibrate import CalibrateRequest
from calibkit.requests.tune import TuneRequest
from calibkit.resources import Resources
from calibkit.types import Method

pytest.importorskip("distributed")

TAPPED = ["E", "H", "Ht", "S", "S2", "P", "C", "O", "pooled"]


@pytest.fixture(scope="module")
def dask_ex():
    from calibkit.executors.dask import DaskExecutor

    with DaskExecutor(local_workers=2) as ex:
        yield ex


def assert_same_stats(a: StatsStore, b: StatsStore) -> None:
    assert list(a) == list(b)
    for t in a:
        x, y = a[t], b[t]
        assert (x.count, x.nan_count, x.posinf_count, x.neginf_count) == (y.count, y.nan_count, y.posinf_count,
                                                                          y.neginf_count), t
        assert x.min == y.min and x.max == y.max, t
        assert x.histogram.upper == y.histogram.upper, t
        assert np.array_equal(x.histogram.counts, y.histogram.counts), t


def test_sharded_statistics_are_bit_identical_to_one_process(tmp_path, dask_ex):
    folder = write_model_dir(tmp_path / "m")
    tok = TextTokenizer(folder)
    # long and short texts, so shards see different ranges and the merge has to widen histograms
    batches = bucketed_batches(tok, texts(120, seed=3, max_words=14), ["input_ids", "attention_mask"], batch_size=8)
    model = (folder / "model.onnx").read_bytes()
    single = collect_stats(model, batches, TAPPED, num_bins=512)
    for ex, shards in ((dask_ex, None), (dask_ex, 5), (InProcessExecutor(), 3)):
        merged = collect_stats_sharded(model, batches, TAPPED, ex, num_bins=512, shards=shards)
        assert_same_stats(single, merged)
        assert merged.meta["samples"] == single.meta["samples"] == 120
        assert merged.meta["padding_fraction"] == pytest.approx(single.meta["padding_fraction"])


def test_calibrate_through_dask_writes_the_same_outputs(tmp_path, monkeypatch, dask_ex):
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    md = ModelDir.resolve(write_model_dir(tmp_path / "model"))
    cset = write_calibration_set(tmp_path / "set", texts(60, seed=9), None)
    local = calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method.ENTROPY, out=tmp_path / "local",
                                       batch_size=8, use_cache=False))
    dist = calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method.ENTROPY, out=tmp_path / "dist",
                                      batch_size=8, use_cache=False), Resources(executor=dask_ex))
    assert_same_stats(StatsStore.load(local.stats_path), StatsStore.load(dist.stats_path))
    assert local.table.amax() == dist.table.amax()
    cache = "calibration.cache"
    assert (tmp_path / "local" / cache).read_bytes() == (tmp_path / "dist" / cache).read_bytes()


def test_calibrate_cli_executor_option(tmp_path, monkeypatch):
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    model = write_model_dir(tmp_path / "model")
    write_calibration_set(tmp_path / "set", texts(40, seed=2), None)
    runner = CliRunner()
    outs = []
    for name, extra in (("one", []), ("pool", ["--executor", "local:2"])):
        r = runner.invoke(app, ["calibrate", str(model), "-c", str(tmp_path / "set"), "-o", str(tmp_path / name),
                                "-b", "4", "--fresh-stats", *extra])
        assert r.exit_code == 0, r.output
        outs.append(json.loads((tmp_path / name / "calibration.json").read_text())["table"])
    assert outs[0]["ranges"] == outs[1]["ranges"]
    r = runner.invoke(app, ["calibrate", str(model), "-c", str(tmp_path / "set"), "-o", str(tmp_path / "bad"),
                            "--executor", "ray://h:1"])
    assert r.exit_code == 2 and "unknown --executor" in r.output


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    sensitive_folder(root, 300)
    return root


def test_sensitivity_sweep_through_dask_equals_local(tiny, tmp_path, monkeypatch, dask_ex):
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    md = ModelDir.resolve(tiny / "model")
    cal = calibrate(CalibrateRequest(model=md, calibration_set=tiny / "cset", method=Method.MINMAX,
                                     out=tmp_path / "cal", batch_size=16))
    ev = load_eval_set(tiny / "eval.jsonl").head(96)
    labels = [0 if lab == "negative" else 1 for lab in ev.labels]
    with OnnxRuntimeRunner(md.onnx_path) as r:
        ref = predict_logits(r, TextTokenizer(md.tokenizer_path), ev.texts)
    kw = dict(source_model=str(md.onnx_path), calibration_json=str(cal.json_path), tokenizer=str(md.tokenizer_path),
              texts=ev.texts, labels=labels, reference_logits=ref)
    nodes = ["fc1", "fc2", "classifier"]
    local = analyse_sensitivity(nodes, workers=1, **kw)
    dist = analyse_sensitivity(nodes, executor=dask_ex, **kw)
    assert local.all_int8.error is None and dist.all_int8.error is None
    assert local.all_int8.accuracy < local.reference_accuracy  # the outlier in fc1's input breaks plain INT8
    pairs = [(local.all_int8, dist.all_int8)]
    pairs += [(a.only_this, b.only_this) for a, b in zip(local.layers, dist.layers)]
    pairs += [(a.all_but_this, b.all_but_this) for a, b in zip(local.layers, dist.layers)]
    for a, b in pairs:
        assert (a.mode, a.node, a.accuracy, a.error) == (b.mode, b.node, b.accuracy, b.error)
        assert a.logit_mse == pytest.approx(b.logit_mse, rel=1e-6, abs=1e-12)
        assert a.mean_kl == pytest.approx(b.mean_kl, rel=1e-6, abs=1e-12)


def _cluster_idle(ex, seconds: float = 15.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(ex.client.processing().values()):
            return True
        time.sleep(0.1)
    return False


def test_interrupted_distributed_tune_resumes_without_redoing_evaluations(tiny, tmp_path, monkeypatch, dask_ex):
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    md = ModelDir.resolve(tiny / "model")
    ev = load_eval_set(tiny / "eval.jsonl")
    out = tmp_path / "tune"
    cfg = TuneRequest(model=md, calibration_set=tiny / "cset", eval_set=ev, out=out, max_drop=1.0,
                      sensitivity_samples=48, method="minmax", smooth=False, traffic=None)
    real_map = dask_ex.map
    ledger = out.parent / f".{out.name}.tune" / "ledger.jsonl"

    def interrupting_map(fn, items, *, task="work", progress=None, on_result=None):  # noqa: ANN001
        def record(i, r):  # noqa: ANN001
            if on_result is not None:
                on_result(i, r)
            # evaluations (one variant per job, or units of switchboard jobs), not statistics shards
            if fn in (run_shipped_job, run_board_unit) and ledger.is_file() and \
                    len(ledger.read_text().splitlines()) == 4:
                raise KeyboardInterrupt  # Ctrl-C on the driver after four finished evaluations
        return real_map(fn, items, task=task, progress=progress, on_result=record)

    monkeypatch.setattr(dask_ex, "map", interrupting_map)
    with pytest.raises(KeyboardInterrupt):
        run_tune(cfg, Resources(executor=dask_ex))
    monkeypatch.undo()
    assert _cluster_idle(dask_ex), "the interrupted run left tasks running on the cluster"
    first = [json.loads(line)["key"] for line in ledger.read_text().splitlines()]
    assert len(first) == 4 and not out.exists()

    res = run_tune(cfg, Resources(executor=dask_ex))
    assert res.met_target and res.kept_nodes == ("fc1",)
    assert res.resumed_evaluations == 4 and res.result.evaluations_reused >= 4
    keys = [json.loads(line)["key"] for line in ledger.read_text().splitlines()]
    assert keys[:4] == first and len(keys) == len(set(keys))  # no finished evaluation was run (appended) again
    local = run_tune(replace(cfg, out=tmp_path / "tune-local"), Resources(workers=1))
    assert local.kept_nodes == res.kept_nodes
    assert local.result.final.accuracy_search == res.result.final.accuracy_search


def test_tune_cli_executor_option(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    args = ["tune", str(tiny / "model"), "-c", str(tiny / "cset"), "-e", str(tiny / "eval.jsonl"), "--method",
            "minmax", "--max-drop", "1", "--sensitivity-samples", "48", "--no-report", "--no-smooth"]
    r = CliRunner().invoke(app, [*args, "--executor", "inline", "-o", str(tmp_path / "t")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "t" / "plan.json").read_text())["kept_nodes"] == ["fc1"]
    r = CliRunner().invoke(app, [*args, "--executor", "dask://nohost", "-o", str(tmp_path / "u")])
    assert r.exit_code == 2 and "needs a port" in r.output and not (tmp_path / "u").exists()


def test_dask_worker_death_loses_only_its_unit(tmp_path, dask_ex):
    """Twice in a row: the second death may take the last copy of a shared value with it (the restarted worker
    starts empty); the executor shares it again and resubmits."""
    for round_ in range(2):
        marker = tmp_path / f"died-{round_}"
        ref = dask_ex.share(bytes(10 + round_))
        assert dask_ex.map(die_once, [(i, str(marker), ref) for i in range(6)]) == [i + 10 + round_ for i in range(6)]
        assert marker.exists()
