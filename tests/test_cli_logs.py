"""Output for logs: piped, compare prints one line per flagged layer with its full node name and a short reason,
`--json -` puts the document on stdout, and progress reaches a log as plain periodic lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from calibkit.cli import app
from calibkit.cli._common import PlainProgress
from calibkit.progress import ProgressEvent
from calibkit.results.codec import parse_result


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from test_compare_tiny import build_engines

    return build_engines(tmp_path_factory.mktemp("logs"))


def test_piped_compare_prints_one_line_per_flagged_layer(engines: dict[str, Path], tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["compare", str(engines["fp"]), str(engines["int8"]), "-e", str(engines["eval"]),
                                 "--no-report", "--no-sensitivity", "--threshold-sqnr", "200", "--batch-size", "16"])
    assert r.exit_code == 0, r.output
    lines = [x for x in r.stdout.splitlines() if x.startswith("layer ")]
    assert len(lines) == 3  # every layer is under a 200 dB bar: each on its own line, no table
    for line, node in zip(lines, ("fc1", "fc2", "classifier")):
        assert f" {node}: " in line and len(line) < 200, line
    assert "3 of 3 quantized layer inputs flagged" in r.stdout and "own SQNR" not in r.stdout  # no layer table


def test_json_dash_prints_the_document_on_stdout(engines: dict[str, Path]) -> None:
    r = CliRunner().invoke(app, ["compare", str(engines["fp"]), str(engines["int8"]), "-e", str(engines["eval"]),
                                 "--no-report", "--no-sensitivity", "--json", "-", "--limit", "40"])
    assert r.exit_code == 0, r.output
    result = parse_result(json.loads(r.stdout))
    assert result.eval_set.count == 40 and len(result.engines) == 2


def test_plain_progress_lines_are_periodic() -> None:
    now = [0.0]
    lines: list[str] = []
    p = PlainProgress(interval=10, write=lines.append)
    p._clock = lambda: now[0]  # type: ignore[method-assign]
    for t in range(0, 31):
        now[0] = float(t)
        p(ProgressEvent("evaluate A", t, 30, "batch"))
    assert lines == ["progress: evaluate A 10/30 (batch), 10 s", "progress: evaluate A 20/30 (batch), 20 s",
                     "progress: evaluate A 30/30 (batch), 30 s"]
    p(ProgressEvent("quick", 0, 2))
    p(ProgressEvent("quick", 2, 2))  # a task shorter than the interval leaves no line
    assert len(lines) == 3
