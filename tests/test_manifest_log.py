"""The log a calibration set's manifest names is read by one function (data.calibset.manifest_log): compare
and tune's default traffic and deploy's see the same log, at the same place."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from calib_helpers import sample_record

from calibkit.data.calibset import load_calibration_set, manifest_log, write_calibration_set
from calibkit.deploy.traffic import find_calibration_set, log_of_calibration_set
from calibkit.errors import DataError
from calibkit.evaluate.traffic import default_traffic_log
from calibkit.provenance import PATHS_RELATIVE
from calibkit.results.files import ManifestRedaction, ManifestSource, ManifestTextField


def load_id(folder: Path) -> str:
    """The set's id: the sha256 of its texts.jsonl."""
    from calibkit._io import sha256_file

    return sha256_file(folder / "texts.jsonl")


def _set(folder: Path, source: ManifestSource, **fields: object) -> Path:
    record = sample_record(folder.parent / f"{folder.name}-drawn", source, paths=PATHS_RELATIVE, **fields)
    return write_calibration_set(folder, ["a text", "another"], None, record).path


def _log(path: str, sha256: str = "", size_bytes: int | None = None) -> ManifestSource:
    return ManifestSource(path=path, size_bytes=size_bytes, sha256=sha256, gzip=False)


def test_both_readers_find_the_same_log_relative_to_the_manifest(tmp_path: Path, monkeypatch) -> None:
    log = tmp_path / "logs" / "prod.jsonl"
    log.parent.mkdir()
    log.write_text('{"text": "x"}\n', encoding="utf-8")
    folder = _set(tmp_path / "sets" / "s", _log(os.path.relpath(log, tmp_path / "sets" / "s"), "ab" * 32,
                                                log.stat().st_size),
                  text_field=ManifestTextField(("request.text",), False),
                  redaction=ManifestRedaction(counts={}, enabled=False))
    monkeypatch.chdir(tmp_path / "logs")  # the reading does not depend on the current folder
    ours = default_traffic_log(load_calibration_set(folder))
    theirs = log_of_calibration_set(folder)
    assert theirs is not None
    assert ours.path == theirs.path and ours.path.resolve() == log.resolve()
    assert (ours.sha256, ours.size_bytes) == (theirs.sha256, theirs.size_bytes) == ("ab" * 32, log.stat().st_size)
    assert ours.text_field == "request.text" and ours.redact is False
    cset = load_calibration_set(folder)
    assert find_calibration_set(cset.id, [tmp_path / "sets"]) == folder


@pytest.mark.parametrize("edited", [None, {}, {"path": ""}])
def test_a_manifest_naming_no_log_is_the_same_for_both(tmp_path: Path, edited: dict[str, object] | None) -> None:
    folder = _set(tmp_path / "s", _log("", "ab" * 32))
    if edited is not None:  # a hand-edited source without a path reads as one naming no log
        manifest = folder / "manifest.json"
        manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "source": edited}))
    assert manifest_log(load_calibration_set(folder).manifest, folder / "manifest.json") is None
    assert log_of_calibration_set(folder) is None
    with pytest.raises(DataError, match="names no source log"):
        default_traffic_log(load_calibration_set(folder))


@pytest.mark.parametrize(("source", "named"), [({"path": 7}, "$.source.path"), ("log.jsonl", "$.source")])
def test_a_manifest_naming_its_log_by_a_mistyped_value_is_refused_by_both(tmp_path: Path, source: object,
                                                                          named: str) -> None:
    folder = _set(tmp_path / "sets" / "s", _log("log.jsonl"))
    manifest = folder / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "source": source}))
    for read in (load_calibration_set, log_of_calibration_set):
        with pytest.raises(DataError, match="manifest.json") as exc:
            read(folder)
        assert named in exc.value.message
    assert find_calibration_set(load_id(folder), [tmp_path / "sets"]) is None  # its set is not known


def test_a_log_without_its_sha256_is_no_default_traffic(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"text": "x"}\n', encoding="utf-8")
    folder = _set(tmp_path / "s", _log(str(log)))
    read = log_of_calibration_set(folder)
    assert read is not None and read.path == log and read.sha256 is None
    with pytest.raises(DataError, match="names no source log"):  # compare and tune check the log they read
        default_traffic_log(load_calibration_set(folder))


@pytest.mark.parametrize(("edit", "named"), [({"count": "8"}, "$.count"), ({"seed": -0.5}, "$.seed"),
                                              ([], "JSON object")])
def test_a_mistyped_manifest_says_to_re_create_the_set(tmp_path: Path, edit: object, named: str) -> None:
    # its hint was the codec's "pass a document written by calibkit compare or tune, unedited": not what fixes
    # a calibration set (calibrate, tune and deploy all read it)
    from calib_helpers import write_model_dir
    from cli_helpers import run

    folder = _set(tmp_path / "sets" / "s", _log("log.jsonl"))
    manifest = folder / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), **edit} if isinstance(edit, dict) else edit))
    for read in (load_calibration_set, log_of_calibration_set):
        with pytest.raises(DataError, match="manifest.json") as exc:
            read(folder)
        assert named in exc.value.message and "calibkit sample" in (exc.value.hint or ""), exc.value
    r = run("calibrate", write_model_dir(tmp_path / "model"), "-c", folder, "--out", tmp_path / "cal")
    assert r.exit_code == 3 and "manifest.json" in r.output and "calibkit sample" in r.output, r.output
