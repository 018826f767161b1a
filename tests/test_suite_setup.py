"""The suite's own machinery (tests/conftest.py): shared artefacts are built once per run, and the longest
tests are collected first, so that ``make test``'s workers start them side by side."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import build_once, shared_root

ROOT = Path(__file__).resolve().parents[1]


def test_build_once_builds_once_and_hands_every_caller_the_same_value(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    calls: list[Path] = []

    def build(folder: Path) -> dict[str, str]:
        calls.append(folder)
        folder.mkdir()
        (folder / "artefact.txt").write_text("built")
        return {"path": str(folder / "artefact.txt")}

    name = f"unit-{uuid.uuid4().hex}"
    first = build_once(tmp_path_factory, name, build)
    second = build_once(tmp_path_factory, name, build)
    assert first == second and len(calls) == 1
    assert calls[0] == shared_root(tmp_path_factory) / name and Path(first["path"]).read_text() == "built"


def test_shared_root_is_the_runs_folder_every_worker_sees(tmp_path_factory: pytest.TempPathFactory) -> None:
    base = tmp_path_factory.getbasetemp()
    expected = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    assert shared_root(tmp_path_factory) == expected


def test_the_longest_tests_are_collected_first() -> None:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "tests/test_tasks.py", "tests/test_notebook.py", "tests/test_calib_demo.py"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])})
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    files = list(dict.fromkeys(i.split("::")[0] for i in ids))
    assert files == ["tests/test_notebook.py", "tests/test_calib_demo.py", "tests/test_tasks.py"], done.stdout
