import json
import subprocess
import sys

import pytest
from calib_helpers import texts, write_model_dir
from typer.testing import CliRunner

from calibkit.cli import app
from calibkit.data.calibset import write_calibration_set

FIXTURE = "/work/shared/fixtures/trt-caches/radioml-transformer-entropy2.cache"


@pytest.fixture()
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    model = write_model_dir(tmp_path / "model")
    write_calibration_set(tmp_path / "set", texts(20, seed=3), None)
    return tmp_path, model


def invoke(*args):
    return CliRunner().invoke(app, ["calibrate", *map(str, args)])


def test_calibrate_then_other_method_reuses_statistics(env):
    tmp, model = env
    r = invoke(model, "--calibration-set", tmp / "set", "--out", tmp / "o1")
    assert r.exit_code == 0, r.output
    assert (tmp / "o1" / "model.int8.onnx").is_file() and (tmp / "o1" / "calibration.cache").is_file()
    assert "statistics from 20 texts" in r.output and "calibrated with mse" in r.output
    r = invoke(model, "-c", tmp / "set", "--method", "minmax", "--out", tmp / "o2")
    assert r.exit_code == 0, r.output
    assert "reused cached statistics" in r.output
    doc = json.loads((tmp / "o2" / "calibration.json").read_text())
    assert doc["table"]["method"] == "minmax" and doc["statistics"]["reused"] is True


def test_percentile_and_onnx_file_with_tokenizer(env):
    tmp, model = env
    r = invoke(model / "model.onnx", "--tokenizer", model, "-c", tmp / "set", "--method", "percentile",
               "--percentile", "99.9", "--out", tmp / "p", "--target", "onnxruntime", "--op-types", "MatMul",
               "--op-types", "Gemm")
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp / "p" / "calibration.json").read_text())
    assert doc["table"]["params"]["percentile"] == 99.9 and doc["target"] == "onnxruntime"
    assert doc["op_types"] == ["MatMul", "Gemm"]


@pytest.mark.parametrize("args, code, text", [
    (["--method", "kl"], 2, "unknown --method"),
    (["--percentile", "101"], 2, "--percentile"),
    (["--num-bins", "1000"], 2, "power of two"),
    (["--exclude", "("], 2, "regular expression"),
    (["--target", "tflite"], 2, "--target"),
])
def test_bad_arguments(env, args, code, text):
    tmp, model = env
    r = invoke(model, "-c", tmp / "set", "--out", tmp / "bad", *args)
    assert r.exit_code == code
    assert text in r.output and "Traceback" not in r.output
    assert not (tmp / "bad").exists()


def test_missing_calibration_set_and_model(env):
    tmp, model = env
    r = invoke(model, "-c", tmp / "nope", "--out", tmp / "x")
    assert r.exit_code == 3 and "calibration set not found" in r.output
    r = invoke(model, "--out", tmp / "x")
    assert r.exit_code == 2 and "--calibration-set is required" in r.output
    r = invoke(tmp / "no-model", "-c", tmp / "set", "--out", tmp / "x")
    assert r.exit_code == 4
    assert not (tmp / "x").exists()


def test_from_real_cache_of_another_model_is_refused(env):
    # a cache naming none of the model's tensors once wrote a model with nothing quantized, exit 0
    tmp, model = env
    r = invoke(model, "--from-cache", FIXTURE, "--out", tmp / "fc")
    assert r.exit_code == 5, r.output
    assert "none of its 140 entries" in " ".join(r.output.split()) and not (tmp / "fc").exists()
    r = invoke(model, "--from-cache", tmp / "set" / "texts.jsonl", "--out", tmp / "fc2")
    assert r.exit_code == 5 and "not a TensorRT calibration cache" in r.output


def test_help_does_not_import_heavy_libraries():
    code = ("import sys; from typer.testing import CliRunner; from calibkit.cli import app; "
            "r = CliRunner().invoke(app, ['calibrate', '--help']); assert r.exit_code == 0, r.output; "
            "assert 'Examples' in r.output; "
            "bad = [m for m in ('onnxruntime', 'transformers', 'torch') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
