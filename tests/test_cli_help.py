"""Every --help shows its text as written: brackets in option help ("[default: no limit]", "logits [batch,
classes]") and in command descriptions ("[smooth ->]") were read as rich markup and silently dropped."""

from __future__ import annotations

import re

import typer
from typer.testing import CliRunner

from calibkit.cli import app


def _leaf_commands(cmd, path):  # type: ignore[no-untyped-def]
    subs = getattr(cmd, "commands", None)
    if not subs:
        yield path, cmd
        return
    for name, sub in subs.items():
        yield from _leaf_commands(sub, [*path, name])


def _help(path: list[str]) -> str:
    out = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "400"}).output
    return " ".join(out.replace("│", " ").split())


def test_brackets_in_help_texts_are_shown() -> None:
    missing = []
    for path, cmd in _leaf_commands(typer.main.get_command(app), []):
        shown = _help(path)
        texts = [(p.name, getattr(p, "help", None) or "") for p in cmd.params] + [("description", cmd.help or "")]
        for name, text in texts:
            plain = " ".join(text.replace("\\[", "[").split())
            for bracket in re.findall(r"\[[^\[\]]*\]", plain):
                if bracket not in shown:
                    missing.append((" ".join(path), name, bracket))
    assert missing == []
    assert "[smooth ->]" in _help([])
    assert "[default: no limit]" in _help(["calibrate"])
