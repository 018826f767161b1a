"""Outputs owned file by file: a folder's marker lists every file calibkit wrote in it, recursively, and a file
calibkit did not write is never deleted, moved or overwritten, whatever folder it sits in and whatever
``--force`` says."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from cli_helpers import flat, run

from calibkit._io import atomic_dir
from calibkit.errors import UsageError
from calibkit.outdirs import MARKER, foreign_files, release_claims, write_marker


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def _log(tmp: Path) -> Path:
    log = tmp / "prod.jsonl"
    log.write_text("".join(json.dumps({"text": f"request number {i} about item {i % 7}"}) + "\n" for i in range(40)))
    return log


def test_the_marker_lists_every_file_calibkit_wrote_recursively(tmp_path: Path) -> None:
    with atomic_dir(tmp_path / "o") as d:
        (d / "a.txt").write_text("a")
        (d / "m" / "1").mkdir(parents=True)
        (d / "m" / "1" / "model.onnx").write_text("m")
        (d / "empty").mkdir()
    rec = json.loads((tmp_path / "o" / MARKER).read_text())
    assert rec["files"] == ["a.txt", "empty/", "m/1/model.onnx"]


def test_a_file_the_user_added_inside_a_subfolder_is_never_deleted(tmp_path: Path) -> None:
    out = tmp_path / "repo"
    with atomic_dir(out) as d:
        (d / "model" / "1").mkdir(parents=True)
        (d / "model" / "1" / "model.onnx").write_text("ours")
    (out / "model" / "2").mkdir()
    (out / "model" / "2" / "model.onnx").write_text("the user's own model version")
    before = snapshot(tmp_path)
    with pytest.raises(UsageError, match="model/2/model.onnx"):
        with atomic_dir(out) as d:
            (d / "x").write_text("x")
    assert snapshot(tmp_path) == before


def test_a_marker_without_a_list_of_files_does_not_make_a_folder_replaceable(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    out.mkdir()
    write_marker(out, "demo assets")  # what an older `demo prepare` wrote: no list of what it holds
    (out / "thesis.docx").write_bytes(b"four years of work")
    log = _log(tmp_path)
    before = snapshot(tmp_path)
    for extra in ((), ("--force",)):
        r = run("sample", log, "--size", "8", "--clusters", "1", "--out", out, *extra)
        assert r.exit_code == 2, r.output
        assert "thesis.docx" in flat(r) and "Traceback" not in r.output
    assert snapshot(tmp_path) == before


def test_an_older_marker_knows_its_top_level_files_only(tmp_path: Path) -> None:
    out = tmp_path / "old"
    (out / "plots").mkdir(parents=True)
    (out / "report.md").write_text("r")
    (out / "plots" / "a.png").write_bytes(b"png")
    (out / "plots" / "mine.txt").write_text("the user's")
    (out / MARKER).write_text(json.dumps({"format": "calibkit-output/1", "what": "report",
                                          "entries": ["plots", "report.md"]}))
    assert foreign_files(out) == ["plots/a.png", "plots/mine.txt"]  # nothing recorded below the top
    assert foreign_files(out, ["plots/*.png"]) == ["plots/mine.txt"]  # the names the command writes


def test_report_in_place_with_force_never_moves_its_input(tmp_path: Path) -> None:
    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / "report.json").write_text("{}")
    (rep / "notes.txt").write_text("my notes")
    before = snapshot(tmp_path)
    r = run("report", rep / "report.json", "--force")
    assert r.exit_code == 2, r.output
    assert "notes.txt" in flat(r) and "Traceback" not in r.output
    assert snapshot(tmp_path) == before


def test_a_folder_calibkit_wrote_is_still_replaced(tmp_path: Path) -> None:
    log = _log(tmp_path)
    out = tmp_path / "set"
    for _ in range(2):
        r = run("sample", log, "--size", "8", "--clusters", "1", "--out", out)
        assert r.exit_code == 0, r.output
    rec = json.loads((out / MARKER).read_text())
    assert set(rec["files"]) >= {"texts.jsonl", "manifest.json"}


def test_two_threads_writing_one_output_one_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "o"
    inside, done = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def first() -> None:
        try:
            with atomic_dir(out) as d:
                (d / "first.txt").write_text("first")
                inside.set()
                done.wait(30)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=first)
    t.start()
    assert inside.wait(30)
    try:
        with pytest.raises(UsageError, match="another thread of this process"):
            with atomic_dir(out) as d:
                (d / "second.txt").write_text("second")
    finally:
        done.set()
        t.join(30)
    assert not errors and sorted(p.name for p in out.iterdir()) == [MARKER, "first.txt"]
    with atomic_dir(out) as d:  # released when the first writer finished: the next one may write
        (d / "second.txt").write_text("second")
    assert (out / "second.txt").is_file() and not list(tmp_path.glob(".o.calibkit-lock"))


def test_a_command_and_a_thread_claiming_one_out(tmp_path: Path) -> None:
    from calibkit.outdirs import claim_output

    out = tmp_path / "o"
    assert claim_output(out) is True and claim_output(out) is False  # the same thread again: already its own
    seen: list[BaseException] = []
    t = threading.Thread(target=lambda: _catch(seen, lambda: claim_output(out)))
    t.start()
    t.join(30)
    try:
        assert len(seen) == 1 and "another thread" in str(seen[0])
    finally:
        release_claims()


def _catch(seen: list[BaseException], fn: object) -> None:
    try:
        fn()  # type: ignore[operator]
    except BaseException as exc:  # noqa: BLE001 - the test looks at it
        seen.append(exc)


def test_demo_prepare_records_the_files_of_its_steps_not_the_users(tmp_path: Path) -> None:
    from calibkit.demo.prepare import _files_written

    out = tmp_path / "demo"
    (out / "data").mkdir(parents=True)
    (out / "data" / "train.jsonl").write_text("{}\n")
    (out / "logs.jsonl").write_text("{}\n")
    (out / "prepare.json").write_text("{}")
    with atomic_dir(out / "model") as d:
        (d / "model.onnx").write_text("m")
    (out / "data" / "mine.csv").write_text("the user's")  # added by the user: never claimed
    manifest = {"steps": {"data": {"files": {"data/train.jsonl": "x"}}, "logs": {"files": {"logs.jsonl": "y"}}}}
    write_marker(out, "demo assets", files=_files_written(out, manifest))
    assert foreign_files(out) == ["data/mine.csv"]
