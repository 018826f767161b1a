import numpy as np
import onnx
import pytest
from calib_helpers import texts, write_model_dir

from calibkit.calibrate.pipeline import calibrate
from calibkit.calibrate.stats import StatsStore
from calibkit.calibrate.trtcache import read_cache, write_cache
from calibkit.data.calibset import write_calibration_set
from calibkit.data.modeldir import ModelDir
from calibkit.engines.base import BaseRunner
from calibkit.errors import CalibrationError
from calibkit.quantize.tablefile import load_calibration_json
from calibkit.requests.calibrate import CalibrateRequest
from calibkit.resources import Resources
from calibkit.types import INT8_MAX, Method, MethodParams


@pytest.fixture()
def setup(tmp_path, monkeypatch):
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    md = ModelDir.resolve(write_model_dir(tmp_path / "model", zero_branch=True))
    cset = write_calibration_set(tmp_path / "set", texts(30, seed=7) + [" ".join(["good"] * 40)], None)
    calls = {"n": 0}
    orig = BaseRunner.infer

    def counting(self, feeds):
        calls["n"] += 1
        return orig(self, feeds)

    monkeypatch.setattr(BaseRunner, "infer", counting)
    return md, cset, calls, tmp_path


def test_second_method_reuses_statistics(setup):
    md, cset, calls, tmp = setup
    r1 = calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method.ENTROPY, out=tmp / "out-e",
                                    batch_size=8, exclude=["classifier"]))
    assert calls["n"] > 0 and not r1.reused_stats
    assert "pooled" not in r1.table.amax()
    before = calls["n"]
    r2 = calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method.MINMAX, out=tmp / "out-m",
                                    batch_size=8))
    assert r2.reused_stats and calls["n"] == before  # the model did not run again, though fewer nodes are excluded
    assert "pooled" in r2.table.amax()
    # an extra exclusion needs a subset of the tensors: still reused
    r3 = calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method.PERCENTILE, out=tmp / "out-p",
                                    exclude=["context"]))
    assert r3.reused_stats and calls["n"] == before
    # minmax amax is the exact max |x| from the saved statistics
    store = StatsStore.load(r2.stats_path)
    for r in r2.table.ranges:
        assert r.amax == pytest.approx(store[r.tensor].absmax)


def test_statistics_of_another_encoding_are_not_reused(setup):
    """The same model and set, encoded with another truncation length or vocabulary, are other token sequences."""
    import json
    from dataclasses import replace

    md, cset, calls, tmp = setup
    calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method.MINMAX, out=tmp / "long", batch_size=8))
    shorter = replace(md, max_length=8, max_length_source="test")
    before = calls["n"]
    short = calibrate(CalibrateRequest(model=shorter, calibration_set=cset, method=Method.MINMAX, out=tmp / "short",
                                       batch_size=8))
    assert not short.reused_stats and calls["n"] > before
    short_doc = load_calibration_json(tmp / "short").document
    assert short_doc is not None and short_doc.calibration_set is not None
    assert short_doc.calibration_set.max_length == 8
    again = calibrate(CalibrateRequest(model=shorter, calibration_set=cset, method=Method.MINMAX,
                                       out=tmp / "short-again", batch_size=8))
    assert again.reused_stats  # same encoding: reused
    tok_files = [f for f in md.tokenizer_path.iterdir() if f.name.startswith("tokenizer")]
    assert tok_files
    cfg = next((f for f in tok_files if f.name == "tokenizer_config.json"), None)
    if cfg is not None:
        doc = json.loads(cfg.read_text())
        doc["calibkit_test_marker"] = 1
        cfg.write_text(json.dumps(doc))
    else:
        tok_files[0].write_bytes(tok_files[0].read_bytes() + b" ")
    changed = calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method.MINMAX,
                                         out=tmp / "changed-tokenizer", batch_size=8))
    assert not changed.reused_stats


