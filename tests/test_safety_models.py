"""Silently broken models: unusable ranges are refused by name; build fp32 validates the ONNX file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from calib_helpers import texts, tiny_model, write_model_dir
from cli_helpers import flat, run

from calibkit.calibrate.trtcache import float_to_hex
from calibkit.data.calibset import write_calibration_set
from calibkit.quantize.rangecheck import problem


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("safety-models")
    mp = pytest.MonkeyPatch()
    mp.setenv("CALIBKIT_CACHE", str(tmp / "cache"))
    write_model_dir(tmp / "model")
    write_calibration_set(tmp / "set", texts(20, seed=3), None)
    r = run("calibrate", tmp / "model", "-c", tmp / "set", "--method", "minmax", "--out", tmp / "cal")
    mp.undo()
    assert r.exit_code == 0, r.output
    return tmp


def _edited_table(src: Path, dst: Path, amax: object) -> tuple[Path, str]:
    doc = json.loads((src / "calibration.json").read_text())
    rng = doc["table"]["ranges"][0]
    rng["amax"] = amax
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "calibration.json").write_text(json.dumps(doc))
    return dst / "calibration.json", rng["tensor"]


@pytest.mark.parametrize("amax", [1e300, 1e-300, -1.0, None, "NaN", 1e-42, 1e30, 3.4e38, 70000.0])
def test_unusable_amax_in_calibration_json_is_refused_by_name(calibrated: Path, tmp_path: Path, amax: object) -> None:
    # 1e300 once built an inf scale (accuracy 2 %), 1e-300 a 0.0 scale; a null/negative amax was dropped
    table, tensor = _edited_table(calibrated / "cal", tmp_path / "t", float("nan") if amax == "NaN" else amax)
    out = tmp_path / "int8.onnx"
    r = run("build", calibrated / "model", "--precision", "int8", "--calibration", table, "-o", out)
    assert r.exit_code == 5, r.output
    assert (tensor in flat(r) or "cannot read" in flat(r)) and "hint:" in r.output and not out.exists()


def test_implausible_amax_against_recorded_statistics_is_refused(calibrated: Path, tmp_path: Path) -> None:
    doc = json.loads((calibrated / "cal" / "calibration.json").read_text())
    tensor = doc["table"]["ranges"][0]["tensor"]
    absmax = doc["tensors"][tensor]["absmax"]
    table, _ = _edited_table(calibrated / "cal", tmp_path / "t", absmax * 1000)
    r = run("build", calibrated / "model", "--precision", "int8", "--calibration", table, "-o", tmp_path / "q.onnx")
    assert r.exit_code == 5 and "largest |x| recorded" in flat(r) and tensor in flat(r)


@pytest.mark.parametrize("scale", [float("nan"), 0.0, -0.5, float("inf")])
def test_a_qdq_model_with_an_unusable_scale_is_refused_by_build_qdq(calibrated: Path, tmp_path: Path,
                                                                    scale: float) -> None:
    # `build --qdq` copied a model.int8.onnx whose activation scale was edited to NaN, 0 or -0.5: exit 0
    from onnx import numpy_helper

    model = onnx.load(str(calibrated / "cal" / "model.int8.onnx"))
    q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear")
    init = next(i for i in model.graph.initializer if i.name == q.input[1])
    init.CopyFrom(numpy_helper.from_array(np.full(numpy_helper.to_array(init).shape, scale, np.float32), init.name))
    edited = tmp_path / "q" / "model.int8.onnx"
    edited.parent.mkdir()
    onnx.save(model, str(edited))
    out = tmp_path / "int8.onnx"
    r = run("build", calibrated / "model", "--precision", "int8", "--qdq", edited, "-o", out)
    assert r.exit_code == 4 and q.input[1] in flat(r) and "hint:" in r.output and not out.exists(), r.output
    assert run("build", calibrated / "model", "--precision", "int8", "--qdq", calibrated / "cal" / "model.int8.onnx",
               "-o", tmp_path / "as-written.onnx").exit_code == 0


def test_rangecheck_rules() -> None:
    assert problem("t", 0.0) is None  # an all-zero tensor: kept FP32, reported
    assert problem("t", 5.0, {"absmax": 5.0}) is None
    assert problem("t", 6.0, {"absmax": 0.0}) is None  # nothing recorded to compare with
    for bad in (float("inf"), float("nan"), -2.0, 1e-40, 1e6, True, "3"):
        assert problem("t", bad) is not None, bad
    assert problem("t", 1e-9, {"absmax": 10.0}) is not None
    assert problem("t", 1e5, {"absmax": 1.2e5}) is None  # measured: a real range above the FP16 maximum
    assert problem("t", 1e6, representable_only=True) is None  # the Q/DQ writer's guard
    assert problem("t", 1e300, representable_only=True) is not None


def _cache_with(calibrated: Path, tmp_path: Path, hex_value: str) -> tuple[Path, str]:
    lines = (calibrated / "cal" / "calibration.cache").read_text().splitlines()
    name, _, _ = lines[1].rpartition(": ")
    lines[1] = f"{name}: {hex_value}"
    p = tmp_path / "edited.cache"
    p.write_text("\n".join(lines) + "\n")
    return p, name


@pytest.mark.parametrize("scale", [1e-40, 1e30, float(np.finfo(np.float32).max), float("inf"), float("nan"), -0.5])
def test_unusable_scales_in_a_tensorrt_cache_are_refused(calibrated: Path, tmp_path: Path, scale: float) -> None:
    # denormal, 1e30 and float-max scales were accepted (63.5 % instead of 69 %); inf/nan were dropped silently
    cache, name = _cache_with(calibrated, tmp_path, float_to_hex(scale))
    out = tmp_path / "fc"
    r = run("calibrate", calibrated / "model", "--from-cache", cache, "--out", out)
    assert r.exit_code == 5, r.output
    assert name in flat(r) and not out.exists()


@pytest.mark.parametrize(("scale", "says"), [(float("inf"), "amax is infinite"), (-float("inf"), "amax is infinite"),
                                             (float("nan"), "amax is NaN")])
def test_a_non_finite_scale_is_reported_as_what_it_is(calibrated: Path, tmp_path: Path, scale: float,
                                                      says: str) -> None:
    """Fixed: an inf scale in a TensorRT cache was reported as NaN."""
    cache, name = _cache_with(calibrated, tmp_path, float_to_hex(scale))
    r = run("calibrate", calibrated / "model", "--from-cache", cache, "--out", tmp_path / "fc")
    assert r.exit_code == 5 and says in flat(r) and name in flat(r), r.output
    if says != "amax is NaN":
        assert "NaN" not in flat(r)


def test_a_zero_scale_in_a_cache_is_reported_by_name(calibrated: Path, tmp_path: Path) -> None:
    cache, name = _cache_with(calibrated, tmp_path, "0")
    r = run("calibrate", calibrated / "model", "--from-cache", cache, "--out", tmp_path / "fc")
    assert r.exit_code == 0, r.output
    assert "scale 0" in flat(r) and name in flat(r)


def test_build_fp32_refuses_a_text_file_named_model_onnx(tmp_path: Path) -> None:
    folder = write_model_dir(tmp_path / "m")
    (folder / "model.onnx").write_text("this is not a model\n")
    r = run("build", folder, "--precision", "fp32", "-o", tmp_path / "e.onnx")
    assert r.exit_code == 4 and "not an ONNX model" in flat(r) and not (tmp_path / "e.onnx").exists()


def _external(folder: Path) -> Path:
    model = tiny_model()
    onnx.save_model(model, str(folder / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=200)
    return folder


def test_build_fp32_carries_external_data_along(tmp_path: Path) -> None:
    folder = _external(write_model_dir(tmp_path / "m"))
    assert (folder / "model.onnx.data").is_file()
    out = tmp_path / "engines" / "fp32.onnx"
    r = run("build", folder, "--precision", "fp32", "-o", out)
    assert r.exit_code == 0, r.output
    ids = np.array([[2, 4, 5, 3]], np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    want = ort.InferenceSession(str(folder / "model.onnx")).run(None, feeds)[0]
    (folder / "model.onnx.data").unlink()  # the engine must not depend on the source's weights file
    got = ort.InferenceSession(str(out)).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_build_fp32_with_missing_external_data_is_a_model_error(tmp_path: Path) -> None:
    folder = _external(write_model_dir(tmp_path / "m"))
    (folder / "model.onnx.data").unlink()
    r = run("build", folder, "--precision", "fp32", "-o", tmp_path / "e.onnx")
    assert r.exit_code == 4 and "model.onnx.data" in flat(r)


def _relocate(folder: Path, location: str) -> None:
    m = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = location
    onnx.save(m, str(folder / "model.onnx"))


def _broken_external(tmp_path: Path, kind: str) -> tuple[Path, str]:
    """A model folder whose external-data weights are missing, named absolutely, outside it, or a symlink."""
    import shutil

    folder = _external(write_model_dir(tmp_path / "m"))
    data = folder / "model.onnx.data"
    if kind == "missing":
        data.unlink()
        return folder, "missing beside it"
    if kind == "absolute":
        shutil.move(data, tmp_path / "abs.data")
        _relocate(folder, str(tmp_path / "abs.data"))
        return folder, "absolute path"
    if kind == "outside":
        shutil.move(data, tmp_path / "out.data")
        _relocate(folder, "../out.data")
        return folder, "outside the model's folder"
    shutil.move(data, tmp_path / "real.data")
    data.symlink_to(tmp_path / "real.data")
    return folder, "symbolic link"


@pytest.mark.parametrize("kind", ["missing", "absolute", "outside", "symlink"])
@pytest.mark.parametrize("command", ["calibrate", "smooth", "build", "tune"])
def test_unusable_external_data_is_a_model_error_in_every_command(tmp_path: Path, kind: str, command: str) -> None:
    """Fixed: calibrate and smooth ended these with exit 1 (onnx's ValidationError); one check in
    graph.load_model / check_external_data now serves every command."""
    folder, says = _broken_external(tmp_path, kind)
    write_calibration_set(tmp_path / "set", texts(12, seed=3), None)
    (tmp_path / "eval.jsonl").write_text(json.dumps({"text": "good movie", "label": "positive"}) + "\n")
    out = tmp_path / "out"
    args: list[object] = {
        "calibrate": ["calibrate", folder, "-c", tmp_path / "set", "--out", out],
        "smooth": ["smooth", folder, "-c", tmp_path / "set", "--out", out],
        "build": ["build", folder, "-p", "fp32", "-o", out / "e.onnx"],
        "tune": ["tune", folder, "-c", tmp_path / "set", "-e", tmp_path / "eval.jsonl", "--out", out],
    }[command]
    r = run(*args)
    assert r.exit_code == 4, r.output
    assert says in flat(r) and "hint:" in r.output and "Traceback" not in r.output and not out.exists()
