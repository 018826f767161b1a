"""`calibkit compare` on the fast demo model: FP32 vs INT8 built by calibkit, accuracy checked against ONNX
Runtime + argmax run directly, one example at a time."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

pytestmark = pytest.mark.slow


def test_compare_demo_fp32_vs_int8(demo_assets_fast: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime as ort

    from calibkit.cli import app
    from calibkit.data.tokenizer import TextTokenizer

    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    model = demo_assets_fast / "model"
    rows = [json.loads(x) for x in (demo_assets_fast / "data" / "train.jsonl").read_text().splitlines()[:64]]
    calib = tmp_path / "calib.jsonl"
    calib.write_text("".join(json.dumps({"text": r["text"]}) + "\n" for r in rows))
    cli = CliRunner()
    r = cli.invoke(app, ["calibrate", str(model), "-c", str(calib), "--out", str(tmp_path / "cal")])
    assert r.exit_code == 0, r.output
    for prec, extra in (("fp32", []), ("int8", ["--calibration", str(tmp_path / "cal" / "calibration.json")])):
        r = cli.invoke(app, ["build", str(model), "-p", prec, "-o", str(tmp_path / f"{prec}.onnx"), *extra])
        assert r.exit_code == 0, r.output
    out = tmp_path / "cmp.json"
    r = cli.invoke(app, ["compare", str(tmp_path / "fp32.onnx"), str(tmp_path / "int8.onnx"), "--eval-set",
                         str(demo_assets_fast / "data" / "test.jsonl"), "--limit", "80", "--batch-size", "1",
                         "--layer-samples", "16", "--no-sensitivity", "--json", str(out), "--no-report"])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())

    every = [json.loads(x) for x in (demo_assets_fast / "data" / "test.jsonl").read_text().splitlines()]
    used = doc["eval_set"]["rows"]["indices"]  # --limit: a stratified random subset, recorded
    assert len(used) == 80 and len({every[i]["label"] for i in used}) == 2
    test = [every[i] for i in used]
    tok = TextTokenizer(model)
    labels = {"negative": 0, "positive": 1}
    for name, path in (("A", tmp_path / "fp32.onnx"), ("B", tmp_path / "int8.onnx")):
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        preds = []
        for row in test:
            enc = tok.encode([row["text"]])
            feeds = enc.feeds([i.name for i in sess.get_inputs()])
            preds.append(int(sess.run(None, feeds)[0].argmax()))
        acc = float(np.mean(np.array(preds) == np.array([labels[row["label"]] for row in test])))
        assert next(e for e in doc["engines"] if e["name"] == name)["accuracy"] == pytest.approx(acc)
    layers = doc["layers"]
    assert len(layers) >= 36 and all(x["amax"] and x["amax"] > 0 for x in layers)
    assert all(x["sqnr_db"] is not None and x["fp_absmax"] is not None for x in layers)
    assert [x["index"] for x in layers] == list(range(len(layers)))