def test_outputs_and_calibration_json(setup):
    md, cset, _, tmp = setup
    res = calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method.MSE, num_bins=1024, out=tmp / "out"))
    for p in (res.model_path, res.cache_path, res.json_path, res.stats_path):
        assert p.is_file()
    onnx.checker.check_model(onnx.load(str(res.model_path)))
    cf = load_calibration_json(tmp / "out")
    assert cf.table.method is Method.MSE and cf.table.params.num_bins == 1024
    assert cf.table.model_sha256 == res.table.model_sha256 and cf.table.calibration_set_id == cset.id
    assert set(cf.quantized_nodes) == set(res.quantized_nodes) and "proj" in cf.quantized_nodes
    assert cf.tensors["E"].count and cf.tensors["E"].p99_99 is not None
    assert cf.document is not None and cf.document.calibration_set is not None
    assert cf.document.calibration_set.truncated == 1
    assert cf.table.provenance["onnx_version"] and cf.table.provenance["calibration_set_manifest_sha256"]
    assert cf.file("model") == res.model_path
    # all-zero tensor: amax 0, cache writes 0, node kept FP32
    assert cf.table.get("Z").amax == 0.0
    assert "zero_use" in res.kept_nodes and "Z" in res.zero_ranges
    cache = read_cache(res.cache_path)
    assert cache.algorithm == "LegacyCalibration" and "Z" in cache.zero
    for r in res.table.ranges:
        assert cache.scales[r.tensor] == pytest.approx(r.amax / INT8_MAX, rel=1e-6)
    assert any("truncated" in w for w in res.warnings)


def test_one_sample_set(setup):
    md, _, _, tmp = setup
    one = write_calibration_set(tmp / "one", ["good movie"], None)
    res = calibrate(CalibrateRequest(model=md, calibration_set=one, method=Method.ENTROPY, out=tmp / "one-out"))
    assert any("single text" in w for w in res.warnings)
    assert all(np.isfinite(r.amax) for r in res.table.ranges)


def test_from_cache_round_trip_and_unknown_names(setup):
    md, cset, _, tmp = setup
    res = calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method.ENTROPY, out=tmp / "out"))
    text = res.cache_path.read_text()
    text += "ONNXTRT_Broadcast_191_output: 3b047011\n(Unnamed Layer* 64) [Shuffle]_output: 3c010204\nlog: 7f800000\n"
    (tmp / "ext.cache").write_text(text)
    fc = calibrate(CalibrateRequest(model=md, from_cache=tmp / "ext.cache", out=tmp / "from"))
    assert set(fc.unmatched_cache_names) == {"ONNXTRT_Broadcast_191_output", "(Unnamed Layer* 64) [Shuffle]_output",
                                             "log"}
    assert set(fc.quantized_nodes) == set(res.quantized_nodes)
    for r in res.table.ranges:
        assert fc.table.get(r.tensor).amax == pytest.approx(r.amax, rel=1e-6)
    cf = load_calibration_json(fc.json_path)
    assert cf.document is not None and cf.document.trt_cache is not None
    assert cf.document.trt_cache.non_finite == ("log",) and cf.document.statistics is None


def test_from_cache_that_matches_nothing_is_refused(setup):
    # it used to write a model with "0 nodes quantized" and exit 0
    md, _, _, tmp = setup
    with pytest.raises(CalibrationError, match="none of its 140 entries"):
        calibrate(CalibrateRequest(model=md,
                                   from_cache="/work/shared/fixtures/trt-caches/radioml-transformer-entropy2.cache",
                                   out=tmp / "fx"))
    assert not (tmp / "fx").exists()


def test_failure_leaves_nothing_behind(setup, monkeypatch):
    md, cset, _, tmp = setup
    import calibkit.calibrate.pipeline as pl

    def boom(*a, **k):
        raise CalibrationError("boom")

    monkeypatch.setattr(pl, "write_calibration_json", boom)
    with pytest.raises(CalibrationError):
        calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method.ENTROPY, out=tmp / "never"))
    assert not (tmp / "never").exists()
    assert not [p for p in tmp.iterdir() if p.name.startswith(".never")]


def test_no_quantizable_ops(setup):
    md, cset, _, tmp = setup
    with pytest.raises(CalibrationError, match="no activation inputs"):
        calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method.ENTROPY, out=tmp / "x",
                                   op_types=["Conv"]))


def test_table_cache_consistency_for_every_method(setup):
    md, cset, _, tmp = setup
    amax = {}
    for m in Method:
        res = calibrate(CalibrateRequest(model=md, calibration_set=cset, method=m, out=tmp / f"o-{m.value}"))
        amax[m] = res.table.amax()
        write_cache(tmp / "c.cache", res.table)
    # entropy / percentile / mse never exceed minmax
    for m in (Method.ENTROPY, Method.PERCENTILE, Method.MSE):
        for t, a in amax[m].items():
            assert a <= amax[Method.MINMAX][t] + 1e-6


