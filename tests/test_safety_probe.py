"""Reused state, ownership and inputs read loosely, probed as an attacker or a careless colleague would: what
stands where calibkit reads or appends (a FIFO, a link, a folder, a device) is refused by name, never waited on,
written through or read without end, and a file calibkit did not write is never overwritten."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from calib_helpers import texts, write_model_dir

from calibkit.errors import DataError, ModelError, UsageError


class Blocked(BaseException):
    """Raised by :func:`no_hang`; no OSError (TimeoutError is one), so no ``except OSError`` swallows it."""


@contextlib.contextmanager
def no_hang(seconds: int = 10) -> Iterator[None]:
    """Fail with :class:`Blocked` instead of blocking for good (an open of a FIFO waits for its other end)."""
    def expired(signum: int, frame: object) -> None:
        raise Blocked(f"still blocked after {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _put_there(path: Path, kind: str, tmp_path: Path) -> Path:
    """Something calibkit did not make at ``path``; returns the user's file (a link at ``path`` leads to it)."""
    theirs = tmp_path / "users-notes.txt"
    theirs.write_text("my notes\n")
    if kind == "symlink":
        path.symlink_to(theirs)
    elif kind == "hard link":
        os.link(theirs, path)
    elif kind == "folder":
        path.mkdir()
    else:
        os.mkfifo(path)
    return theirs


# -- tune's ledger -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["symlink", "hard link", "folder", "fifo"])
def test_what_calibkit_did_not_make_at_the_ledger_is_refused(tmp_path: Path, kind: str) -> None:
    """A link at ledger.jsonl had tune append its records to the file it leads to; a folder failed with an OS
    error after the statistics; a FIFO blocked the first record's append for good."""
    from calibkit.evaluate.ledger import Ledger

    work = tmp_path / ".out.tune"
    work.mkdir()
    theirs = _put_there(work / "ledger.jsonl", kind, tmp_path)
    with no_hang(), pytest.raises(UsageError, match="not the file calibkit writes") as err:
        Ledger(work / "ledger.jsonl")
    assert str(work / "ledger.jsonl") in err.value.message and "remove or rename" in (err.value.hint or "")
    assert theirs.read_text() == "my notes\n"


def test_the_ledger_calibkit_made_is_read_and_appended(tmp_path: Path) -> None:
    from calibkit.evaluate.ledger import Ledger

    path = tmp_path / "ledger.jsonl"
    rec = {"mode": "only_this", "node": "n", "accuracy": 0.5, "logit_mse": 0.0, "mean_kl": 0.0, "seconds": 1.0}
    Ledger(path).put("k1", rec)
    Ledger(path).put("k2", rec)
    again = Ledger(path)
    assert again.loaded == 2 and again.get("k1") == {**rec, "key": "k1"} and path.stat().st_nlink == 1


# -- the statistics cache --------------------------------------------------------------------------------------

def test_a_statistics_entry_of_another_model_copied_in_is_named_and_replaced(tmp_path: Path,
                                                                              caplog: pytest.LogCaptureFixture
                                                                              ) -> None:
    """It was skipped without a word (and stayed) when it sat under this model's own name."""
    import logging
    import shutil

    import numpy as np

    from calibkit.calibrate.stats import StatsAccumulator, StatsStore
    from calibkit.calibrate.statscache import find_stats, save_stats, stats_path

    acc = StatsAccumulator("a", 64)
    acc.observe(np.linspace(-2, 3, 100, dtype=np.float32))
    mine, other, key = "ab" * 32, "cd" * 32, "set+enc:0"
    theirs = save_stats(StatsStore({"a": acc.freeze()}, 64, {"model_sha256": other, "stats_set_key": key}), ["a"],
                        tmp_path)
    assert theirs is not None
    here = stats_path(mine, key, ["a"], 64, tmp_path)
    here.parent.mkdir(parents=True)
    shutil.copyfile(theirs, here)
    with caplog.at_level(logging.WARNING, logger="calibkit.calibrate"):
        assert find_stats(mine, key, ["a"], 64, tmp_path) is None
    assert str(here) in caplog.text and "another model" in caplog.text and not here.exists()
    assert find_stats(other, key, ["a"], 64, tmp_path) is not None  # the other model's own entry is untouched


