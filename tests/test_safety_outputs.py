"""Output folders: nothing calibkit did not write is ever deleted; inputs are never outputs."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from calib_helpers import texts, write_model_dir
from cli_helpers import claimed_elsewhere, flat, full_disk_on_html, run

from calibkit._io import atomic_dir, write_text
from calibkit.data.calibset import write_calibration_set
from calibkit.errors import UsageError
from calibkit.outdirs import MARKER, clean_stale_tmp, write_marker


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def user_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "thesis.docx").write_bytes(b"four years of work")
    (path / "photos").mkdir()
    (path / "photos" / "a.jpg").write_bytes(b"\xff\xd8")
    return path


@pytest.fixture()
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    write_model_dir(tmp_path / "model")
    write_calibration_set(tmp_path / "set", texts(20, seed=3), None)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "prod.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(60, seed=1)))
    (logs / "other.jsonl").write_text('{"text": "a sibling log"}\n')
    (tmp_path / "eval.jsonl").write_text(
        "".join(json.dumps({"text": t, "label": ["negative", "positive"][i % 2]}) + "\n"
                for i, t in enumerate(texts(16, seed=2))))
    return tmp_path


def _commands(tmp: Path, out: Path) -> dict[str, list[object]]:
    return {
        "sample": ["sample", tmp / "logs" / "prod.jsonl", "--size", "8", "--clusters", "1", "--out", out],
        "calibrate": ["calibrate", tmp / "model", "-c", tmp / "set", "--out", out],
        "tune": ["tune", tmp / "model", "-c", tmp / "set", "-e", tmp / "eval.jsonl", "--out", out, "--no-report"],
        "tune --report": ["tune", tmp / "model", "-c", tmp / "set", "-e", tmp / "eval.jsonl", "--out",
                          tmp / "fresh", "--report", out],
        "compare --report": ["compare", tmp / "a.onnx", tmp / "b.onnx", "-e", tmp / "eval.jsonl", "--report", out],
        "report": ["report", tmp / "doc.json", "--out", out],
    }


@pytest.mark.parametrize("command", ["sample", "calibrate", "tune", "tune --report", "compare --report", "report"])
def test_a_folder_of_user_files_is_never_replaced(env: Path, command: str) -> None:
    out = user_folder(env / "mine")
    (env / "doc.json").write_text("{}")
    before = snapshot(env)
    r = run(*_commands(env, out)[command])
    assert r.exit_code == 2, r.output
    assert "calibkit did not write" in flat(r) and "--force" in flat(r) and "Traceback" not in r.output
    assert snapshot(env) == before


def test_force_never_moves_or_deletes_a_folder_of_user_files(env: Path) -> None:
    out = user_folder(env / "mine")
    before = snapshot(env)
    r = run(*_commands(env, out)["sample"], "--force")
    assert r.exit_code == 2, r.output
    assert "thesis.docx" in flat(r) and "photos/a.jpg" in flat(r) and "Traceback" not in r.output
    assert snapshot(env) == before and not [p for p in env.iterdir() if ".replaced-" in p.name]


def test_a_folder_calibkit_wrote_is_replaced_but_not_after_the_user_added_files(env: Path) -> None:
    out = env / "cal"
    assert run(*_commands(env, out)["calibrate"]).exit_code == 0
    r = run(*_commands(env, out)["calibrate"], "--method", "minmax")
    assert r.exit_code == 0, r.output
    (out / "notes.txt").write_text("my notes on this run")
    r = run(*_commands(env, out)["calibrate"])
    assert r.exit_code == 2 and (out / "notes.txt").read_text() == "my notes on this run"


@pytest.mark.parametrize("case", ["model", "inside model", "set", "log folder", "log file", "parent of set"])
def test_inputs_are_never_outputs_even_with_force(env: Path, case: str) -> None:
    args = {
        "model": ["calibrate", env / "model", "-c", env / "set", "--out", env / "model"],
        "inside model": ["calibrate", env / "model", "-c", env / "set", "--out", env / "model" / "runs"],
        "set": ["calibrate", env / "model", "-c", env / "set", "--out", env / "set"],
        "log folder": ["sample", env / "logs" / "prod.jsonl", "--size", "8", "--out", env / "logs"],
        "log file": ["sample", env / "logs" / "prod.jsonl", "--size", "8", "--out", env / "logs" / "prod.jsonl"],
        "parent of set": ["calibrate", env / "model", "-c", env / "set", "--out", env],
    }[case]
    before = snapshot(env)
    r = run(*args, "--force")
    assert r.exit_code == 2, r.output
    assert "never writes over its inputs" in flat(r)
    assert snapshot(env) == before


def test_an_existing_file_as_out_is_refused_not_moved(env: Path) -> None:
    target = env / "results"
    target.write_text("keep me")
    for _ in range(2):  # the rerun used to fail with NotADirectoryError
        r = run(*_commands(env, target)["calibrate"], "--force")
        assert r.exit_code == 2 and "existing file" in flat(r)
    assert target.read_text() == "keep me" and not (env / ".results.old").exists()


def test_build_and_compare_json_never_overwrite_foreign_files(env: Path) -> None:
    mine = env / "notes.onnx"
    mine.write_bytes(b"not an engine")
    r = run("build", env / "model", "--precision", "fp32", "-o", mine)
    assert r.exit_code == 2 and mine.read_bytes() == b"not an engine"
    r = run("build", env / "model", "--precision", "fp32", "-o", env / "model" / "model.onnx")
    assert r.exit_code == 2
    ok = env / "engines" / "fp32.onnx"
    assert run("build", env / "model", "--precision", "fp32", "-o", ok).exit_code == 0
    assert run("build", env / "model", "--precision", "fp32", "-o", ok).exit_code == 0  # its own engine: replaced
    (env / "mine.json").write_text('{"my": "data"}')
    r = run("compare", ok, ok, "-e", env / "eval.jsonl", "--json", env / "mine.json", "--no-report")
    assert r.exit_code == 2 and json.loads((env / "mine.json").read_text()) == {"my": "data"}


@pytest.mark.parametrize("where", ["json is a folder", "json under a file", "unwritable --out", "unwritable json"])
def test_unwritable_outputs_fail_before_any_work(env: Path, where: str) -> None:
    ro = Path("/sys/calibkit-test")
    if where.startswith("unwritable") and os.access("/sys", os.W_OK) and os.geteuid() != 0:
        pytest.skip("/sys is writable here")
    (env / "afile").write_text("x")
    args = {
        "json is a folder": ["compare", env / "no-such-a.onnx", env / "b.onnx", "-e", env / "eval.jsonl",
                             "--json", env, "--no-report"],
        "json under a file": ["compare", env / "no-such-a.onnx", env / "b.onnx", "-e", env / "eval.jsonl",
                              "--json", env / "afile" / "x.json", "--no-report"],
        "unwritable --out": ["calibrate", env / "model", "-c", env / "set", "--out", ro / "out"],
        "unwritable json": ["compare", env / "no-such-a.onnx", env / "b.onnx", "-e", env / "eval.jsonl",
                            "--json", ro / "c.json", "--no-report"],
    }[where]
    r = run(*args)
    # exit 2 from the output check, before the engines (which do not exist: exit 4) are even looked at
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and "hint:" in r.output


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_folder_fails_before_work(env: Path) -> None:
    ro = env / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        r = run(*_commands(env, ro / "out")["calibrate"])
        assert r.exit_code == 2 and "not writable" in flat(r)
    finally:
        ro.chmod(0o755)


def test_stale_temporary_folders_of_dead_writers_are_cleaned(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / ".out.abc123.tmp"
    stale.mkdir()
    (stale / "model.int8.onnx").write_bytes(b"partial")
    write_marker(stale)
    (stale / MARKER).write_text((stale / MARKER).read_text().replace(f'"pid": {os.getpid()}', f'"pid": {dead_pid}'))
    live = tmp_path / ".out.live.tmp"
    live.mkdir()
    write_marker(live)  # this process: still writing
    user = tmp_path / ".out.mine.tmp"
    user.mkdir()
    (user / "x").write_text("not calibkit's")
    with atomic_dir(tmp_path / "out") as d:
        (d / "a.txt").write_text("a")
    assert not stale.exists() and live.is_dir() and (user / "x").is_file()
    assert clean_stale_tmp(tmp_path / "out") == []


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_outputs_get_the_umask_permissions(tmp_path: Path, mask: int) -> None:
    old = os.umask(mask)
    try:
        with atomic_dir(tmp_path / "out") as d:
            write_text(d / "f.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o777 & ~mask
    assert stat.S_IMODE((tmp_path / "out" / "f.txt").stat().st_mode) == 0o666 & ~mask


def test_atomic_dir_refuses_foreign_folders_at_library_level(tmp_path: Path) -> None:
    out = user_folder(tmp_path / "o")
    with pytest.raises(UsageError, match="thesis.docx"):
        with atomic_dir(out) as d:
            (d / "a").write_text("a")
    assert (out / "thesis.docx").is_file() and [p.name for p in tmp_path.iterdir()] == ["o"]


def test_demo_prepare_refuses_a_folder_of_user_files(tmp_path: Path) -> None:
    out = user_folder(tmp_path / "demo")
    before = snapshot(tmp_path)
    r = run("demo", "prepare", "--fast", "--out", out)
    assert r.exit_code == 2 and "calibkit did not write" in flat(r)
    assert snapshot(tmp_path) == before


def test_paths_with_rich_markup_are_printed_as_they_are(env: Path) -> None:
    out = env / "[/x]" / "[bold]set"
    r = run(*_commands(env, out)["sample"])
    assert r.exit_code == 0, r.output
    assert (out / "texts.jsonl").is_file() and "[bold]set" in r.output


def test_the_current_folder_and_report_inputs_are_never_replaced(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (env / "doc.json").write_text("{}")
    monkeypatch.chdir(env / "logs")
    before = snapshot(env)
    for args in (["report", env / "doc.json", "--out", env, "--force"],
                 ["sample", "prod.jsonl", "--size", "8", "--out", ".", "--force"],
                 ["sample", "prod.jsonl", "--size", "8", "--out", "..", "--force"]):
        r = run(*args)
        assert r.exit_code == 2, r.output
    assert snapshot(env) == before


def test_stale_cleanup_handles_names_with_glob_characters(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / ".[x]out.abc.tmp"
    stale.mkdir()
    write_marker(stale)
    (stale / MARKER).write_text((stale / MARKER).read_text().replace(f'"pid": {os.getpid()}',
                                                                     f'"pid": {int(dead.stdout)}'))
    assert clean_stale_tmp(tmp_path / "[x]out") == [stale]


def test_two_runs_into_one_out_folder(tmp_path: Path) -> None:
    """The second run is refused while the first lives, and may go ahead once it has ended (however it ended)."""
    import signal

    from calibkit.errors import UsageError
    from calibkit.outdirs import guard_output_dir

    out = tmp_path / "runs" / "cal"
    first = claimed_elsewhere(out)
    try:
        with pytest.raises(UsageError, match=rf"being written by another calibkit run \(pid {first.pid}\)"):
            guard_output_dir(out)
        first.send_signal(signal.SIGKILL)
        first.wait()
        guard_output_dir(out)  # the kernel released the dead run's lock
        guard_output_dir(out)  # and this process may claim its own output again
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        if first.stdout is not None:
            first.stdout.close()
    from calibkit.outdirs import release_claims

    release_claims()  # the end of a command: its lock file is removed while still held
    assert not (tmp_path / "runs").exists() or [p.name for p in (tmp_path / "runs").iterdir()] == []


def test_one_writer_per_out_does_not_depend_on_tmpdir(tmp_path: Path) -> None:
    """Fixed: two runs with different TMPDIRs (and another spelling of the same folder) still collide."""
    from calibkit.errors import UsageError
    from calibkit.outdirs import guard_output_dir, lock_path, release_claims

    (tmp_path / "tmp-a").mkdir()
    (tmp_path / "tmp-b").mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "runs")
    out = tmp_path / "runs" / "cal"
    first = claimed_elsewhere(out, {**os.environ, "TMPDIR": str(tmp_path / "tmp-a")})
    try:
        assert lock_path(out).is_file() and lock_path(out).parent == tmp_path / "runs"
        other = {**os.environ, "TMPDIR": str(tmp_path / "tmp-b")}
        probe = subprocess.run(
            [sys.executable, "-c", "from pathlib import Path; from calibkit.outdirs import claim_output\n"
                                   f"claim_output(Path({str(tmp_path / 'alias' / 'cal')!r}))"],
            capture_output=True, text=True, env=other)
        assert probe.returncode != 0 and f"pid {first.pid}" in probe.stderr, probe.stderr
        with pytest.raises(UsageError, match="being written by another calibkit run"):
            guard_output_dir(out)
    finally:
        first.kill()
        first.wait()
        if first.stdout is not None:
            first.stdout.close()
    guard_output_dir(tmp_path / "alias" / "cal")
    release_claims()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == []
    assert list((tmp_path / "tmp-a").iterdir()) == [] and list((tmp_path / "tmp-b").iterdir()) == []


@pytest.mark.parametrize("kind", ["loop", "to-empty-folder", "dangling"])
def test_a_symlink_out_is_refused_before_any_work(env: Path, kind: str) -> None:
    link = env / "outlink"
    if kind == "loop":
        link.symlink_to(link.name)
    elif kind == "to-empty-folder":
        (env / "empty").mkdir()
        link.symlink_to(env / "empty")
    else:
        link.symlink_to(env / "nowhere")
    before = snapshot(env)
    r = run(*_commands(env, link)["calibrate"])
    assert r.exit_code == 2, r.output
    assert "symbolic link" in flat(r) and "hint:" in r.output and "Traceback" not in r.output
    assert snapshot(env) == before  # no .outlink.*.old / .tmp left, nothing written
    assert not list(env.glob(".outlink*"))
    if kind == "to-empty-folder":
        assert f"--out {env / 'empty'}" in flat(r)


def test_commit_together_swaps_all_outputs_or_none(tmp_path: Path) -> None:
    from calibkit._io import atomic_dir, commit_together, write_json

    (tmp_path / "doc.json").write_text("old json")
    with atomic_dir(tmp_path / "rep") as d:
        (d / "report.md").write_text("old report")
    before = snapshot(tmp_path)
    with pytest.raises(OSError), commit_together():
        write_json(tmp_path / "doc.json", {"new": 1})
        assert (tmp_path / "doc.json").read_text() == "old json"  # staged, not yet swapped in
        with atomic_dir(tmp_path / "rep") as d:
            write_text(d / "report.md", "new report")  # a file inside a staged folder is written in place
            raise OSError(28, "No space left on device")
    assert snapshot(tmp_path) == before  # nothing replaced, nothing staged left behind
    with commit_together():
        write_json(tmp_path / "doc.json", {"new": 1})
        with atomic_dir(tmp_path / "rep") as d:
            write_text(d / "report.md", "new report")
    assert json.loads((tmp_path / "doc.json").read_text()) == {"new": 1}
    assert (tmp_path / "rep" / "report.md").read_text() == "new report"
    assert json.loads((tmp_path / "rep" / MARKER).read_text())["entries"] == ["report.md"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc.json", "rep"]


def test_compare_failing_on_a_full_disk_keeps_json_and_report_of_one_run(env: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Fixed: --json was already replaced by the new run while the report folder kept the old one."""


    engine = env / "e" / "fp32.onnx"
    assert run("build", env / "model", "-p", "fp32", "-o", engine).exit_code == 0
    args = ["compare", engine, engine, "-e", env / "eval.jsonl", "--json", env / "out.json", "--report", env / "rep",
            "--no-layers"]
    assert run(*args).exit_code == 0
    doc = json.loads((env / "out.json").read_text())
    doc["marker-of-the-first-run"] = True
    (env / "out.json").write_text(json.dumps(doc))
    (env / "rep" / "report.json").write_text(json.dumps(doc))
    before = snapshot(env)

    full_disk_on_html(monkeypatch)
    r = run(*args)
    assert r.exit_code == 2 and "No space left" in r.output and "hint:" in r.output, r.output
    assert snapshot(env) == before  # both outputs of the first run, nothing staged left


