"""What calibkit reads back is verified before it is used: statistics cache entries (their meaning, and only
regular files calibkit wrote), tune ledger records (against the job they are read back for), tune's work
folder (never a link or a file), and a model's identity (its external-data files included)."""

from __future__ import annotations

import json
import logging
import os
import signal
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("hypothesis")

from calib_helpers import write_model_dir  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from calibkit.calibrate.stats import StatsAccumulator, StatsStore, verify_store  # noqa: E402
from calibkit.calibrate.statscache import find_stats, save_stats, stats_path  # noqa: E402
from calibkit.errors import UsageError  # noqa: E402
from calibkit.evaluate import ledger as ledger_mod  # noqa: E402
from calibkit.evaluate.jobs import SensitivityJob, SensitivityResult  # noqa: E402
from calibkit.evaluate.ledger import Evaluator, Ledger, job_key, record_problem, result_record  # noqa: E402
from calibkit.executors import InProcessExecutor  # noqa: E402
from calibkit.outdirs import work_folder  # noqa: E402

SHA, KEY, BINS = "ab" * 32, "set+enc:0", 64
TENSORS = ["a", "b"]


def _store() -> StatsStore:
    rng = np.random.default_rng(0)
    stats = {}
    for i, t in enumerate(TENSORS):
        acc = StatsAccumulator(t, BINS)
        acc.observe((rng.standard_normal(500) * (1 + 3 * i)).astype(np.float32))
        stats[t] = acc.freeze()
    return StatsStore(stats, BINS, {"model_sha256": SHA, "stats_set_key": KEY})


def _saved(root: Path) -> Path:
    path = save_stats(_store(), TENSORS, root)
    assert path is not None and find_stats(SHA, KEY, TENSORS, BINS, root) is not None
    return path


def _rewrite(path: Path, **changes: np.ndarray) -> None:
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays.update(changes)
    with open(path, "wb") as fh:
        np.savez_compressed(fh, **arrays)


def _arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k].copy() for k in z.files}


def test_a_saved_store_verifies() -> None:
    assert verify_store(_store(), num_bins=BINS) == []


@pytest.mark.parametrize("corrupt", ["ranges x4", "nan max", "negative count", "counts off", "float counts",
                                     "truncated vector"])
