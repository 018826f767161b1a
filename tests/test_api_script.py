"""The Python API run as a plain script: spawned workers import the main script again, so calls at its unguarded
top level are refused at the first call that starts workers, before anything runs twice."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from calib_helpers import sample_record, texts, tiny_model, write_tokenizer

import calibkit as ck
from calibkit.data.calibset import write_calibration_set

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """import calibkit as ck
print("run", flush=True)
{indent}cs = ck.sample({log!r}, {set!r}, size=20)
{indent}cal = ck.calibrate({model!r}, cs, {out!r}, method="minmax", executor="local:2")
{indent}print("done", flush=True)
"""


def _script(tmp_path: Path, guarded: bool) -> subprocess.CompletedProcess[str]:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    write_tokenizer(model)
    onnx.save(tiny_model(), str(model / "model.onnx"))
    log = tmp_path / "logs.jsonl"
    log.write_text("".join(f'{{"text": "{t}"}}\n' for t in texts(60, seed=2)))
    body = SCRIPT.format(indent="    " if guarded else "", log=str(log), set=str(tmp_path / "set"),
                         model=str(model), out=str(tmp_path / "cal"))
    if guarded:
        lines = body.splitlines(keepends=True)
        body = "".join(lines[:2]) + 'if __name__ == "__main__":\n' + "".join(lines[2:])
    path = tmp_path / "script.py"
    path.write_text(body)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CALIBKIT_CACHE": str(tmp_path / "cache")}
    try:
        return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=180, env=env,
                              cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail("the script hung")


def test_an_unguarded_script_is_refused_before_it_runs_twice(tmp_path: Path) -> None:
    proc = _script(tmp_path, guarded=False)
    assert proc.returncode != 0
    assert 'if __name__ == "__main__":' in proc.stderr and "at line 4, at its top level" in proc.stderr
    assert proc.stdout.splitlines() == ["run"], proc.stdout  # no worker ran the script again
    assert not (tmp_path / "cal").exists()


def test_the_same_script_under_the_guard_runs(tmp_path: Path) -> None:
    proc = _script(tmp_path, guarded=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "done" and proc.stdout.count("done") == 1
    assert (tmp_path / "cal" / "model.int8.onnx").is_file()


@pytest.mark.parametrize("name", ck._API)
def test_every_api_function_shows_its_own_signature(name: str) -> None:
    from calibkit import api

    assert inspect.signature(getattr(ck, name)) == inspect.signature(getattr(api, name))
    assert "*args" not in str(inspect.signature(getattr(ck, name)))


def test_a_calibration_set_repr_is_short(tmp_path: Path) -> None:
    cs = write_calibration_set(tmp_path / "set", [f"text number {i} " * 40 for i in range(3000)], None,
                               sample_record(tmp_path / "drawn", "logs.jsonl"))
    text = repr(cs)
    assert len(text) < 300, len(text)
    assert "3000 texts" in text and str(tmp_path / "set") in text and cs.id[:12] in text