def test_emoji_codes_in_paths_and_texts_are_printed_as_they_are(env: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Fixed: rich expanded ":x:" in printed paths (and table cells) into an emoji."""
    monkeypatch.chdir(env)
    folder = env / ":x:"
    folder.mkdir()
    log = Path(":x:") / ":smile:.jsonl"
    log.write_text("".join(json.dumps({"text": f"{t} :thumbs_up:"}) + "\n" for t in texts(30, seed=4)))
    out = Path(":warning:out")
    r = run("sample", log, "--size", "8", "--clusters", "1", "--out", out)
    assert r.exit_code == 0, r.output
    squash = "".join(ch for ch in r.output if not ch.isspace() and ch not in "│┃")  # table cells wrap
    assert ":x:/:smile:.jsonl" in squash and ":warning:out" in squash, r.output
    assert not any(ch in r.output for ch in "\u274c\U0001f604\u26a0\U0001f44d"), r.output
    engine = env / ":x:" / "fp32.onnx"
    assert run("build", env / "model", "-p", "fp32", "-o", engine).exit_code == 0
    ev = folder / ":smile:eval.jsonl"
    ev.write_text((env / "eval.jsonl").read_text())
    r = run("compare", engine, engine, "-e", ev, "--no-report", "--no-layers")
    assert r.exit_code == 0, r.output
    assert ":smile:eval.jsonl" in r.output.replace("\n", ""), r.output
    assert not any(ch in r.output for ch in "\u274c\U0001f604"), r.output
    r = run("calibrate", env / "model", "-c", env / "set", "--out", env / ":x:" / "[/x]:x:")
    assert r.exit_code == 0 and ":x:" in r.output and "\u274c" not in r.output, r.output
