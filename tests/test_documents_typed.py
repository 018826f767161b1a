"""smoothing.json, engine sidecars and a calibration set's manifest.json go through the codec like the reports:
written from a typed value, read back as the same value, and a hand-edited one refused naming the file and the
field; a request is checked when it is made; a model whose class axis does not match config.json is refused before
any inference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibkit._io import dumps_json, read_json
from calibkit._version import __version__
from calibkit.calibrate.smoothing import SMOOTHING_FILE, smooth
from calibkit.data.calibset import MANIFEST, load_calibration_set, read_manifest, write_calibration_set
from calibkit.data.sample_pipeline import sample_log
from calibkit.enginefiles.artifact import EngineArtifact, fingerprint, sidecar_path
from calibkit.errors import DataError, ModelError, UsageError
from calibkit.requests.compare import CompareRequest
from calibkit.requests.sample import SampleRequest
from calibkit.requests.smooth import SmoothRequest
from calibkit.requests.tune import TuneRequest
from calibkit.results.codec import document_json, read_smoothing
from calibkit.results.files import CalibrationSetManifest, SmoothingRecord
from tests.calib_helpers import texts
from tests.test_compare_tiny import build_engines, compare_files
from tests.test_smooth import _model_dir


@pytest.fixture(scope="module")
def smoothed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("smoothed")
    md = _model_dir(root / "m")
    cset = write_calibration_set(root / "set", texts(40, seed=2), None)
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


# ---------------------------------------------------------------- a calibration set's manifest.json
# tests/data/sample_manifest.json: the manifest `calibkit sample` wrote for _write_log's log (with SAMPLED's
# options) when the manifest was a hand-built dict, before it was a typed document; only calibkit_version moves.
GOLDEN = Path(__file__).parent / "data" / "sample_manifest.json"
SAMPLED = {"size": 12, "seed": 3, "text_field": "req.text", "label_field": "label"}


def _write_log(path: Path) -> Path:
    """A small log touching every manifest section: normalized duplicates, broken lines of two kinds, a
    <script> block and a text emptied by cleanup, an email address, one text over MAX_TEXT_CHARS, three labels
    and a missing one. Fewer than 40 distinct texts: one topic cluster, so no k-means enters the bytes."""
    words = "movie plot great awful battery refund senate budget very not".split()
    lines = []
    for i in range(36):
        text = " ".join(words[(i * k) % len(words)] for k in range(1, 3 + i % 9)) + f" n{i}"
        if i == 3:
            text += " mail me at ann@example.com"
        if i == 5:
            text += " <script>alert(1)</script>"
        if i == 7:
            text = "w " * 33000
        lines.append(json.dumps({"req": {"text": text}, "label": ["pos", "neg", "mixed", None][i % 4]}))
        if i % 6 == 0:
            lines.append(json.dumps({"req": {"text": text.upper() if i != 7 else text}, "label": "pos"}))
        if i % 10 == 2:
            lines.append("{broken")
    lines.append(json.dumps({"req": {"text": "<style>x</style>"}, "label": "pos"}))
    lines.append(json.dumps({"req": {"text": 5}}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def sampled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sampled")
    return sample_log(SampleRequest(logs=_write_log(root / "log.jsonl"), out=root / "set", **SAMPLED)).path


def test_the_manifest_is_the_json_sample_wrote_before_it_was_typed(sampled: Path) -> None:
    golden = GOLDEN.read_text(encoding="utf-8").replace('"calibkit_version": "0.2.0"',
                                                        f'"calibkit_version": {json.dumps(__version__)}')
    assert (sampled / MANIFEST).read_text(encoding="utf-8") == golden
    manifest = read_manifest(sampled)
    assert isinstance(manifest, CalibrationSetManifest) and manifest.sample is not None
    assert dumps_json(document_json(manifest)) == golden  # read back, written again: the same bytes
    assert load_calibration_set(sampled).manifest == manifest
    rec = manifest.sample
    assert (manifest.count, rec.size_requested, rec.lines.broken["invalid_json"].count) == (12, 12, 4)
    assert rec.redaction.counts["email"] == 1 and rec.lines.oversized is not None and rec.warnings
    assert rec.strata.label_stratification is not None and rec.strata.label_stratification.stratified


def test_a_set_written_without_a_sample_has_the_two_facts_of_every_set(tmp_path: Path) -> None:
    cset = write_calibration_set(tmp_path / "set", ["a text", "another"], None)
    assert set(read_json(tmp_path / "set" / MANIFEST)) == {"texts_sha256", "count"}
    assert read_manifest(cset.path) == cset.manifest == CalibrationSetManifest(cset.id, 2)
    assert read_manifest(tmp_path) is None  # no manifest there


def test_a_manifest_of_an_earlier_version_still_reads(sampled: Path, tmp_path: Path) -> None:
    """The first sample wrote no warnings, label stratification or oversized counts, and no ``paths`` marker
    (its relative paths were relative to the folder it ran in)."""
    doc = read_json(sampled / MANIFEST)
    del doc["warnings"], doc["strata"]["label_stratification"], doc["lines"]["oversized"], doc["paths"]
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / MANIFEST).write_text(json.dumps(doc))
    manifest = read_manifest(folder)
    assert manifest is not None and manifest.sample is not None and manifest.count == 12
    rec = manifest.sample
    assert (rec.warnings, rec.strata.label_stratification, rec.lines.oversized, rec.paths) == ((), None, None, None)


def _edited(doc: dict[str, object], key: str, value: object) -> dict[str, object]:
    """``doc`` with the dotted ``key`` set to ``value``."""
    out = json.loads(json.dumps(doc))
    *parents, last = key.split(".")
    node = out
    for k in parents:
        node = node[k]
    node[last] = value
    return out


@pytest.mark.parametrize(("key", "value", "named"), [
    ("count", "twelve", "$.count"),
    ("texts_sha256", 7, "$.texts_sha256"),
    ("source.path", 7, "$.source.path"),
    ("source", "log.jsonl", "$.source"),
    ("redaction.enabled", "no", "$.redaction.enabled"),
    ("representativeness.psi", "low", "$.representativeness.psi"),
    ("strata.table", [{"topic": "one"}], "$.strata.table[0].topic"),
    ("sample_seen_counts", [1, "2"], "$.sample_seen_counts[1]"),
    ("lines.broken", {"invalid_json": {"count": 1.5}}, "$.lines.broken.invalid_json.count"),
])
def test_a_hand_edited_manifest_is_refused_naming_the_file_and_the_field(sampled: Path, tmp_path: Path, key: str,
                                                                         value: object, named: str) -> None:
    folder = tmp_path / "edited"
    folder.mkdir()
    (folder / "texts.jsonl").write_bytes((sampled / "texts.jsonl").read_bytes())
    (folder / MANIFEST).write_text(json.dumps(_edited(read_json(sampled / MANIFEST), key, value)))
    for read in (read_manifest, load_calibration_set):
        with pytest.raises(DataError, match="manifest.json") as exc:
            read(folder)
        assert named in exc.value.message


@pytest.mark.parametrize("text", ["[]", "null", "{", '"a string"'])
def test_a_manifest_that_is_no_json_object_is_refused_naming_the_file(tmp_path: Path, text: str) -> None:
    write_calibration_set(tmp_path / "set", ["a text"], None)
    (tmp_path / "set" / MANIFEST).write_text(text)
    with pytest.raises(DataError, match="manifest.json"):
        load_calibration_set(tmp_path / "set")
