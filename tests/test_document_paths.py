"""Paths inside calibkit's documents resolve against the document's own folder, whatever folder a command runs
in: engines built as the docs say (relative paths, from the project folder) are compared with ``--traffic auto``
from another working folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from calib_helpers import texts, write_model_dir
from cli_helpers import run, write_eval_set

from calibkit.provenance import PATHS_KEY, PATHS_RELATIVE, document_path


def test_document_path_reads_relative_paths_against_the_documents_folder(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    doc = tmp_path / "run" / "calibration.json"
    (tmp_path / "run").mkdir()
    (tmp_path / "set").mkdir()
    monkeypatch.chdir(tmp_path / "run")  # "../set" from the working folder too: no accident
    marked = {PATHS_KEY: PATHS_RELATIVE}
    assert document_path(doc, "../set", marked) == tmp_path / "set"
    assert document_path(doc, str(tmp_path / "x"), marked) == tmp_path / "x"  # absolute: as written
    assert document_path(doc, "", marked) is None and document_path(doc, None) is None
    monkeypatch.chdir(tmp_path)
    assert document_path(doc, "../set", marked) == tmp_path / "set"
    assert document_path(doc, "missing", {}) == tmp_path / "run" / "missing"
    # an older document (no marker) whose path was relative to where its run ran: found there when only there
    assert document_path(doc, "set", {}) == tmp_path / "set"


def test_compare_traffic_auto_from_another_working_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(project)
    write_model_dir(Path("model"))
    Path("logs").mkdir()
    Path("logs/prod.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(300, seed=5)))
    write_eval_set(Path("eval.jsonl"), texts(40, seed=9))
    for args in (["sample", "logs/prod.jsonl", "--size", "40", "--out", "calibration_sets/prod"],
                 ["calibrate", "model", "-c", "calibration_sets/prod", "--method", "minmax", "--out", "cal"],
                 ["build", "model", "-p", "fp32", "-o", "engines/fp32.onnx"],
                 ["build", "model", "-p", "int8", "--calibration", "cal", "-o", "engines/int8.onnx"]):
        r = run(*args)
        assert r.exit_code == 0, r.output
    manifest = json.loads(Path("calibration_sets/prod/manifest.json").read_text())
    assert not os.path.isabs(manifest["source"]["path"]) and manifest[PATHS_KEY] == PATHS_RELATIVE
    monkeypatch.chdir(elsewhere)
    out = elsewhere / "cmp.json"
    r = run("compare", project / "engines/fp32.onnx", project / "engines/int8.onnx", "--eval-set",
            project / "eval.jsonl", "--traffic", "auto", "--no-report", "--no-layers", "--no-sensitivity",
            "--json", out)
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["traffic"] is not None, "the calibration set's own log was drawn from"
