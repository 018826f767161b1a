"""The live progress display on a small terminal: the running step and an overall bar stay on screen however
many steps have finished."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from calibkit.cli import _common
from calibkit.progress import ProgressEvent


def _screen(monkeypatch: pytest.MonkeyPatch, finished: int) -> list[str]:
    term = Console(file=io.StringIO(), width=80, height=24, force_terminal=True, color_system=None)
    monkeypatch.setattr(_common, "console", term)
    monkeypatch.setenv("CALIBKIT_PROGRESS", "1")
    bars = _common.RichProgress()
    for i in range(finished):
        bars(ProgressEvent(f"layer {i} sensitivity", 0, 10))
        bars(ProgressEvent(f"layer {i} sensitivity", 10, 10))
    bars(ProgressEvent("the running step", 3, 10, message="chunk 2"))
    with term.capture() as cap:
        term.print(bars._progress.get_renderable())
    return [line for line in cap.get().splitlines() if line.strip()]


def test_the_running_step_stays_on_an_80x24_terminal_after_41_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = _screen(monkeypatch, 41)
    assert len(lines) <= 22, len(lines)
    assert any("the running step" in line and "chunk 2" in line for line in lines)
    assert any("all steps" in line and "41 finished, 1 running" in line for line in lines)
    assert any("layer 40 sensitivity" in line for line in lines)  # the last finished steps are still shown
    assert not any("layer 0 sensitivity" in line for line in lines)


def test_a_finished_step_that_starts_again_is_shown_again(monkeypatch: pytest.MonkeyPatch) -> None:
    term = Console(file=io.StringIO(), width=80, height=24, force_terminal=True, color_system=None)
    monkeypatch.setattr(_common, "console", term)
    monkeypatch.setenv("CALIBKIT_PROGRESS", "1")
    bars = _common.RichProgress()
    for i in range(10):
        bars(ProgressEvent(f"step {i}", 5, 5))
    bars(ProgressEvent("step 0", 1, 5, message="again"))
    with term.capture() as cap:
        term.print(bars._progress.get_renderable())
    text = cap.get()
    assert "again" in text and "9 finished, 1 running" in text and "step 1 " not in text
