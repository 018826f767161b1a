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
    cset = write_calibration_set(root / "set", texts(30, seed=5), None)
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
    cset = write_calibration_set(tmp_path / "set", texts(20, seed=5), None)
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


def _renamed_with_positions() -> onnx.ModelProto:
    """TensorFlow-style input names (input_mask, segment_ids) and an explicit position_ids input."""
    import numpy as np
    from onnx import numpy_helper

    m = tiny_model()
    g = m.graph
    for node in g.node:
        node.input[:] = ["input_mask" if x == "attention_mask" else x for x in node.input]
    g.input[1].name = "input_mask"
    g.input.extend([helper.make_tensor_value_info("segment_ids", TensorProto.INT64, ["batch", "seq"]),
                    helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"])])
    g.initializer.append(numpy_helper.from_array(
        np.random.default_rng(1).normal(size=(16, 8)).astype(np.float32), "pos_emb"))
    embed = next(i for i, n in enumerate(g.node) if n.name == "embed")
    g.node[embed].output[0] = "E_tok"
    g.node.insert(embed + 1, helper.make_node("Gather", ["pos_emb", "position_ids"], ["P_emb"], name="pos"))
    g.node.insert(embed + 2, helper.make_node("Add", ["E_tok", "P_emb"], ["E"], name="add_pos"))
    onnx.checker.check_model(m)
    return m


def _without_mask() -> onnx.ModelProto:
    """No attention_mask input at all: the model attends to whatever it is given, padding included."""
    m = tiny_model()
    g = m.graph
    keep = [n for n in g.node if n.name not in ("cast", "unsq", "mask")]
    for n in keep:
        n.input[:] = ["S" if x == "S2" else x for x in n.input]
    del g.node[:]
    g.node.extend(keep)
    del g.input[1]
    onnx.checker.check_model(m)
    return m


def test_tensorflow_input_names_and_position_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _workflow(tmp_path, _folder(tmp_path, _renamed_with_positions()), monkeypatch, tune=False)


def test_a_model_without_attention_mask_never_sees_padding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batched with padding its outputs would depend on the batch; texts are batched by equal length instead."""
    import numpy as np

    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.engines.onnxruntime import OnnxRuntimeRunner
    from calibkit.evaluate.predict import predict_logits

    folder = _folder(tmp_path, _without_mask())
    tok = TextTokenizer(folder)
    sample = texts(40, seed=9)
    assert len(set(tok.token_lengths(sample))) > 3
    with OnnxRuntimeRunner(folder / "model.onnx") as r:
        batched = predict_logits(r, tok, sample, batch_size=16)
        alone = predict_logits(r, tok, sample, batch_size=1)
    np.testing.assert_allclose(batched, alone, rtol=1e-5, atol=1e-6)
    _workflow(tmp_path, folder, monkeypatch, tune=False)


def test_a_fixed_sequence_length_export_is_refused_with_a_re_export_hint(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    m = tiny_model()
    for inp in m.graph.input:
        inp.type.tensor_type.shape.dim[1].ClearField("dim_param")
        inp.type.tensor_type.shape.dim[1].dim_value = 16
    folder = _folder(tmp_path, m)
    cset = write_calibration_set(tmp_path / "set", texts(20, seed=5), None)
    r = _run("calibrate", folder, "-c", cset.path, "--out", tmp_path / "cal")
    text = " ".join(r.output.split())
    assert r.exit_code == 4, r.output
    assert "fixed sequence size 16" in text and "dynamic axes" in text and "Traceback" not in text
    assert not (tmp_path / "cal").exists()


def _regression_head() -> onnx.ModelProto:
    """The tiny model with a one-score head (problem_type regression), as a STS-B or reward model exports."""
    import numpy as np
    from onnx import numpy_helper

    m = tiny_model()
    g = m.graph
    for init in g.initializer:
        if init.name == "Wc":
            w = np.random.default_rng(2).normal(size=(8, 1)).astype(np.float32)
            init.CopyFrom(numpy_helper.from_array(w, "Wc"))
        elif init.name == "bc":
            init.CopyFrom(numpy_helper.from_array(np.zeros(1, np.float32), "bc"))
    g.output[0].type.tensor_type.shape.dim[1].dim_value = 1
    onnx.checker.check_model(m)
    return m


def test_a_regression_head_gets_score_fidelity_not_argmax(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """argmax over one score agreed 100 % whatever INT8 did; float labels were refused as unknown classes."""
    import random

    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    folder = _folder(tmp_path, _regression_head())
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 16, "problem_type": "regression",
                                                    "id2label": {"0": "LABEL_0"}}))
    cset = write_calibration_set(tmp_path / "set", texts(30, seed=5), None)
    rng = random.Random(3)
    ev = tmp_path / "scores.jsonl"
    ev.write_text("".join(json.dumps({"text": t, "label": round(rng.uniform(0, 5), 3)}) + "\n"
                          for t in texts(60, seed=8)))
    assert _run("calibrate", folder, "-c", cset.path, "--out", tmp_path / "cal").exit_code == 0
    for p, extra in (("fp32", []), ("int8", ["--calibration", tmp_path / "cal", "--target", "tensorrt"])):
        assert _run("build", folder, "-p", p, *extra, "-o", tmp_path / "e" / f"{p}.onnx").exit_code == 0
    r = _run("compare", tmp_path / "e" / "fp32.onnx", tmp_path / "e" / "int8.onnx", "-e", ev, "--json",
             tmp_path / "c.json", "--report", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "c.json").read_text())
    fid = doc["task"]["fidelity"]
    assert doc["task"]["kind"] == "regression" and doc["disagreements"] == [] and doc["flips_by_confidence"] == []
    assert 0.0 <= fid["agreement"] <= 1.0 and fid["max_abs_error"] > 0 and -1.0 <= fid["spearman"] <= 1.0
    assert fid["agreement"] == doc["agreement"] and doc["task"]["labelled"] is True
    assert "flips" not in r.output and "mean KL" not in r.output
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "regression (scores)" in md and "rank correlation with A" in md
    y = [json.loads(x)["label"] for x in ev.read_text().splitlines()]
    assert fid["A_mae_vs_labels"] > 0 and fid["B_rmse_vs_labels"] >= fid["B_mae_vs_labels"] > 0
    assert fid["A_mae_vs_labels"] < max(y) - min(y)
    assert "A: mean |score - label|" in md.replace("\\|", "|")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(ev.read_text() + json.dumps({"text": "good movie", "label": "high"}) + "\n")
    r = _run("compare", tmp_path / "e" / "fp32.onnx", tmp_path / "e" / "int8.onnx", "-e", bad, "--no-report")
    assert r.exit_code == 3 and "example 61's label 'high' is not a number" in " ".join(r.output.split())
    r = _run("tune", folder, "-c", cset.path, "-e", ev, "--out", tmp_path / "tune")
    assert r.exit_code == 2 and "regression" in r.output and "Traceback" not in r.output


def test_a_multi_label_head_through_compare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    folder = _folder(tmp_path, tiny_model())
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 16,
                                                    "problem_type": "multi_label_classification",
                                                    "id2label": {"0": "negative", "1": "positive"}}))
    cset = write_calibration_set(tmp_path / "set", texts(30, seed=5), None)
    ev = tmp_path / "sets.jsonl"
    sets = [["positive"], ["negative", "positive"], [], [0]]
    ev.write_text("".join(json.dumps({"text": t, "labels": sets[i % 4]}) + "\n"
                          for i, t in enumerate(texts(40, seed=8))))
    assert _run("calibrate", folder, "-c", cset.path, "--out", tmp_path / "cal").exit_code == 0
    for p, extra in (("fp32", []), ("int8", ["--calibration", tmp_path / "cal", "--target", "tensorrt"])):
        assert _run("build", folder, "-p", p, *extra, "-o", tmp_path / "e" / f"{p}.onnx").exit_code == 0
    r = _run("compare", tmp_path / "e" / "fp32.onnx", tmp_path / "e" / "int8.onnx", "-e", ev, "--json",
             tmp_path / "c.json", "--no-report")
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "c.json").read_text())
    fid = doc["task"]["fidelity"]
    assert doc["task"]["kind"] == "multi-label" and "label_decision_agreement" in fid
    assert doc["disagreements"] == [] and "same label set" in " ".join(r.output.split())
    # the lists are label sets scored against each engine's decisions, not word tags
    import numpy as np

    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.engines.onnxruntime import OnnxRuntimeRunner
    from calibkit.evaluate.predict import predict_logits

    with OnnxRuntimeRunner(tmp_path / "e" / "fp32.onnx") as runner:
        on = predict_logits(runner, TextTokenizer(folder), texts(40, seed=8)) > 0
    gold = np.array([[False, True], [True, True], [False, False], [True, False]] * 10)
    assert fid["A_exact_set_accuracy"] == pytest.approx(float((on == gold).all(axis=1).mean()))
    assert 0.0 <= fid["B_micro_f1"] <= 1.0 and 0.0 <= fid["A_macro_f1"] <= 1.0
    bad = tmp_path / "bad.jsonl"
    bad.write_text(ev.read_text() + json.dumps({"text": "good movie", "labels": ["neutral"]}) + "\n")
    r = _run("compare", tmp_path / "e" / "fp32.onnx", tmp_path / "e" / "int8.onnx", "-e", bad, "--no-report")
    assert r.exit_code == 3 and "example 41 has the label 'neutral'" in " ".join(r.output.split())
