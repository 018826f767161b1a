"""Fixed: the inputs of one run must agree by content (calibkit.consistency), before any work.

Engines with different tokenizers or label maps, a source model replaced after build, a calibration table made
for another model: each is an error naming both sides, from the library (a Python caller of compare_engines gets
it too) as from the CLI.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
from calib_helpers import texts, tiny_model, write_model_dir
from cli_helpers import build_engines, flat, run

from calibkit.consistency import check_engines, labels_sha256, tokenizer_sha256
from calibkit.enginefiles.artifact import EngineArtifact
from calibkit.errors import CalibrationError, ModelError


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_engines(tmp_path_factory.mktemp("consistency"), eval_texts=texts(24, seed=5))


def _copy(built: Path, tmp: Path) -> Path:
    dst = tmp / "w"
    for name in ("model", "cal", "e"):
        shutil.copytree(built / name, dst / name)
    return dst


def test_the_sidecar_records_tokenizer_and_labels_by_content(built: Path) -> None:
    doc = json.loads((built / "e" / "int8.onnx.calibkit.json").read_text())
    assert doc["tokenizer_sha256"] == tokenizer_sha256(built / "model")
    assert doc["labels_sha256"] == labels_sha256(built / "model")


def _permuted_tokenizer_engine(w: Path) -> Path:
    """B built from a copy of the model folder whose tokenizer.json maps words to other ids."""
    other = w / "model-permuted"
    shutil.copytree(w / "model", other)
    tj = json.loads((other / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    words = sorted(k for k in vocab if not k.startswith("["))
    ids = [vocab[k] for k in words]
    vocab.update(dict(zip(words, ids[1:] + ids[:1])))
    (other / "tokenizer.json").write_text(json.dumps(tj))
    r = run("build", other, "-p", "fp32", "-o", w / "e" / "permuted.onnx")
    assert r.exit_code == 0, r.output
    return w / "e" / "permuted.onnx"


@pytest.mark.parametrize("order", ["fp32-first", "permuted-first"])
def test_engines_with_different_tokenizers_are_refused_in_either_order(built: Path, tmp_path: Path,
                                                                        order: str) -> None:
    w = _copy(built, tmp_path)
    b = _permuted_tokenizer_engine(w)
    a = w / "e" / "fp32.onnx"
    pair = (a, b) if order == "fp32-first" else (b, a)
    out = tmp_path / "rep"
    r = run("compare", *pair, "-e", built / "eval.jsonl", "--report", out, "--no-sensitivity")
    assert r.exit_code == 4, r.output
    text = flat(r)
    assert "different tokenizers" in text and "hint:" in text
    squashed = "".join(r.output.split())  # long paths wrap
    assert str(w / "model-permuted") in squashed and f"{w / 'model'}(" in squashed  # both sides named
    assert not out.exists()


def test_the_library_refuses_them_too(built: Path, tmp_path: Path) -> None:
    from calibkit.data.evalset import load_eval_set
    from calibkit.evaluate.compare import compare_engines
    from calibkit.requests.compare import CompareRequest
    from calibkit.resources import Resources

    w = _copy(built, tmp_path)
    b = EngineArtifact.load(_permuted_tokenizer_engine(w))
    a = EngineArtifact.load(w / "e" / "fp32.onnx")
    with pytest.raises(ModelError, match="different tokenizers"):
        compare_engines(CompareRequest(engine_a=a, engine_b=b, eval_set=load_eval_set(built / "eval.jsonl"),
                                       layers=False, sensitivity=False, traffic=None), Resources())


def test_a_tokenizer_edited_after_build_is_refused(built: Path, tmp_path: Path) -> None:
    w = _copy(built, tmp_path)
    tj = json.loads((w / "model" / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    vocab["good"], vocab["bad"] = vocab["bad"], vocab["good"]
    (w / "model" / "tokenizer.json").write_text(json.dumps(tj))
    r = run("compare", w / "e" / "fp32.onnx", w / "e" / "int8.onnx", "-e", built / "eval.jsonl", "--no-report",
            "--no-sensitivity")
    assert r.exit_code == 4 and "changed after it was built" in flat(r) and "hint:" in r.output, r.output


def test_engines_with_different_label_maps_are_refused(built: Path, tmp_path: Path) -> None:
    w = _copy(built, tmp_path)
    other = w / "model-swapped"
    shutil.copytree(w / "model", other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["id2label"] = {"0": "positive", "1": "negative"}
    (other / "config.json").write_text(json.dumps(cfg))
    assert run("build", other, "-p", "fp32", "-o", w / "e" / "swapped.onnx").exit_code == 0
    r = run("compare", w / "e" / "fp32.onnx", w / "e" / "swapped.onnx", "-e", built / "eval.jsonl", "--no-report")
    assert r.exit_code == 4 and "name their outputs differently" in flat(r), r.output


def _replace_source_model(w: Path) -> None:
    """Re-export in place: same graph, other weights (what a retrained model exported to the same path is)."""
    onnx.save(tiny_model(seed=7), str(w / "model" / "model.onnx"))


def test_a_source_model_replaced_after_build_is_refused_before_sensitivity(built: Path, tmp_path: Path) -> None:
    w = _copy(built, tmp_path)
    _replace_source_model(w)
    out = tmp_path / "rep"
    r = run("compare", w / "e" / "fp32.onnx", w / "e" / "int8.onnx", "-e", built / "eval.jsonl", "--report", out)
    assert r.exit_code == 4, r.output
    text = flat(r)
    assert "was replaced since it was recorded" in text and "hint:" in text
    assert str(w / "model" / "model.onnx") in "".join(r.output.split())  # long paths wrap
    assert not out.exists()
    # without layers and sensitivity nothing is rebuilt from it: the comparison of the two engines stands
    r = run("compare", w / "e" / "fp32.onnx", w / "e" / "int8.onnx", "-e", built / "eval.jsonl", "--no-report",
            "--no-sensitivity", "--no-layers")
    assert r.exit_code == 0, r.output


def test_sensitivity_jobs_check_their_source_model(built: Path, tmp_path: Path) -> None:
    from calibkit.evaluate.sensitivity import SensitivityJob, run_jobs

    w = _copy(built, tmp_path)
    expected = EngineArtifact.load(w / "e" / "int8.onnx").source_model_sha256
    _replace_source_model(w)
    job = SensitivityJob(source_model=str(w / "model" / "model.onnx"), calibration_json=str(w / "cal"),
                         tokenizer=str(w / "model"), texts=("good",), labels=(1,), reference_logits=((0.0, 1.0),),
                         keep_nodes=(), mode="all_int8", source_model_sha256=expected)
    with pytest.raises(ModelError, match="was replaced since it was recorded"):
        run_jobs([job], workers=1)


def test_a_calibration_table_replaced_after_build_is_refused(built: Path, tmp_path: Path) -> None:
    w = _copy(built, tmp_path)
    doc = json.loads((w / "cal" / "calibration.json").read_text())
    doc["table"]["ranges"][0]["amax"] *= 2
    (w / "cal" / "calibration.json").write_text(json.dumps(doc))
    r = run("compare", w / "e" / "fp32.onnx", w / "e" / "int8.onnx", "-e", built / "eval.jsonl", "--no-report")
    assert r.exit_code == 5 and "calibration table" in flat(r) and "hint:" in r.output, r.output


def test_a_table_for_another_model_is_refused_by_build_from_a_qdq_model(built: Path, tmp_path: Path) -> None:
    w = _copy(built, tmp_path)
    other = write_model_dir(tmp_path / "other", seed=3)
    r = run("build", other, "-p", "int8", "--qdq", w / "cal" / "model.int8.onnx", "-o", tmp_path / "x.onnx")
    assert r.exit_code == 5, r.output
    assert "computed for another model" in flat(r) and str(other / "model.onnx") in flat(r)
    assert not (tmp_path / "x.onnx").exists()


def test_check_engines_names_both_sides(built: Path, tmp_path: Path) -> None:
    w = _copy(built, tmp_path)
    a = EngineArtifact.load(w / "e" / "int8.onnx")
    (w / "cal" / "calibration.json").write_text((w / "cal" / "calibration.json").read_text() + " ")
    with pytest.raises(CalibrationError) as info:
        check_engines({"B": a})
    assert "B (int8.onnx)" in info.value.message and "recorded sha256" in info.value.message
    check_engines({"B": a}, sources=False)  # a run that does not rebuild from it does not read it