def test_written_model_is_exactly_the_serialized_model(tmp_path):
    """save_model encodes the initializers itself (raw data written from its buffer): the file must hold the
    bytes protobuf's own serialization gives, for every kind of initializer."""
    from onnx import helper, numpy_helper

    from calibkit.quantize.qdq import save_model

    model = onnx.load(write_model_dir(tmp_path / "m") / "model.onnx")
    g = model.graph
    g.initializer.append(helper.make_tensor("typed", onnx.TensorProto.FLOAT, [2], [1.5, -2.0]))  # float_data
    g.initializer.append(numpy_helper.from_array(np.zeros((0, 3), np.float32), "empty"))
    g.initializer.append(numpy_helper.from_array(np.array(3, np.int64), "scalar"))
    doc = numpy_helper.from_array(np.ones(4, np.float32), "with_doc")
    doc.doc_string = "a field the fast path does not write"
    g.initializer.append(doc)
    model.metadata_props.add(key="k", value="v")
    g.doc_string = "graph doc"
    save_model(model, tmp_path / "out.onnx")
    assert (tmp_path / "out.onnx").read_bytes() == model.SerializeToString()


def test_load_hashed_equals_separate_hash_and_load(tmp_path):
    from calibkit._io import sha256_file
    from calibkit.calibrate.pipeline import load_hashed
    from calibkit.errors import ModelError

    path = write_model_dir(tmp_path / "m") / "model.onnx"
    proto, sha, data = load_hashed(path)
    assert sha == sha256_file(path) and data == [path.read_bytes()]
    assert proto == onnx.load(str(path))
    ext = tmp_path / "ext" / "model.onnx"
    ext.parent.mkdir()
    onnx.save_model(onnx.load(str(path)), str(ext), save_as_external_data=True, size_threshold=0,
                    location="weights.bin")
    proto2, sha2, data2 = load_hashed(ext)
    # the file alone is not the model: its identity covers the weights beside it (the same as model_sha256's)
    from calibkit.graph import model_sha256

    assert data2 == [] and sha2 == model_sha256(ext) != sha256_file(ext)
    assert model_sha256(path) == sha256_file(path)  # without external data: the file's sha256, as always
    assert proto2 == onnx.load(str(ext))
    with pytest.raises(ModelError):
        load_hashed(tmp_path / "missing.onnx")


def test_model_is_read_again_after_statistics_and_a_changed_file_is_refused(setup):
    """While ONNX Runtime runs the model, calibrate keeps only a weightless copy and reads the file again for the
    Q/DQ step: the output equals the one made from statistics reused from the cache, and a file rewritten in
    between is refused, never quantized from other weights than the statistics came from."""
    from calibkit.errors import ModelError
    from calibkit.progress import ProgressEvent

    md, cset, _, tmp = setup
    fresh = calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method.MSE, out=tmp / "fresh",
                                       use_cache=False))
    reused = calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method.MSE, out=tmp / "reused"))
    assert reused.reused_stats and not fresh.reused_stats
    assert fresh.model_path.read_bytes() == reused.model_path.read_bytes()

    original = md.onnx_path.read_bytes()

    def rewrite(event: ProgressEvent) -> None:
        if event.task == "statistics" and event.done == 1:
            m = onnx.load_from_string(original)
            m.doc_string = "re-exported"
            md.onnx_path.write_bytes(m.SerializeToString())

    with pytest.raises(ModelError, match="changed while it was being calibrated"):
        calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method.MSE, out=tmp / "changed",
                                   use_cache=False), Resources(progress=rewrite))
    assert not (tmp / "changed" / "model.int8.onnx").exists()


