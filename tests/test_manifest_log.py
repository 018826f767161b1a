"""The log a calibration set's manifest names is read by one function (data.calibset.manifest_log): compare
and tune's default traffic and deploy's see the same log, at the same place."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from calibkit.data.calibset import load_calibration_set, manifest_log, write_calibration_set
from calibkit.deploy.traffic import find_calibration_set, log_of_calibration_set
from calibkit.errors import DataError
from calibkit.evaluate.traffic import default_traffic_log
from calibkit.provenance import PATHS_KEY, PATHS_RELATIVE


def _set(folder: Path, source: dict[str, object], **extra: object) -> Path:
    return write_calibration_set(folder, ["a text", "another"], None, {PATHS_KEY: PATHS_RELATIVE,
                                                                       "source": source, **extra}).path


def test_both_readers_find_the_same_log_relative_to_the_manifest(tmp_path: Path, monkeypatch) -> None:
    log = tmp_path / "logs" / "prod.jsonl"
    log.parent.mkdir()
    log.write_text('{"text": "x"}\n', encoding="utf-8")
    folder = _set(tmp_path / "sets" / "s", {"path": os.path.relpath(log, tmp_path / "sets" / "s"),
                                            "sha256": "ab" * 32, "size_bytes": log.stat().st_size},
                  text_field={"paths": ["request.text"]}, redaction={"enabled": False})
    monkeypatch.chdir(tmp_path / "logs")  # the reading does not depend on the current folder
    ours = default_traffic_log(load_calibration_set(folder))
    theirs = log_of_calibration_set(folder)
    assert theirs is not None
    assert ours.path == theirs.path and ours.path.resolve() == log.resolve()
    assert (ours.sha256, ours.size_bytes) == (theirs.sha256, theirs.size_bytes) == ("ab" * 32, log.stat().st_size)
    assert ours.text_field == "request.text" and ours.redact is False
    cset = load_calibration_set(folder)
    assert find_calibration_set(cset.id, [tmp_path / "sets"]) == folder


@pytest.mark.parametrize("source", [{}, {"path": ""}, {"path": 7}, "log.jsonl"])
def test_a_manifest_naming_no_log_is_the_same_for_both(tmp_path: Path, source: object) -> None:
    folder = _set(tmp_path / "s", source)  # type: ignore[arg-type]
    assert manifest_log(load_calibration_set(folder).manifest, folder / "manifest.json") is None
    assert log_of_calibration_set(folder) is None
    with pytest.raises(DataError, match="names no source log"):
        default_traffic_log(load_calibration_set(folder))


def test_a_log_without_its_sha256_is_no_default_traffic(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"text": "x"}\n', encoding="utf-8")
    folder = _set(tmp_path / "s", {"path": str(log), "sha256": ""})
    read = log_of_calibration_set(folder)
    assert read is not None and read.path == log and read.sha256 is None
    with pytest.raises(DataError, match="names no source log"):  # compare and tune check the log they read
        default_traffic_log(load_calibration_set(folder))
