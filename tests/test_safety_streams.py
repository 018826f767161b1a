"""The real console script against its streams and signals: a closed or broken stdout ends quietly with 141, and
SIGTERM ends a run with 143 and one line saying so at any moment (during the imports, while options are parsed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from calib_helpers import texts
from cli_helpers import build_engines
from typer.testing import CliRunner

from calibkit.cli import app

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_engines(tmp_path_factory.mktemp("streams"), calibration_texts=16, eval_texts=texts(24, seed=5))


def _compare_json_stdout(engines: Path) -> list[str]:
    return [sys.executable, "-m", "calibkit", "compare", str(engines / "e" / "fp32.onnx"),
            str(engines / "e" / "int8.onnx"), "-e", str(engines / "eval.jsonl"), "--json", "-", "--no-report",
            "--no-layers", "--no-traffic"]


def test_json_to_a_closed_stdout_ends_quietly(engines: Path) -> None:
    """``compare --json - >&-``: an AttributeError (exit 1, "this is a bug") before."""
    r = subprocess.run(_compare_json_stdout(engines), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       env=ENV, preexec_fn=lambda: os.close(1), timeout=120, check=False)
    assert r.returncode == 141, r.stderr
    assert "error" not in r.stderr and "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr


def test_json_to_a_broken_pipe_ends_quietly(engines: Path) -> None:
    """``compare --json - | head -c0``: exit 2 with a disk-space hint before."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte
    try:
        r = subprocess.run(_compare_json_stdout(engines), stdin=subprocess.DEVNULL, stdout=write,
                           stderr=subprocess.PIPE, text=True, env=ENV, timeout=120, check=False)
    finally:
        os.close(write)
    assert r.returncode == 141, r.stderr
    assert "error" not in r.stderr and "disk" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr


def test_a_summary_to_a_broken_pipe_ends_quietly(engines: Path, tmp_path: Path) -> None:
    """The plain summary lines go through rich, whose own answer to a broken pipe was SystemExit(1)."""
    read, write = os.pipe()
    os.close(read)
    args = [a for a in _compare_json_stdout(engines) if a not in ("--json", "-")]
    try:
        r = subprocess.run(args, stdin=subprocess.DEVNULL, stdout=write, stderr=subprocess.PIPE, text=True, env=ENV,
                           timeout=120, check=False, cwd=tmp_path)
    finally:
        os.close(write)
    assert r.returncode == 141 and "Exception ignored" not in r.stderr and "error" not in r.stderr, r.stderr


def test_help_to_a_broken_pipe_ends_quietly() -> None:
    """``calibkit --help | head -c0``: typer's answer outside a command was exit 1."""
    read, write = os.pipe()
    os.close(read)
    try:
        r = subprocess.run([sys.executable, "-m", "calibkit", "--help"], stdin=subprocess.DEVNULL, stdout=write,
                           stderr=subprocess.PIPE, text=True, env=ENV, timeout=60, check=False)
    finally:
        os.close(write)
    assert r.returncode == 141 and r.stderr == "", r.stderr


# the real entry point, held at one moment (the import of a command module, or the root callback that runs
# while typer parses the command line) until the signal comes
HOLD = """
import sys, time, importlib.abc
def hold():
    print("holding", flush=True)
    time.sleep(60)
class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "calibkit.cli.sample" and {during_imports}:
            hold()
        return None
sys.meta_path.insert(0, Finder())
if not {during_imports}:
    try:
        import calibkit.cli._app as mod
    except ImportError:  # before the entry point was split from the app
        import calibkit.cli as mod
    mod.setup_logging = lambda verbose: hold()
from calibkit.cli import main
sys.argv = ["calibkit", "sample", "missing.jsonl", "--size", "4"]
main()
"""


@pytest.mark.parametrize("during_imports, signals", [(True, 1), (False, 1), (False, 3)],
                         ids=["during-imports", "while-parsing", "three-while-parsing"])
def test_sigterm_at_any_moment_exits_143_with_a_message(tmp_path: Path, during_imports: bool, signals: int) -> None:
    """During the imports the signal killed the process (no handler yet: -15, no word); while typer parsed the
    options it became a KeyboardInterrupt that typer ends with 130 and no word. More SIGTERMs while the first
    unwinds change nothing."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD.format(during_imports=during_imports)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "holding" not in proc.stdout.readline():
            pass
        for _ in range(signals):
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, (proc.returncode, err)
    assert err.count("terminated") == 1 and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------ control characters

ESC = "\x1b[2J\x1b]0;owned\x07\u202e"


def test_a_node_name_with_escape_sequences_is_shown_inert_in_the_report(tmp_path: Path) -> None:
    """A node name from a model anyone may have written reached report.md (and the terminal) raw."""
    doc = {"format": "calibkit-compare/1", "layers": [{"node": f"fc1{ESC}", "flag": "keep-fp16",
                                                      "reasons": [f"clipped {ESC}"]}]}
    (tmp_path / "doc.json").write_text(json.dumps(doc))
    out = tmp_path / f"rep{ESC}"
    r = CliRunner().invoke(app, ["report", str(tmp_path / "doc.json"), "--out", str(out)])
    assert r.exit_code == 0, r.output
    for name in ("report.md", "report.html"):
        shown = (out / name).read_text(encoding="utf-8")
        assert "fc1" in shown and not any(c in shown for c in "\x1b\x07\u202e"), name
        assert "x1b" in shown and "u202e" in shown
    assert "\x1b" not in r.output and "\u202e" not in r.output and "\\x1b[2J" in r.output, r.output


def test_the_terminal_console_escapes_text_but_keeps_its_own_styles() -> None:
    import io

    from rich.table import Table

    from calibkit.cli._common import _Console

    buf = io.StringIO()
    console = _Console(file=buf, force_terminal=True, markup=False, highlight=False, emoji=False, width=100)
    table = Table(title="flagged")
    table.add_column("node")
    table.add_row(f"fc1{ESC}")
    console.print(table)
    console.print("[yellow]warning:[/] x", markup=True)
    shown = buf.getvalue()
    assert "\x1b[2J" not in shown and "\x07" not in shown and "\u202e" not in shown
    assert "\\x1b[2J" in shown and "\\u202e" in shown
    assert "\x1b[33m" in shown  # rich's own colour code still reaches the terminal
    lines = [x for x in shown.splitlines() if x.startswith(("┏", "│", "└"))]
    assert len({len(x) for x in lines}) == 1, lines  # escaped before the layout measured the cell
