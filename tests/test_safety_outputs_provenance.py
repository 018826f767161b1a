"""Outputs never touch inputs, found by provenance; the lock beside an output cannot be turned against anyone;
calibkit's documents travel with their folders; deploy's Triton configs are valid by construction."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from calib_helpers import texts, write_model_dir
from typer.testing import CliRunner

from calibkit.cli import app
from calibkit.errors import UsageError
from calibkit.outdirs import guard_output_dir, lock_path, release_claims


def run(*args: object) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


def flat(r: object) -> str:
    return " ".join(r.output.split())  # type: ignore[attr-defined]


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in sorted(root.rglob("*"))}


# ---------------------------------------------------------------- the lock beside the output


@pytest.fixture()
def lock_env(tmp_path: Path) -> tuple[Path, Path]:
    out = tmp_path / "runs" / "cal"
    out.parent.mkdir()
    yield out, lock_path(out)
    release_claims()


def test_a_symlink_at_the_lock_path_is_refused_and_its_target_untouched(lock_env: tuple[Path, Path],
                                                                        tmp_path: Path) -> None:
    out, lock = lock_env
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    lock.symlink_to(victim)
    with pytest.raises(UsageError, match="symbolic link") as err:
        guard_output_dir(out)
    assert str(lock) in err.value.message and err.value.hint
    assert victim.read_text() == "precious" and lock.is_symlink()
    dangling = tmp_path / "nowhere"
    lock.unlink()
    lock.symlink_to(dangling)
    with pytest.raises(UsageError, match="symbolic link"):
        guard_output_dir(out)
    assert not dangling.exists()


@pytest.mark.parametrize("kind", ["foreign file", "hard link", "folder", "fifo"])
def test_anything_calibkit_did_not_create_at_the_lock_path_is_refused(lock_env: tuple[Path, Path], tmp_path: Path,
                                                                      kind: str) -> None:
    out, lock = lock_env
    victim = tmp_path / "victim.txt"
    victim.write_text("12345")  # digits: what an older calibkit lock held, so only the second name tells
    if kind == "foreign file":
        lock.write_text("my notes")
    elif kind == "hard link":
        os.link(victim, lock)
    elif kind == "folder":
        lock.mkdir()
    else:
        os.mkfifo(lock)
    before = snapshot(tmp_path)
    with pytest.raises(UsageError, match="not a lock calibkit created"):
        guard_output_dir(out)
    assert snapshot(tmp_path) == before and victim.read_text() == "12345"


def test_a_stale_lock_of_a_dead_run_is_taken_over_with_a_message(lock_env: tuple[Path, Path],
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    out, lock = lock_env
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(json.dumps({"format": "calibkit-lock/1", "pid": int(dead.stdout), "host": "h"}))
    with caplog.at_level("WARNING", logger="calibkit.outdirs"):
        guard_output_dir(out)
    assert f"pid {int(dead.stdout)}" in caplog.text and "took over" in caplog.text
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    release_claims()
    assert not lock.exists()


def test_the_lock_beside_the_output_from_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reported case: a link at .NAME.calibkit-lock made `calibrate` truncate its target, exit 0."""
    from calibkit.data.calibset import write_calibration_set

    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    write_model_dir(tmp_path / "model")
    write_calibration_set(tmp_path / "set", texts(20, seed=3), None, {})
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / ".cal.calibkit-lock").symlink_to(victim)
    r = run("calibrate", tmp_path / "model", "-c", tmp_path / "set", "--out", tmp_path / "cal")
    assert r.exit_code == 2, r.output
    assert "symbolic link" in flat(r) and "hint:" in r.output
    assert victim.read_text() == "precious" and not (tmp_path / "cal").exists()
