"""`calibkit demo prepare` on the command line: help, bad input, errors as one message and an exit code."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from calibkit.cli import app
from calibkit.demo import archive
from calibkit.errors import MissingDependencyError


def test_prepare_help_teaches() -> None:
    result = CliRunner().invoke(app, ["demo", "prepare", "--help"])
    assert result.exit_code == 0
    for flag in ("--out", "--fast", "--log-lines", "--seed"):
        assert flag in result.output
    assert "calibkit demo prepare --fast" in result.output


def test_bad_log_lines_is_rejected(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["demo", "prepare", "--out", str(tmp_path / "d"), "--log-lines", "0"])
    assert result.exit_code == 2
    assert not (tmp_path / "d").exists()


def test_offline_is_one_message_no_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(cache: object = None, progress: object = None) -> Path:
        raise MissingDependencyError("could not download vaderSentiment==3.3.2 from PyPI", hint="check network")

    monkeypatch.setattr(archive, "fetch_archive", offline)
    result = CliRunner().invoke(app, ["demo", "prepare", "--out", str(tmp_path / "d"), "--no-progress"])
    assert result.exit_code == MissingDependencyError.exit_code
    assert "could not download" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "d" / "prepare.json").exists()
