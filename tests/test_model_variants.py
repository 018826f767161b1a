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
