"""smoothing.json and engine sidecars go through the codec like the reports: written from a typed value, read back
as the same value, and a hand-edited one refused naming the file and the field; a request is checked when it is
made; a model whose class axis does not match config.json is refused before any inference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibkit._io import dumps_json, read_json
from calibkit.calibrate.smoothing import SMOOTHING_FILE, smooth
from calibkit.data.calibset import write_calibration_set
from calibkit.enginefiles.artifact import EngineArtifact, fingerprint, sidecar_path
from calibkit.errors import DataError, ModelError, UsageError
from calibkit.requests.compare import CompareRequest
from calibkit.requests.smooth import SmoothRequest
from calibkit.requests.tune import TuneRequest
from calibkit.results.codec import document_json, read_smoothing
from calibkit.results.files import SmoothingRecord
from tests.calib_helpers import texts
from tests.test_compare_tiny import build_engines, compare_files
from tests.test_smooth import _model_dir


@pytest.fixture(scope="module")
def smoothed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("smoothed")
    md = _model_dir(root / "m")
    cset = write_calibration_set(root / "set", texts(40, seed=2), None, {})
    smooth(SmoothRequest(model=md, calibration_set=cset, out=root / "sm"))
    return root / "sm"


def test_smoothing_json_is_its_typed_record_byte_for_byte(smoothed: Path) -> None:
    record = read_smoothing(smoothed)
    assert isinstance(record, SmoothingRecord) and record.smoothed <= record.groups == len(record.layers)
    assert (smoothed / SMOOTHING_FILE).read_text() == dumps_json(document_json(record))
    assert read_smoothing(smoothed.parent / "set") is None  # no record: not a smoothed folder


@pytest.mark.parametrize(("key", "value", "named"), [
    ("smoothed", "three", "$.smoothed"),
    ("layers", [{"tensor": 1}], "$.layers[0].tensor"),
    ("source_sha256", "abc", "source sha256"),
    ("format", "calibkit-smoothing/9", "calibkit-smoothing/9"),
])
def test_a_hand_edited_smoothing_record_is_refused_naming_the_field(smoothed: Path, tmp_path: Path, key: str,
                                                                     value: object, named: str) -> None:
    folder = tmp_path / "edited"
    folder.mkdir()
    doc = read_json(smoothed / SMOOTHING_FILE)
    (folder / SMOOTHING_FILE).write_text(json.dumps({**doc, key: value}))
    with pytest.raises(DataError, match="smoothing.json") as exc:
        read_smoothing(folder)
    assert named in exc.value.message
    # deploy, following a smoothed copy back to its original, stops at a record it cannot read
    from calibkit.deploy.source import original_model

    assert original_model(folder / "model.onnx") == folder / "model.onnx"


def test_the_engine_sidecar_is_its_typed_document(tmp_path: Path) -> None:
    files = build_engines(tmp_path)
    for engine in (files["fp"], files["int8"]):
        art = EngineArtifact.load(engine)
        on_disk = sidecar_path(engine).read_text()
        assert on_disk == dumps_json(document_json(art.sidecar(fingerprint(engine))))
        assert EngineArtifact.load(engine) == art


@pytest.mark.parametrize(("key", "value", "named"), [
    ("precision", "int4", "$.precision"),
    ("kept_higher_precision", "fc1", "$.kept_higher_precision"),
    ("extra", {"weight_bits": "eight"}, "$.extra.weight_bits"),
    ("backend", "", "names no backend"),
])
def test_a_hand_edited_sidecar_is_refused_naming_the_field(tmp_path: Path, key: str, value: object,
                                                           named: str) -> None:
    files = build_engines(tmp_path)
    sc = sidecar_path(files["int8"])
    sc.write_text(json.dumps({**read_json(sc), key: value}))
    with pytest.raises(ModelError, match="sidecar") as exc:
        EngineArtifact.load(files["int8"])
    assert named in exc.value.message


def test_a_request_is_checked_when_it_is_made() -> None:
    with pytest.raises(UsageError, match="unknown --method 'fast'"):
        TuneRequest(model="m", calibration_set="c", method="fast")
    with pytest.raises(UsageError, match="--min-agreement"):
        CompareRequest(engine_a="a", engine_b="b", eval_set="e", min_agreement=101)


def test_compare_refuses_a_class_count_that_is_not_the_models_before_inference(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    files = build_engines(tmp_path)
    (files["tok"] / "config.json").write_text(json.dumps({"id2label": {"0": "a", "1": "b", "2": "c"}}))
    import calibkit.evaluate.compare as compare_mod

    def no_inference(*_a: object, **_k: object) -> None:
        raise AssertionError("an engine was evaluated before the label count was checked")

    monkeypatch.setattr(compare_mod, "_evaluate_engines", no_inference)
    with pytest.raises(ModelError, match="returns 2 scores per text in 'logits' but its config.json names 3 labels"):
        compare_files(files["fp"], files["int8"], files["eval"])
