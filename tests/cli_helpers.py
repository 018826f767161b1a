"""The command line as the tests drive it: one invocation (:func:`run`), its output on one line (:func:`flat`),
every leaf command with its path (:func:`command_leaves`), and the small folder of inputs and engines several of
their module fixtures share (:func:`build_engines`)."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
import typer
from calib_helpers import texts, write_model_dir
from click.testing import Result
from typer.testing import CliRunner

from calibkit.cli import app
from calibkit.data.calibset import write_calibration_set

LABELS = ("negative", "positive")


def run(*args: object) -> Result:
    """``calibkit ARGS`` in this process (each argument as its string)."""
    return CliRunner().invoke(app, [str(a) for a in args])


def command_leaves(cmd: typer.main.click.Command, path: list[str] | None = None
                   ) -> Iterator[tuple[list[str], typer.main.click.Command]]:
    """Every command under ``cmd`` that has no subcommands, with the words that name it (``["demo", "run"]``)."""
    path = path or []
    subs = getattr(cmd, "commands", None)
    if not subs:
        yield path, cmd
        return
    for name, sub in subs.items():
        yield from command_leaves(sub, [*path, name])


def flat(r: Result) -> str:
    """A run's output with its line breaks and runs of spaces folded (rich wraps long messages)."""
    return " ".join(r.output.split())


def write_eval_set(path: Path, eval_texts: Sequence[str]) -> None:
    """``eval_texts`` as a JSON Lines eval set, labelled negative and positive in turn."""
    path.write_text("".join(json.dumps({"text": t, "label": LABELS[i % 2]}) + "\n" for i, t in enumerate(eval_texts)))


def build_engines(tmp: Path, *, calibration_texts: int = 20, eval_texts: Sequence[str] = ()) -> Path:
    """``tmp`` holding the tiny model (model/), a calibration set of ``calibration_texts`` texts (set/), the
    eval set ``eval_texts`` (eval.jsonl, when given), its minmax calibration (cal/) and the FP32 and INT8
    engines (e/fp32.onnx, e/int8.onnx), the statistics cache under ``tmp``; returns ``tmp``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CALIBKIT_CACHE", str(tmp / "cache"))
        write_model_dir(tmp / "model")
        write_calibration_set(tmp / "set", texts(calibration_texts, seed=3), None)
        if eval_texts:
            write_eval_set(tmp / "eval.jsonl", eval_texts)
        for args in (["calibrate", tmp / "model", "-c", tmp / "set", "--method", "minmax", "--out", tmp / "cal"],
                     ["build", tmp / "model", "-p", "fp32", "-o", tmp / "e" / "fp32.onnx"],
                     ["build", tmp / "model", "-p", "int8", "--calibration", tmp / "cal", "-o",
                      tmp / "e" / "int8.onnx"]):
            r = run(*args)
            assert r.exit_code == 0, r.output
    return tmp


def claimed_elsewhere(out: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    """Another process that claims ``out`` as a calibkit run writing it does, and holds it for a minute; returned
    once it holds it (the caller kills it)."""
    script = ("import time; from pathlib import Path; from calibkit.outdirs import claim_output\n"
              f"claim_output(Path({str(out)!r})); print('claimed', flush=True); time.sleep(60)\n")
    first = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    if first.stdout is None or first.stdout.readline().strip() != "claimed":
        first.kill()
        first.wait()
        raise AssertionError("the other process did not claim the output")
    return first


def full_disk_on_html(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report renderer's writes of .html files fail as on a full disk; every other write goes through."""
    from calibkit.report import render

    real = render.write_text

    def full(path: object, text: str) -> None:
        if str(path).endswith(".html"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, text)  # type: ignore[arg-type]

    monkeypatch.setattr(render, "write_text", full)