@pytest.mark.parametrize("damage", ["ranges x4", "nan", "truncated", "empty"])
def test_a_calibrations_damaged_stats_npz_is_refused_by_histogram(tmp_path: Path, damage: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """ck.histogram read calibrate's stats.npz unverified: rescaled or NaN ranges gave a histogram as if true, and
    a truncated or empty file a zipfile or EOF traceback."""
    import numpy as np

    import calibkit as ck
    from calibkit.data.calibset import write_calibration_set
    from calibkit.errors import CalibrationError

    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    model = write_model_dir(tmp_path / "model")
    write_calibration_set(tmp_path / "set", texts(20, seed=3), None)
    stats = ck.calibrate(model, tmp_path / "set", tmp_path / "cal", method="minmax").stats_path
    assert stats is not None and ck.histogram(tmp_path / "cal").count > 0
    if damage in ("ranges x4", "nan"):
        with np.load(stats, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        arrays["minmax"] = arrays["minmax"] * 4 if damage == "ranges x4" else np.full_like(arrays["minmax"], np.nan)
        with open(stats, "wb") as fh:
            np.savez_compressed(fh, **arrays)
    else:
        stats.write_bytes(stats.read_bytes()[:100] if damage == "truncated" else b"")
    with pytest.raises(CalibrationError, match="failed verification" if damage in ("ranges x4", "nan")
                       else "cannot read statistics") as err:
        ck.histogram(tmp_path / "cal")
    assert "re-run `calibkit calibrate`" in (err.value.hint or "")


# -- inputs that are no regular file ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_an_eval_set_that_is_no_file_is_refused_by_what_it_is(tmp_path: Path, kind: str) -> None:
    """An eval set is read whole: a FIFO named eval.jsonl blocked the run for good (and a link to /dev/zero
    would read until memory ran out)."""
    from calibkit.data.evalset import load_eval_set

    path = tmp_path / "eval.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/null")
    with no_hang(), pytest.raises(DataError, match="a FIFO" if kind == "fifo" else "a character device") as err:
        load_eval_set(path)
    assert "save the eval set to a file" in (err.value.hint or "")


@pytest.mark.parametrize("where", ["folder", "file"])
def test_a_calibration_set_that_is_no_file_says_what_it_is(tmp_path: Path, where: str) -> None:
    """It said "calibration set not found" of a FIFO or a device that was there."""
    from calibkit.data.calibset import load_calibration_set

    if where == "folder":
        (tmp_path / "set").mkdir()
        os.mkfifo(tmp_path / "set" / "texts.jsonl")
        given, shown = tmp_path / "set", "a FIFO"
    else:
        given, shown = Path("/dev/null"), "a character device"
    with no_hang(), pytest.raises(DataError, match=f"is {shown}, not a file"):
        load_calibration_set(given)


ROWS = [{"text": f"good movie number {i}", "label": ["negative", "positive"][i % 2]} for i in range(6)]
JSONL = "".join(json.dumps(r) + "\n" for r in ROWS)
CSV = "text,label\n" + "".join(f"{r['text']},{r['label']}\n" for r in ROWS)


@pytest.mark.parametrize(("name", "data"), [("e.jsonl", JSONL.encode("utf-16")), ("e.csv", CSV.encode("utf-16")),
                                            ("e.jsonl", JSONL.encode("utf-16-le"))], ids=["jsonl", "csv", "no-bom"])
def test_a_utf16_eval_set_or_log_is_named_as_such(tmp_path: Path, name: str, data: bytes) -> None:
    """A UTF-16 file (PowerShell's `>` writes one) was "not valid JSON" (hint: one object per line), a CSV had
    "no text column", and a log had every line broken (hint: check --text-field)."""
    from calibkit.data.evalset import load_eval_set
    from calibkit.data.logs import iter_lines

    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(DataError, match="is UTF-16 text") as err:
        load_eval_set(path)
    assert "iconv -f UTF-16 -t UTF-8" in (err.value.hint or "")
    if name.endswith(".jsonl"):
        with pytest.raises(DataError, match="is UTF-16 text"):
            list(iter_lines(path))
    path.write_text(JSONL if name.endswith(".jsonl") else CSV)  # the same rows in UTF-8 are read
    assert len(load_eval_set(path)) == len(ROWS)


def test_a_csv_in_another_encoding_is_told_to_be_re_encoded(tmp_path: Path) -> None:
    """polars' "invalid utf-8 sequence" came with a hint about quoting."""
    from calibkit.data.evalset import load_eval_set

    path = tmp_path / "e.csv"
    path.write_bytes("text,label\ncaf\xe9 good,positive\nbad film,negative\n".encode("latin-1"))
    with pytest.raises(DataError, match="utf-8") as err:
        load_eval_set(path)
    assert "re-encode the file as UTF-8" in (err.value.hint or "")


def test_a_fifo_where_calibkit_reads_its_own_json_never_blocks(tmp_path: Path) -> None:
    """read_json waited on a FIFO: at calibration.json beside an engine without a sidecar (the hint compare gives)
    or at a repository's trt_profiles.json."""
    from calibkit._io import read_json
    from calibkit.deploy.engine import read_spec
    from calibkit.enginefiles.artifact import EngineArtifact

    os.mkfifo(tmp_path / "calibration.json")
    (tmp_path / "model.int8.onnx").write_bytes(b"onnx")
    os.mkfifo(tmp_path / "trt_profiles.json")
    with no_hang():
        with pytest.raises(OSError, match="a FIFO, not a regular file"):
            read_json(tmp_path / "calibration.json")
        with pytest.raises(ModelError, match="has no calibkit sidecar"):
            EngineArtifact.load(tmp_path / "model.int8.onnx")
        with pytest.raises(UsageError, match="a FIFO"):
            read_spec(tmp_path)
    (tmp_path / "doc.json").write_text('{"a": 1}')
    assert read_json(tmp_path / "doc.json") == {"a": 1}


def test_a_fifo_at_a_models_config_json_is_a_model_error_not_a_wait(tmp_path: Path) -> None:
    """config.json was read after a stat() alone (which a FIFO passes): every command on the folder blocked."""
    from calibkit.consistency import labels_sha256
    from calibkit.data.modeldir import read_config

    model = write_model_dir(tmp_path / "model")
    (model / "config.json").unlink()
    os.mkfifo(model / "config.json")
    with no_hang():
        with pytest.raises(ModelError, match="a FIFO, not a regular file"):
            read_config(model)
        assert labels_sha256(model) is None


def test_a_fifo_at_a_calibration_sets_manifest_never_blocks_deploy(tmp_path: Path) -> None:
    """deploy looks for the calibration set of a table by reading every */manifest.json under its roots, and for
    the log a set was drawn from: a FIFO at one of them blocked it."""
    from calibkit.deploy.traffic import find_calibration_set, log_of_calibration_set

    (tmp_path / "a").mkdir()
    os.mkfifo(tmp_path / "a" / "manifest.json")
    with no_hang():
        assert find_calibration_set("ab" * 32, [tmp_path]) is None
        assert log_of_calibration_set(tmp_path / "a") is None


# -- ownership: the library's build ----------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["user file", "dangling link"])
def test_the_library_build_never_overwrites_a_file_it_did_not_write(tmp_path: Path, kind: str) -> None:
    """`calibkit build -o` refused a file without a sidecar; the library's build wrote over it."""
    from calibkit.building import BuildRequest, build
    from calibkit.enginefiles.artifact import sidecar_path
    from calibkit.types import Precision

    model = write_model_dir(tmp_path / "model")
    out = tmp_path / "notes.onnx"
    if kind == "user file":
        out.write_bytes(b"the user's own model")
    else:
        out.symlink_to(tmp_path / "elsewhere.onnx")
    with pytest.raises(UsageError, match="was not written by `calibkit build`"):
        build(BuildRequest(model=model, output=out, precision=Precision.FP32))
    assert os.path.lexists(out) and not sidecar_path(out).exists() and not (tmp_path / "elsewhere.onnx").exists()
    if kind == "user file":
        assert out.read_bytes() == b"the user's own model"
    ours = tmp_path / "e" / "fp32.onnx"
    for _ in range(2):  # its own engine is rebuilt in place
        build(BuildRequest(model=model, output=ours, precision=Precision.FP32))
    assert sidecar_path(ours).is_file()


# -- ownership: demo prepare ----------------------------------------------------------------------------------

def snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.fixture()
def no_prepare_work(monkeypatch: pytest.MonkeyPatch) -> None:
    from calibkit.demo import archive

    def started(*args: object, **kwargs: object) -> Path:
        raise AssertionError("prepare started its steps")

    monkeypatch.setattr(archive, "fetch_archive", started)


def test_a_file_named_prepare_json_does_not_make_a_folder_an_earlier_prepares(tmp_path: Path,
                                                                              no_prepare_work: None) -> None:
    """Any prepare.json made the folder look like prepare's: it wrote its marker there and went on to write over
    the user's data/train.jsonl, logs.jsonl and prepare.json."""
    from cli_helpers import flat, run

    out = tmp_path / "mine"
    (out / "data").mkdir(parents=True)
    (out / "prepare.json").write_text('{"steps": {}, "build": "my own settings"}')
    (out / "data" / "train.jsonl").write_text('{"text": "my own data"}\n')
    before = snapshot(tmp_path)
    r = run("demo", "prepare", "--fast", "--out", out)
    assert r.exit_code == 2, r.output
    assert "calibkit did not write" in flat(r) and "data/train.jsonl" in flat(r) and "Traceback" not in r.output
    assert snapshot(tmp_path) == before


def test_two_prepares_into_one_folder_the_second_is_refused(tmp_path: Path, no_prepare_work: None) -> None:
    """demo prepare claimed no output: two runs into one folder both wrote its steps' files."""
    from cli_helpers import claimed_elsewhere

    from calibkit.demo.prepare import PrepareOptions, prepare_demo

    out = tmp_path / "demo"
    first = claimed_elsewhere(out)
    try:
        with pytest.raises(UsageError, match=rf"being written by another calibkit run \(pid {first.pid}\)"):
            prepare_demo(out, PrepareOptions(fast=True, log_lines=10))
    finally:
        first.kill()
        first.wait()
        if first.stdout is not None:
            first.stdout.close()
    assert not out.exists() or list(out.iterdir()) == []


# -- reused state found by the probe: markers, external weights, a copied smoothed model ------------------------

def test_a_fifo_at_an_output_marker_is_refused_not_waited_on(tmp_path: Path) -> None:
    from calibkit.outdirs import MARKER, check_replaceable

    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / MARKER)
    with no_hang(5), pytest.raises(UsageError, match="calibkit did not write"):
        check_replaceable(out)