def test_a_corrupt_statistics_entry_is_recomputed_and_named(tmp_path: Path, corrupt: str,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    path = _saved(tmp_path)
    a = _arrays(path)
    mm, counts, ints = a["minmax"], a["counts"], a["ints"]
    if corrupt == "ranges x4":
        _rewrite(path, minmax=mm * 4)
    elif corrupt == "nan max":
        mm[0, 1] = np.nan
        _rewrite(path, minmax=mm)
    elif corrupt == "negative count":
        counts[1, 0] = -counts[1, 0] - 1
        _rewrite(path, counts=counts)
    elif corrupt == "counts off":
        ints[0, 0] += 7
        _rewrite(path, ints=ints)
    elif corrupt == "float counts":
        _rewrite(path, counts=counts.astype(np.float64) * 0.5)
    else:
        _rewrite(path, upper=a["upper"][:1])
    with caplog.at_level(logging.WARNING, logger="calibkit.calibrate"):
        assert find_stats(SHA, KEY, TENSORS, BINS, tmp_path) is None
    assert str(path) in caplog.text and ("failed verification" in caplog.text or "unreadable" in caplog.text)
    assert not path.exists()  # calibkit's own entry, removed; the next run saves a good one
    assert save_stats(_store(), TENSORS, tmp_path) == path and find_stats(SHA, KEY, TENSORS, BINS, tmp_path)


def test_a_fifo_at_an_entry_is_never_opened(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = stats_path(SHA, KEY, TENSORS, BINS, tmp_path)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    signal.alarm(20)  # opening a FIFO for reading would block: fail instead of hanging the suite
    try:
        with caplog.at_level(logging.WARNING, logger="calibkit.calibrate"):
            assert find_stats(SHA, KEY, TENSORS, BINS, tmp_path) is None
    finally:
        signal.alarm(0)
    assert "a FIFO" in caplog.text and str(path) in caplog.text
    assert path.exists()  # not calibkit's: left alone


def test_a_symlink_at_an_entry_or_the_key_folder_is_never_followed(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    good = _saved(tmp_path / "elsewhere")
    path = stats_path(SHA, KEY, TENSORS, BINS, tmp_path / "cache")
    path.parent.mkdir(parents=True)
    path.symlink_to(good)  # a valid entry, but through a link calibkit did not make
    with caplog.at_level(logging.WARNING, logger="calibkit.calibrate"):
        assert find_stats(SHA, KEY, TENSORS, BINS, tmp_path / "cache") is None
    assert "a symbolic link" in caplog.text and good.is_file()
    # the key folder itself a link: neither read nor written through
    other = stats_path(SHA, KEY, TENSORS, BINS, tmp_path / "linked")
    other.parent.parent.mkdir(parents=True)
    other.parent.symlink_to(good.parent)
    assert find_stats(SHA, KEY, TENSORS, BINS, tmp_path / "linked") is None
    before = sorted(p.name for p in good.parent.iterdir())
    assert save_stats(_store(), ["a"], tmp_path / "linked") is None
    assert sorted(p.name for p in good.parent.iterdir()) == before


# -- the tune ledger -----------------------------------------------------------------------------------------

N = 6


def _job() -> SensitivityJob:
    ref = np.tile(np.array([[0.0, 1.0, 0.5]]), (N, 1))
    return SensitivityJob(source_model="m.onnx", calibration_json="c.json", tokenizer="t", texts=tuple(
        f"text {i}" for i in range(N)), labels=(1, 1, 0, 1, 2, 1), reference_logits=ref, keep_nodes=("fc1",),
        mode="only_this", node="fc1")


def _result() -> SensitivityResult:
    preds = (1, 1, 1, 1, 1, 0)
    agree = tuple(1.0 if p == 1 else 0.0 for p in preds)
    acc = float(np.mean(np.array(preds) == np.array(_job().labels)))
    return SensitivityResult("only_this", "fc1", acc, 0.1, 0.02, 1.5, flip_rate=1.0 - float(np.mean(agree)),
                             predictions=preds, agreement_values=agree)


def test_a_good_record_is_its_jobs_result() -> None:
    assert record_problem(result_record(_result()), _job()) is None


@pytest.mark.parametrize(("edit", "why"), [
    (lambda r: r.update(agreement_values=r["agreement_values"][:3]), "3 agreement values for 6 texts"),
    (lambda r: r.update(agreement_values=[float("nan")] * N), "not a finite share"),
    (lambda r: r.update(predictions=r["predictions"][:-1]), "5 predictions for 6 texts"),
    (lambda r: r.update(predictions=[7] * N), "outside the model's 3 classes"),
    (lambda r: r.update(predictions=["1"] * N), "not a list of class ids"),
    (lambda r: r.update(accuracy=0.99), "not the share of its predictions"),
    (lambda r: r.update(flip_rate=0.0), "not 1 - the mean agreement"),
    (lambda r: r.update(node="fc2"), "not of only_this/fc1"),
])
def test_a_record_that_does_not_fit_its_job_is_refused(edit, why: str) -> None:  # type: ignore[no-untyped-def]
    rec = result_record(_result())
    edit(rec)
    problem = record_problem(rec, _job())
    assert problem is not None and why in problem


def _evaluate(tmp_path: Path, rec: dict, monkeypatch: pytest.MonkeyPatch) -> tuple[list, Evaluator]:
    job = _job()
    path = tmp_path / "ledger.jsonl"
    path.write_text(json.dumps({**rec, "key": job_key(job, "t" * 64, "m" * 64)}, allow_nan=True) + "\n")
    ran: list[SensitivityJob] = []

    def fake_run_jobs(jobs, *, executor, task, on_result):  # type: ignore[no-untyped-def]
        for i, j in enumerate(jobs):
            ran.append(j)
            on_result(i, _result())

    monkeypatch.setattr(ledger_mod, "run_jobs", fake_run_jobs)
    ev = Evaluator(Ledger(path), "m" * 64, InProcessExecutor(), lambda e: None)
    ev.run([job], "t" * 64, "tune")
    return ran, ev


def test_a_failing_record_is_evaluated_again_and_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    good = result_record(_result())
    ran, ev = _evaluate(tmp_path, good, monkeypatch)
    assert ran == [] and ev.reused == 1
    bad = {**good, "agreement_values": good["agreement_values"][:2]}
    with caplog.at_level(logging.WARNING, logger="calibkit.evaluate.ledger"):
        ran, ev = _evaluate(tmp_path, bad, monkeypatch)
    assert len(ran) == 1 and ev.rejected == 1 and ev.reused == 0
    assert "failed verification" in caplog.text and "2 agreement values for 6 texts" in caplog.text


# -- tune's work folder ----------------------------------------------------------------------------------------

def test_the_work_folder_is_never_a_link_or_a_file(tmp_path: Path) -> None:
    made = work_folder(tmp_path / ".out.tune")
    assert made.is_dir() and work_folder(made) == made  # made, then kept
    someone = tmp_path / "someone-elses"
    someone.mkdir()
    link = tmp_path / ".linked.tune"
    link.symlink_to(someone)
    with pytest.raises(UsageError, match="is a symbolic link") as err:
        work_folder(link)
    assert "remove or rename" in (err.value.hint or "") and list(someone.iterdir()) == []
    (tmp_path / ".dangling.tune").symlink_to(tmp_path / "nowhere")
    with pytest.raises(UsageError, match="symbolic link"):
        work_folder(tmp_path / ".dangling.tune")
    assert not (tmp_path / "nowhere").exists()
    (tmp_path / ".file.tune").write_text("x")
    with pytest.raises(UsageError, match="a file, not a folder"):
        work_folder(tmp_path / ".file.tune")
    os.mkfifo(tmp_path / ".fifo.tune")
    with pytest.raises(UsageError, match="a FIFO"):
        work_folder(tmp_path / ".fifo.tune")


# -- a model's identity: its external data -------------------------------------------------------------------

def test_edited_external_weights_change_the_identity_and_miss_the_cache(tmp_path: Path) -> None:
    from calibkit._io import sha256_file
    from calibkit.calibrate.pipeline import load_hashed
    from calibkit.consistency import check_file, file_sha256
    from calibkit.errors import ModelError
    from calibkit.graph import model_sha256

    plain = write_model_dir(tmp_path / "plain") / "model.onnx"
    assert model_sha256(plain) == file_sha256(plain) == sha256_file(plain)  # unchanged without external data
    ext = tmp_path / "ext" / "model.onnx"
    ext.parent.mkdir()
    onnx.save_model(onnx.load(str(plain)), str(ext), save_as_external_data=True, size_threshold=0,
                    location="weights.bin")
    before = model_sha256(ext)
    assert before != sha256_file(ext) and load_hashed(ext)[1] == before == file_sha256(ext)
    save_stats(StatsStore(_store().stats, BINS, {"model_sha256": before, "stats_set_key": KEY}), TENSORS,
               tmp_path / "cache")
    assert find_stats(before, KEY, TENSORS, BINS, tmp_path / "cache") is not None
    weights, own = ext.parent / "weights.bin", sha256_file(ext)
    data = bytearray(weights.read_bytes())
    data[0] ^= 0xFF  # one weight edited beside the unchanged model.onnx
    weights.write_bytes(bytes(data))
    after = model_sha256(ext)
    assert after != before and sha256_file(ext) == own  # model.onnx's own bytes did not change
    assert load_hashed(ext)[1] == after
    assert find_stats(after, KEY, TENSORS, BINS, tmp_path / "cache") is None  # the statistics are not reused
    with pytest.raises(ModelError, match="was replaced"):
        check_file(ext, before, what="the source model", hint="rebuild")
    check_file(ext, after, what="the source model", hint="rebuild")


# -- property: any corruption is recomputed or refused, never used -------------------------------------------

CORRUPTIONS = ("truncate", "rescale", "nan", "wrong type", "symlink", "fifo", "shuffle counts")


@given(kind=st.sampled_from(CORRUPTIONS), tensor=st.integers(0, 1), factor=st.floats(1.01, 1e6),
       cut=st.integers(0, 2000))
def test_property_a_corrupt_statistics_entry_is_never_used(tmp_path_factory: pytest.TempPathFactory, kind: str,
                                                           tensor: int, factor: float, cut: int) -> None:
    root = tmp_path_factory.mktemp("stats")
    path = _saved(root)
    a = _arrays(path)
    if kind == "truncate":
        blob = path.read_bytes()
        path.write_bytes(blob[: min(cut, len(blob) - 1)])
    elif kind == "rescale":
        a["minmax"][tensor] *= factor
        _rewrite(path, minmax=a["minmax"])
    elif kind == "nan":
        a["minmax"][tensor, cut % 2] = np.nan
        _rewrite(path, minmax=a["minmax"])
    elif kind == "wrong type":
        _rewrite(path, ints=a["ints"].astype(np.float64))
    elif kind == "shuffle counts":
        c = a["counts"][tensor]
        c[-1] += 1  # one value above the recorded maximum
        a["ints"][tensor, 0] += 1
        _rewrite(path, counts=a["counts"], ints=a["ints"])
    else:
        good = path.with_name("keep.bin")
        os.replace(path, good)
        if kind == "symlink":
            path.symlink_to(good)
        else:
            os.mkfifo(path)
    signal.alarm(20)
    try:
        hit = find_stats(SHA, KEY, TENSORS, BINS, root)
    finally:
        signal.alarm(0)
    assert hit is None  # recomputed, never the corrupt values


@given(field=st.sampled_from(["agreement_values", "predictions", "cosine_values", "accuracy", "flip_rate",
                              "seconds"]),
       how=st.sampled_from(["truncate", "rescale", "nan", "wrong type"]))
def test_property_a_corrupt_ledger_record_is_never_used(field: str, how: str) -> None:
    rec = result_record(_result())
    rec["cosine_values"] = [0.9] * N
    v = rec[field]
    if how == "truncate":
        rec[field] = v[:-1] if isinstance(v, list) else None
    elif how == "rescale":
        rec[field] = [x * 3 + 2 for x in v] if isinstance(v, list) else v * 3 + 2
        if field == "cosine_values":  # cosines are not checked for range: no stored vector claims one
            rec[field] = [0.9] * (N + 1)
    elif how == "nan":
        rec[field] = [float("nan")] * N if isinstance(v, list) else float("nan")
        if field == "cosine_values":
            rec[field] = [float("nan")] * (N - 2)
    else:
        rec[field] = [str(x) for x in v] if isinstance(v, list) else str(v)
    usable = Ledger.usable({**rec, "key": "k"})
    if field == "seconds" and how == "rescale":
        assert usable and record_problem(rec, _job()) is None  # another duration is still a duration
        return
    if field == "accuracy" and how == "nan":  # NaN accuracy: the job has labels, so it must be their share
        assert record_problem(rec, _job()) is not None
        return
    assert not usable or record_problem(rec, _job()) is not None


def test_zip_entries_are_what_save_writes(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    with zipfile.ZipFile(path) as z:
        assert sorted(z.namelist()) == sorted(f"{k}.npy" for k in ("counts", "upper", "ints", "minmax", "header"))
