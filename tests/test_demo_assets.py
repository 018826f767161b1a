"""The fast demo assets as others use them: the ONNX model's interface, padding, accuracy, and no test leak."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

INPUTS = ["input_ids", "attention_mask", "token_type_ids"]


def test_model_folder_interface(demo_assets_fast: Path) -> None:
    import onnx

    model_dir = demo_assets_fast / "model"
    for name in ("model.onnx", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
                 "config.json", "metrics.json"):
        assert (model_dir / name).is_file(), name
    assert sorted(p.name for p in model_dir.iterdir() if p.suffix in ("", ".data", ".bin")) == []

    model = onnx.load(str(model_dir / "model.onnx"))
    onnx.checker.check_model(model)
    assert {o.domain: o.version for o in model.opset_import}.get("", None) == 17
    assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    assert [i.name for i in model.graph.input] == INPUTS
    for i in model.graph.input:
        assert i.type.tensor_type.elem_type == onnx.TensorProto.INT64
        assert [d.dim_param for d in i.type.tensor_type.shape.dim] == ["batch", "sequence"]
    (out,) = model.graph.output
    assert out.name == "logits"
    assert [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim] == ["batch", 2]
    names = [n.name for n in model.graph.node]
    assert all(names) and len(set(names)) == len(names)
    assert "/bert/encoder/layer.0/attention/self/query/MatMul" in names
    assert sum(bool(re.match(r"/bert/encoder/layer\.\d/", n)) for n in names) > 300

    config = json.loads((model_dir / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    assert config["label2id"] == {"negative": 0, "positive": 1}
    from calibkit.data.modeldir import ModelDir

    assert ModelDir.resolve(model_dir).id2label == {0: "negative", 1: "positive"}


def test_padding_does_not_change_logits(demo_assets_fast: Path) -> None:
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.engines.onnxruntime import OnnxRuntimeRunner

    model_dir = demo_assets_fast / "model"
    tok = TextTokenizer(model_dir)
    texts = ["Great.", "A dull, overlong and painfully unfunny film that wastes a fine cast on nothing at all."]
    with OnnxRuntimeRunner(model_dir / "model.onnx") as runner:
        batch = runner.infer(tok.encode(texts).feeds(INPUTS))["logits"]
        alone = runner.infer(tok.encode(texts[:1]).feeds(INPUTS))["logits"]
        # extra padding columns beyond the longest text
        enc = tok.encode(texts[:1]).feeds(INPUTS)
        padded = {k: np.pad(v, ((0, 0), (0, 9)), constant_values=tok.pad_id if k == "input_ids" else 0)
                  for k, v in enc.items()}
        extra = runner.infer(padded)["logits"]
    np.testing.assert_allclose(batch[0], alone[0], atol=1e-4)
    np.testing.assert_allclose(extra[0], alone[0], atol=1e-4)
    assert not np.allclose(batch[0], batch[1], atol=1e-3)  # the texts differ, so must their logits


def test_recorded_accuracy_is_what_onnxruntime_measures(demo_assets_fast: Path) -> None:
    from calibkit.demo.prepare import evaluate_accuracy

    metrics = json.loads((demo_assets_fast / "model" / "metrics.json").read_text())
    rows = [json.loads(line) for line in (demo_assets_fast / "data" / "test.jsonl").read_text().splitlines()]
    assert metrics["n_test"] == len(rows) and metrics["variant"] == "logreg-head"
    acc = evaluate_accuracy(demo_assets_fast / "model", [r["text"] for r in rows],
                            [int(r["label"] == "positive") for r in rows])
    assert acc == pytest.approx(metrics["accuracy"], abs=1e-5)
    assert 0.70 < acc < 0.85


def _norm(text: str) -> str:
    import unicodedata

    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def _log_texts(path: Path) -> list[str]:
    texts = []
    for raw in path.read_bytes().splitlines():
        try:
            rec = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            continue
        if not isinstance(rec, dict):
            continue
        text = rec.get("text", (rec.get("request") or {}).get("text") if isinstance(rec.get("request"), dict)
                       else None)
        if isinstance(text, str) and text:
            texts.append(_norm(text))
    return texts


def test_data_split_and_no_test_text_in_the_log(demo_assets_fast: Path) -> None:
    data = demo_assets_fast / "data"
    train = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
    test = [json.loads(line) for line in (data / "test.jsonl").read_text().splitlines()]
    assert len(train) + len(test) == 10605 - json.loads(
        (demo_assets_fast / "model" / "metrics.json").read_text())["dropped_zero_ratings"]["movie"]
    assert abs(len(test) / (len(train) + len(test)) - 0.2) < 0.001
    assert {r["label"] for r in train + test} == {"positive", "negative"}

    log_texts = _log_texts(demo_assets_fast / "logs.jsonl")
    assert len(log_texts) > 1000
    joined = "\n".join(log_texts)
    train_norm = {_norm(r["text"]) for r in train}
    # test texts appear nowhere (not as a record, not inside a batch record); train texts do appear
    test_norm = {_norm(r["text"]) for r in test} - train_norm  # a few snippets occur in both halves verbatim
    leaked = [t for t in test_norm if len(t) > 30 and t in joined]
    assert leaked == []
    assert sum(t in train_norm for t in log_texts) > 100
