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


def test_without_hard_links_the_lock_is_created_exclusively(lock_env: tuple[Path, Path], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    def no_links(*_: object) -> None:
        raise OSError(errno.EPERM, "hard links are not supported here")

    monkeypatch.setattr(os, "link", no_links)
    out, lock = lock_env
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    lock.symlink_to(victim)
    with pytest.raises(UsageError, match="symbolic link"):
        guard_output_dir(out)
    assert victim.read_text() == "precious"
    lock.unlink()
    guard_output_dir(out)
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    release_claims()
    assert not lock.exists() and sorted(p.name for p in out.parent.iterdir()) == []


def test_the_lock_beside_the_output_from_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reported case: a link at .NAME.calibkit-lock made `calibrate` truncate its target, exit 0."""
    from calibkit.data.calibset import write_calibration_set

    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    write_model_dir(tmp_path / "model")
    write_calibration_set(tmp_path / "set", texts(20, seed=3), None)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / ".cal.calibkit-lock").symlink_to(victim)
    r = run("calibrate", tmp_path / "model", "-c", tmp_path / "set", "--out", tmp_path / "cal")
    assert r.exit_code == 2, r.output
    assert "symbolic link" in flat(r) and "hint:" in r.output
    assert victim.read_text() == "precious" and not (tmp_path / "cal").exists()


def test_runs_started_in_the_same_second_pick_different_default_report_folders(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two test workers ran `tune` in the same second: both picked reports/<stamp>-tune and the second stopped with
    "being written by another calibkit run". A default name that is taken, by a folder or by a live run's lock
    (here another process's), is passed over, and the name returned is already claimed."""
    import datetime as dt

    from calibkit import outdirs

    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz: object = None) -> Frozen:  # type: ignore[override]
            return cls(2026, 12, 6, 15, 54, 0)

    monkeypatch.setattr(outdirs._dt, "datetime", Frozen)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reports").mkdir()
    holder = subprocess.Popen(  # another run holds the first name's lock, as the other worker did
        [sys.executable, "-c", "import sys; from pathlib import Path; from calibkit.outdirs import claim_output; "
         "claim_output(Path(sys.argv[1]), option='--report'); print('held', flush=True); sys.stdin.read()",
         str(tmp_path / "reports" / "20261206-155400-tune")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        (tmp_path / "reports" / "20261206-155400-tune-2").mkdir()  # an earlier run's finished folder
        first = outdirs.default_report_dir("tune")
        second = outdirs.default_report_dir("tune")
        assert (first, second) == (Path("reports/20261206-155400-tune-3"), Path("reports/20261206-155400-tune-4"))
        assert lock_path(first).exists() and lock_path(second).exists()  # claimed before they are returned
        r = run("tune", "--help")  # the command line says what the default is
        assert r.exit_code == 0 and "reports/<time>-tune" in flat(r)
    finally:
        holder.communicate("")
        release_claims()


def test_a_refused_output_leaves_no_default_report_folder_behind(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Picking the default report folder claims it (and makes reports/): it happens only after the other outputs
    are found usable, so a refused --out or --json leaves the working folder as it was."""
    model = write_model_dir(tmp_path / "model")
    (tmp_path / "mine.json").write_text('{"not": "calibkit"}')
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    r = run("tune", model, "-c", tmp_path / "set", "--out", model)
    assert r.exit_code == 2 and "hint:" in r.output, r.output
    r = run("compare", model / "model.onnx", model / "model.onnx", "--json", tmp_path / "mine.json")
    assert r.exit_code == 2 and "hint:" in r.output, r.output
    assert list(work.iterdir()) == []


# ---------------------------------------------------------------- inputs by provenance, for every writer


@pytest.fixture(scope="module")
def proj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """model/, logs/prod.jsonl, set/ (sampled from it: its manifest names the log), cal/ and calB/ (calibrated
    on set/), eng/int8.onnx (built from cal/), engB/int8.onnx (from calB/), eval.jsonl, doc.json."""
    from calibkit.data.sample_pipeline import sample_log
    from calibkit.requests.sample import SampleRequest

    root = tmp_path_factory.mktemp("prov")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CALIBKIT_CACHE", str(root / "cache"))
        model = write_model_dir(root / "model")
        (root / "logs").mkdir()
        log = root / "logs" / "prod.jsonl"
        log.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(80, seed=1)))
        sample_log(SampleRequest(logs=log, out=root / "set", size=24, clusters=1, tokenizer=model))
        for cal, eng in (("cal", "eng"), ("calB", "engB")):
            assert run("calibrate", model, "-c", root / "set", "--method", "minmax", "--out", root / cal).exit_code == 0
            r = run("build", model, "-p", "int8", "--calibration", root / cal, "-o", root / eng / "int8.onnx")
            assert r.exit_code == 0, r.output
        (root / "eval.jsonl").write_text("".join(json.dumps({"text": t, "label": ["negative", "positive"][i % 2]})
                                                 + "\n" for i, t in enumerate(texts(12, seed=2))))
        r = run("compare", root / "eng" / "int8.onnx", root / "engB" / "int8.onnx", "-e", root / "eval.jsonl",
                "--no-layers", "--no-report", "--json", root / "doc.json")
        assert r.exit_code == 0, r.output
    return root


# Every writer of every command: (command, option) -> arguments whose output is an input found by provenance
# (one no argument names) where the command has such inputs, else a given input. A new path option of any
# command fails test_every_path_option_is_known until it is listed here or among the readers.
WRITERS: dict[tuple[str, str], list[str]] = {
    ("deploy", "out"): ["deploy", "{eng}/int8.onnx", "-b", "onnxruntime", "--traffic", "{p}/logs/prod.jsonl",
                            "--out", "{p}/cal"],
    ("compare", "save_outputs"): ["compare", "{eng}/int8.onnx", "{p}/engB/int8.onnx", "-e", "{p}/eval.jsonl",
                                  "--no-report", "--save-outputs", "{p}/calB"],
    ("compare", "json_path"): ["compare", "{eng}/int8.onnx", "{p}/engB/int8.onnx", "-e", "{p}/eval.jsonl",
                               "--no-report", "--json", "{p}/cal/calibration.json"],
    ("compare", "report"): ["compare", "{eng}/int8.onnx", "{p}/engB/int8.onnx", "-e", "{p}/eval.jsonl",
                            "--report", "{p}/model"],
    ("build", "output"): ["build", "{p}/model", "-p", "int8", "--calibration", "{p}/cal", "-o",
                          "{p}/set/int8.onnx"],
    ("calibrate", "out"): ["calibrate", "{p}/model", "-c", "{p}/set", "--out", "{p}/logs"],
    ("smooth", "out"): ["smooth", "{p}/model", "-c", "{p}/set", "--out", "{p}/logs"],
    ("tune", "out"): ["tune", "{p}/model", "-c", "{p}/set", "-e", "{p}/eval.jsonl", "--out", "{p}/logs"],
    ("tune", "report"): ["tune", "{p}/model", "-c", "{p}/set", "-e", "{p}/eval.jsonl", "--out", "{p}/t",
                         "--report", "{p}/logs"],
    ("sample", "out"): ["sample", "{p}/logs/prod.jsonl", "--size", "8", "--out", "{p}/logs"],
    ("report", "out_dir"): ["report", "{p}/doc.json", "--out", "{p}"],
    ("export", "out"): ["export", "{p}/model/model.onnx", "--tokenizer", "{p}/model", "--out", "{p}/model"],
}
# path options that name what a command reads, and writers that read nothing of the user's
READERS = {("smooth", "calibration_set"), ("smooth", "tokenizer"), ("calibrate", "calibration_set"),
           ("calibrate", "tokenizer"), ("calibrate", "from_cache"), ("build", "calibration"), ("build", "qdq"),
           ("build", "tokenizer"), ("build", "calibration_set"), ("compare", "eval_set"), ("compare", "reference"),
           ("tune", "calibration_set"), ("tune", "eval_set"), ("tune", "tokenizer"), ("deploy", "traffic"),
           ("sample", "tokenizer"), ("export", "tokenizer")}
NO_USER_INPUTS = {("demo prepare", "out_dir"), ("demo run", "workdir"), ("demo run", "reports_dir")}


def _path_options() -> set[tuple[str, str]]:
    import inspect

    import typer

    found: set[tuple[str, str]] = set()

    def walk(cmd: object, prefix: str) -> None:
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{prefix} {name}".strip())
        if not hasattr(cmd, "commands"):
            for pname, par in inspect.signature(cmd.callback).parameters.items():  # type: ignore[attr-defined]
                if isinstance(par.default, typer.models.OptionInfo) and "Path" in str(par.annotation):
                    found.add((prefix, pname))

    walk(typer.main.get_command(app), "")
    return found


def test_every_path_option_is_known() -> None:
    assert _path_options() == set(WRITERS) | READERS | NO_USER_INPUTS


@pytest.mark.parametrize("force", [False, True], ids=["", "force"])
@pytest.mark.parametrize("writer", sorted(WRITERS), ids=lambda w: f"{w[0]}-{w[1]}")
def test_every_writer_refuses_inputs_found_by_provenance(proj: Path, writer: tuple[str, str], force: bool,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`deploy ENGINE --out CALDIR` replaced the calibrate folder the engine came from, `compare --save-outputs
    CALDIR` engine B's, and `--save-outputs MODELFOLDER --force` moved the model folder aside (then exit 4)."""
    monkeypatch.setenv("CALIBKIT_CACHE", str(proj / "cache"))
    args = [a.format(p=proj, eng=proj / "eng") for a in WRITERS[writer]]
    before = snapshot(proj)
    r = run(*args, *(["--force"] if force and writer[0] != "build" else []))
    assert r.exit_code == 2, r.output
    assert "never writes over its inputs" in flat(r) and "Traceback" not in r.output
    assert snapshot(proj) == before


def test_the_refusal_says_which_document_names_the_input(proj: Path) -> None:
    r = run(*[a.format(p=proj, eng=proj / "eng") for a in WRITERS[("deploy", "out")]])
    assert r.exit_code == 2
    assert f"is the input {proj / 'cal'}" in flat(r) and "int8.onnx.calibkit.json" in flat(r)


def test_the_library_refuses_save_outputs_over_an_input(proj: Path) -> None:
    import calibkit as ck

    before = snapshot(proj)
    with pytest.raises(UsageError, match="never writes over its inputs"):
        ck.compare(proj / "eng" / "int8.onnx", proj / "engB" / "int8.onnx", proj / "eval.jsonl", layers=False,
                   save_outputs=proj / "calB")
    assert snapshot(proj) == before


# ---------------------------------------------------------------- documents that travel


def _reversed_model(folder: Path, seed: int = 0) -> Path:
    """A model folder like write_model_dir's, with the label names reversed (and other weights for seed != 0)."""
    from calib_helpers import tiny_model

    write_model_dir(folder)
    if seed:
        import onnx

        onnx.save(tiny_model(seed=seed), str(folder / "model.onnx"))
    cfg = json.loads((folder / "config.json").read_text())
    cfg["id2label"] = {"0": "positive", "1": "negative"}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tm/, log.jsonl, set/, cal/ and tune/, every command run from this folder with relative paths (as a user
    types them), so calibration.json used to record paths relative to this working folder."""
    from calibkit.data.sample_pipeline import sample_log
    from calibkit.requests.sample import SampleRequest

    root = tmp_path_factory.mktemp("travel")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CALIBKIT_CACHE", str(root / "cache"))
        mp.chdir(root)
        write_model_dir(Path("tm"))
        Path("log.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(80, seed=1)))
        sample_log(SampleRequest(logs=Path("log.jsonl"), out=Path("set"), size=24, clusters=1, tokenizer=Path("tm")))
        Path("eval.jsonl").write_text("".join(json.dumps({"text": t, "label": ["negative", "positive"][i % 2]})
                                              + "\n" for i, t in enumerate(texts(40, seed=2))))
        assert run("calibrate", "tm", "-c", "set", "--method", "percentile", "--out", "cal").exit_code == 0
        r = run("tune", "tm", "-c", "set", "-e", "eval.jsonl", "--method", "minmax", "--out", "tune", "--no-report",
                "--no-smooth")
        assert r.exit_code == 0, r.output
    return root


def _in_repository(repo: Path, recorded: str) -> Path:
    """A path deploy.json records (relative to the repository: no absolute path of this machine ships)."""
    from calibkit.provenance import document_path

    named = document_path(repo / "deploy.json", recorded)
    assert named is not None and not Path(recorded).is_absolute()
    return named.resolve()


def _deploy(source: Path, out: Path, *extra: object) -> object:
    return run("deploy", source, "-b", "onnxruntime", "--out", out, *extra)


def _deploy_tune(tuned: Path, source: Path, out: Path) -> object:
    return _deploy(source, out, "--traffic", tuned / "log.jsonl")  # tune.json's set is known by its id only


def test_deploy_from_another_folder_uses_the_model_the_folder_names(tuned: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Deploy run from another folder said the model was 'gone'."""
    monkeypatch.setenv("CALIBKIT_CACHE", str(tuned / "cache"))
    monkeypatch.chdir(tmp_path)
    r = _deploy_tune(tuned, tuned / "tune", tmp_path / "repo")
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "repo" / "deploy.json").read_text())
    assert _in_repository(tmp_path / "repo", doc["source"]["model"]) == (tuned / "tm" / "model.onnx").resolve()


def test_another_tm_in_the_working_folder_is_never_deployed(tuned: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Where another ./tm existed, deploy silently served its tokenizer, labels reversed."""
    monkeypatch.setenv("CALIBKIT_CACHE", str(tuned / "cache"))
    _reversed_model(tmp_path / "tm")
    monkeypatch.chdir(tmp_path)
    r = _deploy_tune(tuned, tuned / "tune", tmp_path / "repo")
    assert r.exit_code == 0, r.output
    labels = next((tmp_path / "repo").glob("*/labels.txt"))
    assert labels.read_text() == "negative\npositive\n"
    doc = json.loads((tmp_path / "repo" / "deploy.json").read_text())
    assert _in_repository(tmp_path / "repo", doc["source"]["tokenizer"]) == (tuned / "tm").resolve()


@pytest.mark.parametrize("what", ["tokenizer", "model"])
def test_a_folder_moved_next_to_another_model_is_refused_by_name(tuned: Path, tmp_path: Path, what: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    monkeypatch.setenv("CALIBKIT_CACHE", str(tuned / "cache"))
    shutil.copytree(tuned / "tune", tmp_path / "tune")
    if what == "tokenizer":
        _reversed_model(tmp_path / "tm")
    else:
        shutil.copytree(tuned / "tm", tmp_path / "tm")
        import onnx
        from calib_helpers import tiny_model

        onnx.save(tiny_model(seed=5), str(tmp_path / "tm" / "model.onnx"))
    monkeypatch.chdir(tmp_path)
    r = _deploy_tune(tuned, tmp_path / "tune", tmp_path / "repo")
    assert r.exit_code == 4, r.output
    assert str(tmp_path / "tm") in flat(r) and "calibration.json" in flat(r) and "hint:" in r.output
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize("name", ["model.int8.onnx", "calibration.json"])
def test_a_swapped_file_of_a_tune_folder_is_not_served(tuned: Path, tmp_path: Path, name: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """deploy served a swapped model.int8.onnx or calibration.json while deploy.json listed the plan's layers."""
    import shutil

    monkeypatch.setenv("CALIBKIT_CACHE", str(tuned / "cache"))
    monkeypatch.chdir(tuned)  # where the folder was written: only the swap is wrong
    copy = tuned / f"tune-{name}"
    shutil.copytree(tuned / "tune", copy)
    try:
        shutil.copyfile(tuned / "cal" / name, copy / name)  # another method's table and model
        assert (copy / name).read_bytes() != (tuned / "tune" / name).read_bytes()
        r = _deploy(copy, tmp_path / "repo", "--traffic", tuned / "log.jsonl")
        assert r.exit_code == 4, r.output
        assert name in flat(r) and "changed after" in flat(r) and not (tmp_path / "repo").exists()
    finally:
        shutil.rmtree(copy)


def test_a_copied_tune_folder_names_its_own_smoothed_model(tmp_path: Path) -> None:
    """calibration.json as tune writes it for a plan on the smoothed model (OUT/smoothed-model, named while OUT
    is still being built): a copy of the folder used the original's smoothed model."""
    import shutil

    from calibkit._io import atomic_dir
    from calibkit.quantize.tablefile import load_calibration_json, write_calibration_json
    from calibkit.types import CalibrationTable, Method, MethodParams

    out = tmp_path / "runs" / "tune"
    model = write_model_dir(tmp_path / "model")
    table = CalibrationTable(model_sha256="0" * 64, calibration_set_id="s", method=Method.MINMAX,
                             params=MethodParams(), ranges=())
    with atomic_dir(out) as tmp:
        shutil.copytree(model, tmp / "smoothed-model")
        write_calibration_json(tmp / "calibration.json", table,
                               {"source_model": str(out / "smoothed-model" / "model.onnx"), "tokenizer": str(model)})
    shutil.copytree(out, tmp_path / "runs" / "copy")
    shutil.rmtree(out)
    cf = load_calibration_json(tmp_path / "runs" / "copy")
    assert cf.source_model == (tmp_path / "runs" / "copy" / "smoothed-model" / "model.onnx").resolve()
    assert cf.tokenizer == model.resolve()


def test_an_engine_whose_tokenizer_changed_is_not_deployed(tuned: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    monkeypatch.setenv("CALIBKIT_CACHE", str(tuned / "cache"))
    shutil.copytree(tuned / "tm", tmp_path / "tm")
    assert run("build", tmp_path / "tm", "-p", "fp32", "-o", tmp_path / "e" / "fp32.onnx").exit_code == 0
    cfg = json.loads((tmp_path / "tm" / "config.json").read_text())
    cfg["id2label"] = {"0": "positive", "1": "negative"}
    (tmp_path / "tm" / "config.json").write_text(json.dumps(cfg))
    r = _deploy(tmp_path / "e" / "fp32.onnx", tmp_path / "repo", "--traffic", tuned / "log.jsonl")
    assert r.exit_code == 4, r.output
    assert "label names" in flat(r) and not (tmp_path / "repo").exists()


def test_the_default_traffic_log_is_checked_by_sha256(tuned: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The log a calibration set names is used only as it was when the set was drawn."""
    import shutil

    monkeypatch.setenv("CALIBKIT_CACHE", str(tuned / "cache"))
    for name in ("tm", "set", "cal"):
        shutil.copytree(tuned / name, tmp_path / name)
    log = tmp_path / "log.jsonl"
    text = (tuned / "log.jsonl").read_text()
    log.write_text(text.replace("good", "dull", 1) if "good" in text else text.replace("bad", "fun", 1))
    assert log.stat().st_size == (tuned / "log.jsonl").stat().st_size
    monkeypatch.chdir(tmp_path)
    r = _deploy(tmp_path / "cal", tmp_path / "repo")
    assert r.exit_code == 3, r.output
    assert str(log) in flat(r) and "changed since" in flat(r) and "--traffic" in flat(r)
    log.write_text(text)
    assert _deploy(tmp_path / "cal", tmp_path / "repo").exit_code == 0


# ---------------------------------------------------------------- deploy: refused before any work


@pytest.mark.parametrize("extra, text", [
    (["--queue-delay-us", str(2**64)], "--queue-delay-us"), (["--instances", str(2**31)], "--instances"),
    (["--max-batch", str(2**40)], "--max-batch"), (["--seed", "-1"], "--seed"),
    (["--name", "README.md"], "README.md"), (["--name", "deploy.JSON"], "deploy.JSON"),
])
def test_deploy_options_the_repository_cannot_hold_are_refused_before_work(tuned: Path, tmp_path: Path,
                                                                          extra: list[str], text: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Out-of-range values exited 0 with a config Triton cannot load; --seed -1 exited 1; --name README.md failed
    after the model was built, naming a hidden temporary folder."""
    import calibkit.building as build

    monkeypatch.setenv("CALIBKIT_CACHE", str(tuned / "cache"))
    monkeypatch.chdir(tuned)  # where its folders were written
    monkeypatch.setattr(build, "build", lambda *a, **k: pytest.fail("the model was built before the refusal"))
    r = _deploy(tuned / "cal", tmp_path / "repo", "--traffic", tuned / "log.jsonl", *extra)
    assert r.exit_code == 2, r.output
    assert text in flat(r) and "hint:" in r.output and ".tmp" not in flat(r) and "Traceback" not in r.output
    assert not (tmp_path / "repo").exists()


def test_label_names_with_a_line_break_are_refused_before_work(tuned: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """labels.txt used to be dropped without a word."""
    import shutil

    monkeypatch.setenv("CALIBKIT_CACHE", str(tuned / "cache"))
    monkeypatch.chdir(tuned)  # where its folders were written
    shutil.copytree(tuned / "tm", tmp_path / "tm")
    cfg = json.loads((tmp_path / "tm" / "config.json").read_text())
    cfg["id2label"] = {"0": "neg\native", "1": "positive"}
    (tmp_path / "tm" / "config.json").write_text(json.dumps(cfg))
    assert run("build", tmp_path / "tm", "-p", "fp32", "-o", tmp_path / "e" / "fp32.onnx").exit_code == 0
    r = _deploy(tmp_path / "e" / "fp32.onnx", tmp_path / "repo", "--traffic", tuned / "log.jsonl")
    assert r.exit_code == 4, r.output
    assert "line break" in flat(r) and "id2label" in flat(r) and not (tmp_path / "repo").exists()


def test_the_foreign_files_message_names_only_what_calibkit_did_not_write(tuned: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALIBKIT_CACHE", str(tuned / "cache"))
    monkeypatch.chdir(tuned)  # where its folders were written
    args = ("--traffic", tuned / "log.jsonl")
    assert _deploy(tuned / "cal", tmp_path / "repo", *args).exit_code == 0
    (tmp_path / "repo" / "zz-my-notes.txt").write_text("mine")
    r = _deploy(tuned / "cal", tmp_path / "repo", *args)
    assert r.exit_code == 2, r.output
    assert "calibkit did not write (zz-my-notes.txt)" in flat(r)


def test_a_single_file_may_sit_beside_what_the_command_line_names_only(proj: Path) -> None:
    """An engine may be built into the model folder given (as a folder or as its model file); a file output may
    not go into a folder that only a document names (engine B's model folder, found through its sidecar)."""
    from calibkit.outdirs import check_not_input

    model = proj / "model"
    check_not_input(model / "int8.onnx", [model], inside_ok=True)
    check_not_input(model / "int8.onnx", [model / "model.onnx"], inside_ok=True)
    with pytest.raises(UsageError, match="lies inside the input .*sidecar"):
        check_not_input(model / "x.json", [proj / "engB" / "int8.onnx"], option="--json", inside_ok=True)
    with pytest.raises(UsageError, match="is the input"):
        check_not_input(model / "model.onnx", [model / "model.onnx"], inside_ok=True)


@pytest.mark.parametrize("call", ["calibrate", "tune", "sample", "smooth"])
def test_the_library_refuses_outputs_over_inputs_too(proj: Path, call: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """ck.calibrate(model, "set", out="set") replaced the calibration set it had just read (calibkit wrote it, so
    the marker let it be replaced); each writer of the API asks the same guard as the command line."""
    import calibkit as ck
    from calibkit.data.modeldir import ModelDir

    monkeypatch.setenv("CALIBKIT_CACHE", str(proj / "cache"))
    model = ModelDir.resolve(proj / "model")
    before = snapshot(proj)
    with pytest.raises(UsageError, match="never writes over its inputs"):
        if call == "calibrate":
            ck.calibrate(model, proj / "set", proj / "set", method="minmax")
        elif call == "tune":
            ck.tune(proj / "model", proj / "set", proj / "eval.jsonl", proj / "runs" / "t", report=proj / "logs")
        elif call == "sample":
            ck.sample(proj / "logs" / "prod.jsonl", proj / "logs", size=8, clusters=1)
        else:
            ck.smooth(model, proj / "set", proj / "logs")
    assert snapshot(proj) == before


def test_the_alive_lock_of_a_folder_is_never_taken_through_a_link(tmp_path: Path) -> None:
    """A link at FOLDER/.calibkit-alive made calibkit open and lock the file it points to for its whole life."""
    from calibkit._io import mark_alive

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / ".calibkit-alive").symlink_to(victim)
    mark_alive(tmp_path / "work")
    probe = ("import fcntl, sys; fd = open(sys.argv[1]); fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); "
             "print('free')")
    r = subprocess.run([sys.executable, "-c", probe, str(victim)], capture_output=True, text=True)
    assert r.stdout.strip() == "free", r.stderr
    assert victim.read_text() == "precious"


def test_a_link_at_the_alive_lock_never_makes_a_folder_look_abandoned(tmp_path: Path) -> None:
    """owner_alive followed the link, locked the file it points to and called the folder's owner dead (the
    folder is then removed as stale); a link is not a lock calibkit made: it cannot tell, so never remove."""
    from calibkit._io import owner_alive

    (tmp_path / "unlocked.txt").write_text("x")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / ".calibkit-alive").symlink_to(tmp_path / "unlocked.txt")
    assert owner_alive(tmp_path / "work") is True
