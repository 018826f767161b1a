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


def _panel_rows(text: str, panel: str) -> list[str]:
    """The rows of one help panel ("Commands", "Options"), borders stripped."""
    rows, inside = [], False
    for line in text.splitlines():
        if line.startswith("╭─ ") and panel in line:
            inside = True
        elif line.startswith("╰"):
            inside = False
        elif inside:
            rows.append(line.strip("│ \n"))
    return rows


def test_every_command_has_a_one_line_summary_at_80_columns() -> None:
    for group in ([], ["demo"]):
        out = CliRunner().invoke(app, [*group, "--help"], env={"COLUMNS": "80"}).output
        rows = _panel_rows(out, "Commands")
        group_cmd = typer.main.get_command(app)
        for name in group:
            group_cmd = group_cmd.commands[name]  # type: ignore[attr-defined]
        names = list(group_cmd.commands)  # type: ignore[attr-defined]
        # one row per command: a summary that wrapped would add a row that starts with no command name
        assert [r.split()[0] for r in rows] == names, out
        for name in names:
            sub = group_cmd.commands[name]  # type: ignore[attr-defined]
            assert sub.short_help and len(sub.short_help) <= 66, (name, sub.short_help)


def test_flags_show_no_value_type() -> None:
    shown = []
    for path, _cmd in [([], None), *_leaf_commands(typer.main.get_command(app), [])]:
        out = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"}).output
        shown += [(" ".join(path), r) for r in _panel_rows(out, "Options") if "<bool>" in r]
    assert shown == []
    out = CliRunner().invoke(app, ["sample", "--help"], env={"COLUMNS": "200"}).output
    assert "<int>" in out and "<path>" in out  # options that take a value still say which kind


def test_counts_agree_with_their_nouns() -> None:
    from calibkit.cli._common import count

    assert count(1, "node") == "1 node" and count(0, "node") == "0 nodes" and count(2, "layer") == "2 layers"
    assert count(1, "activation range") == "1 activation range" and count(3, "index", "indices") == "3 indices"


def _every_command(cmd, path):  # type: ignore[no-untyped-def]
    """Every command and group, the app itself included."""
    yield path
    for name, sub in (getattr(cmd, "commands", None) or {}).items():
        yield from _every_command(sub, [*path, name])


def test_no_help_row_shows_a_type_after_a_flag() -> None:
    """Flags take no value: typer's ``<bool>`` after ``--help`` (it was shown in `calibkit demo --help`, a group
    whose class typer left as a placeholder) reads as if the flag wanted an argument."""
    shown = {" ".join(path) or "calibkit": _help(path) for path in _every_command(typer.main.get_command(app), [])}
    assert "demo" in shown and "demo run" in shown
    assert [name for name, text in shown.items() if re.search(r"--help\s*<bool>", text)] == []
    assert [name for name, text in shown.items() if "<bool>" in text] == []
