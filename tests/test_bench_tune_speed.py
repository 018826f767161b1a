"""benchmarks/bench_tune_speed.py measures the calibkit its ``--code`` names, wherever the script is started from."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("bench_tune_speed", ROOT / "benchmarks" / "bench_tune_speed.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _copy_of_calibkit(folder: Path) -> Path:
    shutil.copytree(ROOT / "calibkit", folder / "calibkit", ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def test_tunes_child_imports_the_code_it_is_given_when_started_from_a_checkouts_root(tmp_path, monkeypatch):
    # python -c puts the current folder first on the import path: from the checkout's root, its own calibkit
    # shadowed --code's, and the "old" strategy ran the new code
    monkeypatch.chdir(ROOT)
    code = _copy_of_calibkit(tmp_path / "old")
    work = tmp_path / "work"
    work.mkdir()
    assert _bench().imported_calibkit(code, work) == code / "calibkit"


def test_a_work_folder_that_would_shadow_the_code_stops_before_tune_starts(tmp_path, monkeypatch):
    code = _copy_of_calibkit(tmp_path / "old")
    work = _copy_of_calibkit(tmp_path / "work")
    monkeypatch.setattr(sys, "argv", ["bench_tune_speed.py", "--model", str(tmp_path / "model"), "--log",
                                      str(tmp_path / "log.jsonl"), "--work", str(work), "--strategy", "old",
                                      "--code", str(code)])
    with pytest.raises(SystemExit, match="would import calibkit from"):
        _bench().main()
    assert not (work / "old.state.json").exists() and not (work / "cset").exists()
