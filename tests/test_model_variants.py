"""Models exported the ways users export them, through the CLI: outputs in another order, weights in an
external-data file, FP16 or already-quantized exports (refused with what to do)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from calib_helpers import WORDS, texts, tiny_model, write_tokenizer
from onnx import TensorProto, helper
from typer.testing import CliRunner

from calibkit.cli import app
from calibkit.data.calibset import write_calibration_set


def _run(*args: object):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, [str(a) for a in args])


def _folder(root: Path, model: onnx.ModelProto, external: bool = False) -> Path:
    folder = root / "model"
    folder.mkdir(parents=True)
    write_tokenizer(folder)
    if external:
        onnx.save(model, str(folder / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                  location="model.onnx.data", size_threshold=0)
    else:
        onnx.save(model, str(folder / "model.onnx"))
    return folder


def _eval(root: Path, n: int = 60) -> Path:
    import random

    rng = random.Random(4)
    path = root / "eval.jsonl"
    rows = [{"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))),
             "label": rng.choice(["negative", "positive"])} for _ in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _workflow(root: Path, folder: Path, monkeypatch: pytest.MonkeyPatch, tune: bool = True) -> None:
    monkeypatch.setenv("CALIBKIT_CACHE", str(root / "cache"))
    cset = write_calibration_set(root / "set", texts(30, seed=5), None, {})
    ev = _eval(root)
    r = _run("calibrate", folder, "-c", cset.path, "--out", root / "cal")
    assert r.exit_code == 0, r.output
    for p, extra in (("fp32", []), ("int8", ["--calibration", root / "cal", "--target", "tensorrt"])):
        r = _run("build", folder, "-p", p, *extra, "-o", root / "e" / f"{p}.onnx")
        assert r.exit_code == 0, r.output
    r = _run("compare", root / "e" / "fp32.onnx", root / "e" / "int8.onnx", "-e", ev, "--json", root / "c.json",
             "--no-report", "--workers", "2", "--sensitivity-samples", "20", "--sensitivity-layers", "2")
    assert r.exit_code == 0, r.output
    doc = json.loads((root / "c.json").read_text())
    assert doc["task"]["output"] == "logits" and doc["sensitivity_samples"] == 20
    if tune:
        r = _run("tune", folder, "-c", cset.path, "-e", ev, "--out", root / "tune", "--no-report", "--workers", "2",
                 "--method", "minmax", "--max-evaluations", "3")
        assert r.exit_code == 0, r.output


def test_logits_after_another_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An export whose first output is a hidden state: compare's sensitivity and tune read the logits."""
    m = tiny_model()
    m.graph.output.insert(0, helper.make_tensor_value_info("O", TensorProto.FLOAT, ["batch", "seq", 8]))
    _workflow(tmp_path, _folder(tmp_path, m), monkeypatch)


def test_weights_in_an_external_data_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """model.onnx + model.onnx.data: the sensitivity workers get the weights too."""
    folder = _folder(tmp_path, tiny_model(), external=True)
    assert (folder / "model.onnx.data").is_file()
    _workflow(tmp_path, folder, monkeypatch, tune=False)


def _fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    return convert_float_to_float16(model, keep_io_types=True)


def _dynamic_int8(model: onnx.ModelProto, root: Path) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src, dst = root / "src.onnx", root / "dyn.onnx"
    onnx.save(model, str(src))
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
    return onnx.load(str(dst))


@pytest.mark.parametrize("kind, needle", [("fp16", "FP16/BF16 weights"), ("quantized", "already quantized")])
def test_fp16_and_quantized_exports_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str,
                                               needle: str) -> None:
    """Both used to pass calibrate and build with exit 0 and write a model ONNX Runtime cannot load."""
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    model = _fp16(tiny_model()) if kind == "fp16" else _dynamic_int8(tiny_model(), tmp_path)
    folder = _folder(tmp_path, model)
    cset = write_calibration_set(tmp_path / "set", texts(20, seed=5), None, {})
    ev = _eval(tmp_path)
    for args in (["calibrate", folder, "-c", cset.path, "--out", tmp_path / "cal"],
                 ["smooth", folder, "-c", cset.path, "--out", tmp_path / "sm"],
                 ["tune", folder, "-c", cset.path, "-e", ev, "--out", tmp_path / "tune"],
                 ["build", folder, "-p", "fp16", "-o", tmp_path / "e" / "fp16.onnx"],
                 ["build", folder, "-p", "fp32", "-o", tmp_path / "e" / "fp32.onnx"]):
        r = _run(*args)
        text = " ".join(r.output.split())
        assert r.exit_code == 4, (args, r.output)
        assert needle in text and "hint:" in text and "Traceback" not in text
    assert not (tmp_path / "e").exists() or not any((tmp_path / "e").iterdir())
    assert not (tmp_path / "cal").exists() and not (tmp_path / "sm").exists()