def test_an_engines_external_weights_edited_after_build_are_noticed(tmp_path: Path) -> None:
    import onnx

    from calibkit.building import BuildRequest, build
    from calibkit.enginefiles.artifact import EngineArtifact
    from calibkit.types import Precision

    model = write_model_dir(tmp_path / "model", dim=32)  # weights over build's 1 KiB external-data threshold
    onnx.save_model(onnx.load(str(model / "model.onnx")), str(model / "model.onnx"), save_as_external_data=True,
                    size_threshold=0, location="weights.bin")
    engine = tmp_path / "e" / "fp32.onnx"
    written = build(BuildRequest(model=model, output=engine, precision=Precision.FP32)).files
    data = engine.with_name("fp32.onnx.data")
    assert data in written
    blob = bytearray(data.read_bytes())
    blob[-1] ^= 0xFF  # one weight of the engine edited beside its unchanged .onnx
    data.write_bytes(bytes(blob))
    with pytest.raises(ModelError, match="describes another file"):
        EngineArtifact.load(engine)


def test_a_model_copied_over_tunes_smoothed_model_is_not_reused(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A smoothed model is reused from the work folder of an interrupted run only as smooth wrote it: one
    copied over it (here another model's weights) skipped smooth's FP32-equivalence check."""
    import onnx
    from calib_helpers import tiny_model
    from cli_helpers import flat, run, write_eval_set

    from calibkit.calibrate.smoothing import smooth
    from calibkit.data.calibset import write_calibration_set
    from calibkit.data.modeldir import ModelDir
    from calibkit.requests.smooth import SmoothRequest

    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    model = write_model_dir(tmp_path / "model")
    cset = write_calibration_set(tmp_path / "set", texts(20, seed=3), None)
    write_eval_set(tmp_path / "eval.jsonl", texts(24, seed=2))
    smoothed = tmp_path / ".tune.tune" / "smoothed-model"  # where an interrupted `tune --out tune` left it
    smooth(SmoothRequest(model=ModelDir.resolve(model), calibration_set=cset, out=smoothed))
    onnx.save(tiny_model(seed=7), str(smoothed / "model.onnx"))
    swapped = (smoothed / "model.onnx").read_bytes()
    r = run("tune", model, "-c", tmp_path / "set", "-e", tmp_path / "eval.jsonl", "--method", "minmax",
            "--out", tmp_path / "tune", "--no-report")
    shipped = tmp_path / "tune" / "smoothed-model" / "model.onnx"
    used = [p for p in (smoothed / "model.onnx", shipped) if p.is_file() and p.read_bytes() == swapped]
    assert (r.exit_code != 0 and "smoothed-model" in flat(r)) or (r.exit_code == 0 and not used), r.output


def test_a_link_at_an_output_marker_never_makes_a_users_folder_replaceable(tmp_path: Path) -> None:
    """A marker linked from another folder calibkit wrote (with the same file names) made the user's folder look
    like calibkit's: the next run into it deleted the user's thesis.docx."""
    from calibkit._io import atomic_dir
    from calibkit.outdirs import MARKER

    with atomic_dir(tmp_path / "ours") as d:
        (d / "thesis.docx").write_text("a file calibkit wrote under this name")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.docx").write_text("four years of work")
    (mine / MARKER).symlink_to(tmp_path / "ours" / MARKER)
    with pytest.raises(UsageError, match="calibkit did not write"):
        with atomic_dir(mine) as d:
            (d / "x").write_text("x")
    assert (mine / "thesis.docx").read_text() == "four years of work"


@pytest.mark.parametrize("kind", ["fifo", "link", "dangling"])
def test_a_fifo_or_a_link_at_a_single_output_file_is_refused_not_replaced(tmp_path: Path, kind: str) -> None:
    from calibkit.outdirs import guard_output_file

    target = tmp_path / "notes.txt"
    target.write_text("mine")
    out = tmp_path / "report.json"
    if kind == "fifo":
        os.mkfifo(out)
    else:
        out.symlink_to(target if kind == "link" else tmp_path / "gone")
    with no_hang(5), pytest.raises(UsageError, match="was not written by calibkit"):
        guard_output_file(out, option="--json", owned=lambda p: True)
    assert target.read_text() == "mine" and os.path.lexists(out)
