"""SIGTERM and Ctrl-C on the real console script: temporary outputs removed, the exit code and line say which."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from calib_helpers import texts, write_model_dir

from calibkit.data.calibset import write_calibration_set

TESTS = str(Path(__file__).parent)

# the real entry point, with the JSON write slowed down so the signal lands inside calibrate's temporary folder
SCRIPT = """
import sys, time
sys.path.insert(0, {tests!r})
import calibkit.calibrate.pipeline as pipeline
real = pipeline.write_calibration_json
def slow(*args, **kwargs):
    print("writing", flush=True)
    time.sleep(60)
    return real(*args, **kwargs)
pipeline.write_calibration_json = slow
from calibkit.cli import main
sys.argv = ["calibkit", "calibrate", {model!r}, "-c", {cset!r}, "--out", {out!r}]
main()
"""


@pytest.mark.parametrize("sig, code, word", [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")])
def test_a_signal_during_the_write_leaves_no_temporary_folder(tmp_path: Path, sig: int, code: int, word: str) -> None:
    model = write_model_dir(tmp_path / "model")
    cset = write_calibration_set(tmp_path / "set", texts(10, seed=2), None)
    out = tmp_path / "runs" / "cal"
    script = SCRIPT.format(tests=TESTS, model=str(model), cset=str(cset.path), out=str(out))
    env = {**os.environ, "CALIBKIT_CACHE": str(tmp_path / "cache"), "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "writing" not in proc.stdout.readline():
            pass
        assert [p for p in (tmp_path / "runs").iterdir() if p.name.endswith(".tmp")], "inside the temporary folder"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err
    assert word in err and "Traceback" not in err
    assert list((tmp_path / "runs").iterdir()) == [], "nothing half-written, no temporary folder left"