def test_texts_edited_after_the_manifest_are_flagged(tmp_path, caplog):
    import logging

    from calibkit.data.calibset import load_calibration_set

    cset = write_calibration_set(tmp_path / "set", texts(12, seed=1), None)
    assert not load_calibration_set(cset.path).manifest.stale
    lines = (cset.path / "texts.jsonl").read_text().splitlines()
    (cset.path / "texts.jsonl").write_text("\n".join(lines[:5]) + "\n")
    with caplog.at_level(logging.WARNING, logger="calibkit.data"):
        edited = load_calibration_set(cset.path)
    assert len(edited.texts) == 5 and edited.manifest.stale is True
    assert "was changed after manifest.json was written (5 texts, the manifest describes 12)" in caplog.text


def test_the_tapped_runner_comes_from_the_resources_factory(tmp_path, monkeypatch):
    """calibrate makes its runner only through ``Resources.runner_factory`` (the engine registry by default)."""
    from calibkit.enginefiles.registry import model_runner

    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    md = ModelDir.resolve(write_model_dir(tmp_path / "model"))
    cset = write_calibration_set(tmp_path / "set", texts(12), None)
    made = []

    def factory(model, **kw):
        made.append(kw.get("name"))
        return model_runner(model, **kw)

    res = calibrate(CalibrateRequest(model=md, calibration_set=cset, method=Method.MINMAX,
                                     out=tmp_path / "out"), Resources(runner_factory=factory))
    assert made == ["calibration-taps"]
    assert res.model_path.is_file() and not res.reused_stats


def test_histogram_of_a_calibration_through_the_public_api(tmp_path, monkeypatch):
    import calibkit as ck
    from calibkit.calibrate.methods import compute_amax
    from calibkit.errors import UsageError

    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    md = ModelDir.resolve(write_model_dir(tmp_path / "model"))
    cset = write_calibration_set(tmp_path / "set", texts(12), None)
    res = ck.calibrate(md, cset, tmp_path / "out", method="percentile", percentile=99.0)
    first = res.table.ranges[0].tensor
    h = ck.histogram(res)
    assert h.tensor == first and h.counts.sum() == h.count > 0 and len(h.centres) == len(h.counts)
    stats = StatsStore.load(res.stats_path)[first]
    assert h.amax[Method.PERCENTILE] == compute_amax(stats, Method.PERCENTILE, MethodParams(percentile=99.0))
    assert h.amax[Method.PERCENTILE] == res.table.amax()[first]
    last = res.table.ranges[-1].tensor
    assert ck.histogram(tmp_path / "out", last).tensor == last  # a folder, an exact name
    assert ck.histogram(res.stats_path, last[-6:]).tensor in {r.tensor for r in res.table.ranges}
    with pytest.raises(UsageError, match="is or contains"):
        ck.histogram(res, "no-such-tensor")


def test_gather_stats_reads_executor_budget_and_progress_from_resources_alone(tmp_path, monkeypatch):
    """gather_stats took ``progress``, ``budget`` and ``executor`` beside ``resources``, each None meaning "the
    resources' own" (``executor=None`` was no "no executor"); the run's Resources is now the one place they come
    from, and a caller that wants others passes a replaced copy."""
    import inspect

    from calibkit.calibrate.pipeline import gather_stats
    from calibkit.data.encode import TokenBudget
    from calibkit.graph import load_model
    from calibkit.quantize.placement import DEFAULT_OP_TYPES, plan_placement

    params = inspect.signature(gather_stats).parameters
    assert not {"progress", "budget", "executor"} & set(params)
    assert params["resources"].default is inspect.Parameter.empty  # no hidden default run
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    md = ModelDir.resolve(write_model_dir(tmp_path / "model"))
    cset = write_calibration_set(tmp_path / "set", texts(12), None)
    proto = load_model(md.onnx_path)
    tensors = list(plan_placement(proto, DEFAULT_OP_TYPES).activations)
    heard = []
    resources = Resources(budget=TokenBudget(max_batch_tokens=64, memory_bytes=1 << 20), progress=heard.append)
    store, reused = gather_stats(md, cset, tensors, model_sha256="x" * 64, num_bins=2048, batch_size=8,
                                 resources=resources, model=proto, use_cache=False)
    assert not reused and store.meta["max_batch_tokens"] == 64 and store.meta["memory_budget_bytes"] == 1 << 20
    assert heard and heard[-1].done == heard[-1].total
    _, again = gather_stats(md, cset, tensors, model_sha256="x" * 64, num_bins=2048, batch_size=8,
                            resources=Resources(), model=proto)
    assert again  # the same statistics, whatever the budget: from the cache
