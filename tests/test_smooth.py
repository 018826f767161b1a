"""`calibkit smooth` (SmoothQuant): the smoothed model computes the original's function, its INT8 error falls on
activations with outlier channels, the per-channel statistics do not depend on the batches, and the folder is
refused rather than written when the function changed."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from typer.testing import CliRunner

from calibkit.calibrate.smoothing import SMOOTHING_FILE, channel_stats, smooth
from calibkit.cli import app
from calibkit.data.calibset import write_calibration_set
from calibkit.data.encode import TokenBudget
from calibkit.data.modeldir import ModelDir
from calibkit.errors import ModelError
from calibkit.quantize.smooth import (
    SMOOTH_SUFFIX,
    apply_smoothing,
    choose_scales,
    find_groups,
    product_error,
    smoothed_from,
    smoothing_scale,
)
from calibkit.requests.smooth import SmoothRequest
from tests.calib_helpers import texts, tiny_model, write_tokenizer


def _outlier_model() -> onnx.ModelProto:
    """The tiny calibration model with two embedding channels 25x larger than the rest."""
    m = tiny_model()
    for init in m.graph.initializer:
        if init.name == "emb":
            e = numpy_helper.to_array(init).copy()
            e[:, 2] *= 25.0
            e[:, 5] *= 15.0
            init.CopyFrom(numpy_helper.from_array(e, "emb"))
    return m


def _model_dir(folder: Path, model: onnx.ModelProto | None = None) -> ModelDir:
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model or _outlier_model(), str(folder / "model.onnx"))
    write_tokenizer(folder)
    return ModelDir.resolve(folder)


def _run(model: onnx.ModelProto, n: int = 24, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, 16, size=(n, 7)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[: n // 2, 5:] = 0
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]


def test_groups_are_the_weight_matmuls_and_gemms() -> None:
    groups = {g.tensor: g for g in find_groups(tiny_model())}
    # E -> proj, C -> out_proj, pooled -> classifier (Gemm); H·Ht and P·H read no weight
    assert set(groups) == {"E", "C", "pooled"}
    assert groups["pooled"].nodes == ("classifier",) and groups["E"].weights == ("W1",)


def test_smoothing_keeps_the_function_and_rewires_only_weight_readers() -> None:
    m = _outlier_model()
    groups = find_groups(m)
    absmax = {g.tensor: np.linspace(0.5, 30.0, 8).astype(np.float32) for g in groups}
    weights = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    choices = choose_scales(groups, weights, absmax, {}, alpha=0.8)
    assert len(choices) == 3 and all(c.scale is not None for c in choices)
    sm = apply_smoothing(m, groups, choices, metadata=json.dumps({"source_sha256": "abc"}))
    onnx.checker.check_model(sm)
    np.testing.assert_allclose(_run(sm), _run(m), rtol=1e-4, atol=1e-5)
    readers = {n.name: list(n.input) for n in sm.graph.node}
    assert readers["proj"][0] == "E" + SMOOTH_SUFFIX
    assert readers["classifier"][0] == "pooled" + SMOOTH_SUFFIX
    assert readers["scores"] == ["H", "Ht"]  # activation x activation: untouched
    assert smoothed_from(sm) == "abc" and smoothed_from(m) is None
    # the input model is not modified
    assert [n.input[0] for n in m.graph.node if n.name == "proj"] == ["E"]


def test_scale_migrates_outliers_and_auto_lowers_the_error() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 16)).astype(np.float32)
    x[:, 3] *= 40.0
    w = rng.normal(size=(16, 8)).astype(np.float32)
    amax = np.abs(x).max(axis=0)
    s1 = smoothing_scale(amax, [w], 1.0)
    assert np.abs(x / s1).max(axis=0).std() < 1e-3 * np.abs(x / s1).max()  # alpha 1: every channel the same max
    before = product_error(x, [w], None, amax)
    after = product_error(x, [w], s1, amax)
    assert after < before / 4
    from calibkit.quantize.smooth import SmoothGroup

    g = SmoothGroup("x", ("mm",), ("w",), (0,))
    (auto,) = choose_scales([g], {"w": w}, {"x": amax}, {"x": x}, alpha=None)
    assert auto.alpha is not None and auto.error_after <= after + 1e-12 and auto.gain_db > 6
    # without outliers nothing needs smoothing: auto leaves the tensor alone when no alpha helps
    flat = rng.uniform(-1, 1, size=(512, 16)).astype(np.float32)
    (none,) = choose_scales([g], {"w": np.ones((16, 8), np.float32)}, {"x": np.abs(flat).max(0)}, {"x": flat})
    assert none.scale is None or none.error_after < none.error_before


def test_channel_stats_do_not_depend_on_the_batches(tmp_path: Path) -> None:
    md = _model_dir(tmp_path / "m")
    proto = onnx.load(str(md.onnx_path))
    groups = find_groups(proto)
    ts = texts(60, seed=4, max_words=12)
    a = channel_stats(proto, groups, md, ts, batch_size=32)
    b = channel_stats(proto, groups, md, ts, batch_size=3, budget=TokenBudget(max_batch_tokens=20))
    for t in ("E", "C"):  # the tiny model's mean pooling counts padding: "pooled" depends on the batch
        np.testing.assert_array_equal(a.absmax[t], b.absmax[t])
        np.testing.assert_array_equal(a.rows[t], b.rows[t])
    assert a.rows["E"].shape[1] == 8 and len(a.rows["E"]) > 0
    # padding is not a token: the absmax is the real tokens' (a second computation, with numpy)
    emb = numpy_helper.to_array(next(i for i in proto.graph.initializer if i.name == "emb"))
    from calibkit.data.tokenizer import TextTokenizer

    ids = np.concatenate([np.array(e.ids) for e in TextTokenizer(md.tokenizer_path)._fast.encode_batch(ts)])
    np.testing.assert_allclose(a.absmax["E"], np.abs(emb[ids]).max(axis=0), rtol=1e-6)


def test_smooth_writes_an_equivalent_model_folder(tmp_path: Path) -> None:
    md = _model_dir(tmp_path / "m")
    cset = write_calibration_set(tmp_path / "set", texts(80, seed=1, max_words=12), None)
    res = smooth(SmoothRequest(model=md, calibration_set=cset, out=tmp_path / "smoothed"))
    assert res.max_deviation < 1e-4 and res.smoothed
    doc = json.loads((tmp_path / "smoothed" / SMOOTHING_FILE).read_text())
    assert doc["groups"] == 3 and doc["alpha"] == "auto"
    smd = ModelDir.resolve(tmp_path / "smoothed")
    sm = onnx.load(str(smd.onnx_path))
    np.testing.assert_allclose(_run(sm), _run(onnx.load(str(md.onnx_path))), rtol=1e-4, atol=1e-5)
    assert (tmp_path / "smoothed" / "tokenizer.json").is_file() and (tmp_path / "smoothed" / "config.json").is_file()
    with pytest.raises(ModelError, match="already smoothed"):
        smooth(SmoothRequest(model=smd, calibration_set=cset, out=tmp_path / "twice"))
    assert not (tmp_path / "twice").exists()


def test_a_changed_function_is_refused_and_nothing_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import calibkit.calibrate.smoothing as smoothing
    from calibkit.quantize import smooth as smooth_mod

    def broken(model, groups, choices, metadata=None, **_kw):  # type: ignore[no-untyped-def]
        bad = [replace(c, scale=None if c.scale is None else c.scale * 1.5) for c in choices]
        out = smooth_mod.apply_smoothing(model, groups, choices, metadata)
        # weights scaled by s, the activation divided by 1.5 s: no longer the same function
        wrong = smooth_mod.apply_smoothing(model, groups, bad, metadata)
        for init in out.graph.initializer:
            if init.name.endswith("_inv_scale"):
                init.CopyFrom(next(i for i in wrong.graph.initializer if i.name == init.name))
        return out

    monkeypatch.setattr(smoothing, "apply_smoothing", broken)
    md = _model_dir(tmp_path / "m")
    cset = write_calibration_set(tmp_path / "set", texts(40, seed=2), None)
    with pytest.raises(ModelError, match="differ from the original"):
        smooth(SmoothRequest(model=md, calibration_set=cset, out=tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_cli_smooth_then_build_and_compare_against_the_original(tmp_path: Path) -> None:
    md = _model_dir(tmp_path / "m")
    write_calibration_set(tmp_path / "set", texts(80, seed=1, max_words=12), None)
    r = CliRunner().invoke(app, ["smooth", str(md.onnx_path.parent), "-c", str(tmp_path / "set"),
                                 "--out", str(tmp_path / "sm")])
    assert r.exit_code == 0, r.output
    assert "smoothed 3 of 3" in r.output.replace("\n", " ") or "smoothed" in r.output
    bad = CliRunner().invoke(app, ["smooth", str(md.onnx_path.parent), "-c", str(tmp_path / "set"),
                                   "--out", str(tmp_path / "x"), "--alpha", "1.5"])
    assert bad.exit_code == 2 and "--alpha" in bad.output
    r = CliRunner().invoke(app, ["calibrate", str(tmp_path / "sm"), "-c", str(tmp_path / "set"),
                                 "--method", "minmax", "--out", str(tmp_path / "cal")])
    assert r.exit_code == 0, r.output
    for args in (["build", str(md.onnx_path.parent), "--precision", "fp32", "-o", str(tmp_path / "e" / "fp32.onnx")],
                 ["build", str(tmp_path / "sm"), "--precision", "int8", "--target", "tensorrt", "--calibration",
                  str(tmp_path / "cal" / "calibration.json"), "-o", str(tmp_path / "e" / "int8.onnx")]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, r.output
    side = json.loads((tmp_path / "e" / "int8.onnx.calibkit.json").read_text())
    from calibkit.graph import model_sha256

    assert side["extra"]["smoothed_from_sha256"] == model_sha256(md.onnx_path)
    ev = tmp_path / "ev.jsonl"
    ev.write_text("".join(json.dumps({"text": t, "label": "positive" if i % 2 else "negative"}) + "\n"
                          for i, t in enumerate(texts(40, seed=9))))
    r = CliRunner().invoke(app, ["compare", str(tmp_path / "e" / "fp32.onnx"), str(tmp_path / "e" / "int8.onnx"),
                                 "-e", str(ev), "--no-report", "--no-sensitivity", "--json",
                                 str(tmp_path / "cmp.json")])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "cmp.json").read_text())
    # every quantized layer has FP ranges: measured on the smoothed FP32 model, whose tensors INT8 quantizes
    assert doc["layers"] and all(x["fp_absmax"] is not None for x in doc["layers"])


def test_token_rows_layouts() -> None:
    from calibkit.calibrate.smoothing import _token_rows

    mask = np.array([[True, True, False], [True, False, False]])
    x3 = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    rows, grid = _token_rows(x3, mask, 4)
    assert rows.shape == (3, 4) and grid.tolist() == [[0, 0], [0, 1], [1, 0]]
    flat, grid2 = _token_rows(x3.reshape(6, 4), mask, 4)  # tokens flattened before the MatMul
    np.testing.assert_array_equal(flat, rows) and grid2.tolist() == grid.tolist()
    assert _token_rows(x3.reshape(2, 3, 2, 2), mask, 2) is None  # channels not last: left unsmoothed


def test_a_model_file_rewritten_during_the_statistics_is_refused(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import calibkit.calibrate.smoothing as smoothing

    md = _model_dir(tmp_path / "m")
    cset = write_calibration_set(tmp_path / "set", texts(30, seed=2), None)
    real = smoothing.channel_stats

    def rewriting(*a, **kw):  # type: ignore[no-untyped-def]
        out = real(*a, **kw)
        onnx.save(tiny_model(seed=5), str(md.onnx_path))  # another model under the same name
        return out

    monkeypatch.setattr(smoothing, "channel_stats", rewriting)
    with pytest.raises(ModelError, match="changed while smooth"):
        smooth(SmoothRequest(model=md, calibration_set=cset, out=tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_metadata_props_are_read_without_the_graph(tmp_path: Path) -> None:
    from calibkit.graph import metadata_props

    m = tiny_model()
    m.metadata_props.append(onnx.StringStringEntryProto(key="calibkit.smoothing", value='{"source_sha256": "ab"}'))
    m.metadata_props.append(onnx.StringStringEntryProto(key="other", value="x"))
    onnx.save(m, str(tmp_path / "m.onnx"))
    props = metadata_props(tmp_path / "m.onnx")
    assert props == {p.key: p.value for p in onnx.load(str(tmp_path / "m.onnx")).metadata_props}
    assert smoothed_from(props) == "ab"
    (tmp_path / "t.onnx").write_text("not a model, a text file\n")
    with pytest.raises(ModelError, match="cannot read ONNX model"):
        metadata_props(tmp_path / "t.onnx")
