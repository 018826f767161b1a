"""docs/guarantees.md, held: every test it names is a test of this suite, and the promises it makes that no
other test held (what is verified on read: markers, sidecars, calibration.json, smoothing records, a shared
statistics cache; a folder where a file is written; a worker's broken pipe; the library's CI gate)."""

from __future__ import annotations

import ast
import errno
import json
import logging
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
import typer
from calib_helpers import texts, tiny_model, write_model_dir
from cli_helpers import build_engines, flat, full_disk_on_html, run
from test_tune_pipeline import sensitive_folder

import calibkit as ck
import calibkit.calibrate.smoothing as smoothing
import calibkit.evaluate.tune as tune
from calibkit._io import atomic_dir, record_path, sha256_file
from calibkit.building import _rel
from calibkit.calibrate.stats import StatsAccumulator, StatsStore
from calibkit.calibrate.statscache import find_stats, save_stats, stats_path
from calibkit.cli._common import STDOUT_GONE_EXIT, handle_errors
from calibkit.consistency import check_file
from calibkit.data import logs
from calibkit.data.calibset import CalibrationSet, write_calibration_set
from calibkit.data.evalset import load_eval_set
from calibkit.enginefiles.artifact import EngineArtifact, sidecar_path
from calibkit.errors import CalibrationError, DataError, ModelError, UsageError
from calibkit.evaluate.decisions import missed_targets
from calibkit.graph import model_sha256
from calibkit.outdirs import MARKER, changed_files, foreign_files, read_marker, write_marker
from calibkit.quantize.placement import plan_placement
from calibkit.quantize.qdq import DEFAULT_OP_TYPES, quantize_model
from calibkit.quantize.tablefile import load_calibration_json, write_calibration_json
from calibkit.resources import Resources
from calibkit.results.codec import document_json
from calibkit.results.files import CalibrationDocument, SmoothingRecord
from calibkit.results.runs import Gate
from calibkit.types import Backend, CalibrationTable, Method, MethodParams, Precision, TensorRange

TESTS = Path(__file__).parent
DOC = TESTS.parent / "docs" / "guarantees.md"

# -- the document names tests that exist ---------------------------------------------------------------------

_SPAN = re.compile(r"`([^`]+)`")  # a span may wrap across lines
_FILE = re.compile(r"tests/([\w/]+\.py)(?:::(test_\w+))?")
_NAME = re.compile(r"test_\w+")


def _tests_in(path: Path) -> set[str]:
    """The test functions pytest collects from ``path``: ``test_*`` at module level or in a ``Test*`` class."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.startswith("Test")):
        found |= {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return {n for n in found if n.startswith("test_")}


def _named_tests(text: str) -> tuple[set[str], set[tuple[str, str]], set[str]]:
    """What ``text`` names in backticks: test files, (file, test) pairs, and bare test names."""
    files: set[str] = set()
    pairs: set[tuple[str, str]] = set()
    bare: set[str] = set()
    for span in _SPAN.findall(text):
        span = span.strip()
        if m := _FILE.fullmatch(span):
            files.add(m.group(1))
            if m.group(2):
                pairs.add((m.group(1), m.group(2)))
        elif _NAME.fullmatch(span):
            bare.add(span)
    return files, pairs, bare


def test_named_tests_are_parsed_from_backticks() -> None:
    text = ("Tests: `tests/test_a.py::test_one`, `test_two` and `tests/test_b.py`; `tests/test_safety_*.py` is a "
            "pattern, `test_x.py` a file name, `pytest -k test_y` a command, `a span\nacross lines`, `test_three`.")
    assert _named_tests(text) == ({"test_a.py", "test_b.py"}, {("test_a.py", "test_one")}, {"test_two", "test_three"})


def test_every_test_the_guarantees_name_is_a_collected_test() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert text.count("`") % 2 == 0, "an unclosed code span would pair the rest of the document wrongly"
    files, pairs, bare = _named_tests(text)
    assert len(pairs) + len(bare) > 50, "the document names its tests"
    suite = {p.name: _tests_in(p) for p in TESTS.glob("test_*.py")}
    assert sorted(f for f in files if f not in suite) == [], "named test files that do not exist"
    assert sorted(f"{f}::{t}" for f, t in pairs if t not in suite.get(f, set())) == [], \
        "named tests not in the file named"
    everywhere = set().union(*suite.values())
    assert sorted(bare - everywhere) == [], "named tests that are no test of the suite"


# -- markers -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("marker", ["not json {", '["a list"]', '{"format": "calibkit-output/99", "files": ["a"]}',
                                    '{"files": ["a"]}'])
def test_a_marker_that_is_not_calibkits_vouches_for_nothing(tmp_path: Path, marker: str) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / "a").write_text("the user's")
    (out / MARKER).write_text(marker)
    assert read_marker(out) is None
    assert foreign_files(out) == [MARKER, "a"]
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(UsageError, match="calibkit did not write"):
        with atomic_dir(out) as d:
            (d / "a").write_text("ours")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_well_formed_marker_is_taken_at_its_word(tmp_path: Path) -> None:
    """A marker is not signed: the files a well-formed one lists are calibkit's, and its folder is replaced."""
    out = tmp_path / "o"
    out.mkdir()
    (out / "a").write_text("written by whoever wrote the marker")
    (out / MARKER).write_text(json.dumps({"format": "calibkit-output/1", "files": ["a"]}))
    assert foreign_files(out) == []
    with atomic_dir(out) as d:
        (d / "b").write_text("b")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "b"]


def test_the_marker_records_each_top_level_file_by_sha256_and_a_change_is_found(tmp_path: Path) -> None:
    out = tmp_path / "cal"
    with atomic_dir(out) as d:
        (d / "calibration.json").write_text("{}")
        (d / "model.int8.onnx").write_bytes(b"int8")
        (d / "plots").mkdir()
        (d / "plots" / "a.png").write_bytes(b"png")
    rec = read_marker(out)
    assert rec is not None and {"calibration.json", "model.int8.onnx"} <= set(rec["sha256"])
    assert changed_files(out) == []
    (out / "model.int8.onnx").write_bytes(b"another model")
    assert changed_files(out) == ["model.int8.onnx"]
    (out / "calibration.json").unlink()
    assert changed_files(out) == ["calibration.json", "model.int8.onnx"]


def test_a_marker_without_digests_finds_no_change(tmp_path: Path) -> None:
    """What an older calibkit wrote (no ``sha256``) is read as before: nothing to compare against."""
    out = tmp_path / "o"
    out.mkdir()
    (out / "a").write_text("a")
    write_marker(out, "calibrate", entries=["a"])
    (out / "a").write_text("b")
    assert changed_files(out) == []


# -- engine sidecars -----------------------------------------------------------------------------------------

def _engine(tmp_path: Path) -> Path:
    engine = tmp_path / "e.onnx"
    engine.write_bytes(b"engine bytes " * 100)
    EngineArtifact(path=engine, precision=Precision.FP32, backend=Backend.ONNXRUNTIME,
                   source_model_sha256="ab" * 32).save()
    return engine


def test_a_sidecar_is_read_only_for_the_engine_it_describes(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    assert EngineArtifact.load(engine).precision is Precision.FP32
    engine.write_bytes(b"another build " * 100)  # replaced without its sidecar
    with pytest.raises(ModelError, match="describes another file"):
        EngineArtifact.load(engine)
    doc = json.loads(sidecar_path(engine).read_text())
    del doc["engine_fingerprint"]  # a sidecar of a calibkit before fingerprints: read as before
    sidecar_path(engine).write_text(json.dumps(doc))
    assert EngineArtifact.load(engine).source_model_sha256 == "ab" * 32


@pytest.mark.parametrize("sidecar", ["{", "[]", '"text"', "precision", "backend", "source_model_sha256",
                                     "tokenizer_sha256"])
def test_a_sidecar_that_is_not_usable_is_a_model_error(tmp_path: Path, sidecar: str) -> None:
    engine = _engine(tmp_path)
    doc = json.loads(sidecar_path(engine).read_text())
    if sidecar == "precision":
        doc["precision"] = "int9"
    elif sidecar == "backend":
        doc["backend"] = 7
    elif sidecar == "source_model_sha256":
        del doc["source_model_sha256"]
    elif sidecar == "tokenizer_sha256":
        doc["tokenizer_sha256"] = ["not", "a", "digest"]
    text = json.dumps(doc) if sidecar[0] not in "{[\"" else sidecar
    sidecar_path(engine).write_text(text)
    with pytest.raises(ModelError, match="sidecar|valid JSON"):
        EngineArtifact.load(engine)


# -- calibration.json ----------------------------------------------------------------------------------------

def _calibration(tmp_path: Path) -> Path:
    model = write_model_dir(tmp_path / "model")
    cal = tmp_path / "cal"
    cal.mkdir()
    (cal / "model.int8.onnx").write_bytes(b"the Q/DQ model calibkit wrote")
    table = CalibrationTable("ab" * 32, "set-1", Method.MINMAX, MethodParams(),
                             (TensorRange("x", 2.5, Method.MINMAX),), {})
    write_calibration_json(cal / "calibration.json", CalibrationDocument(
        table=table, source_model=str(model / "model.onnx"), tokenizer=str(model), files={"model": "model.int8.onnx"}))
    return cal / "calibration.json"


def test_calibration_json_names_its_files_by_sha256_and_a_changed_one_is_refused(tmp_path: Path) -> None:
    path = _calibration(tmp_path)
    load_calibration_json(path).check_named_files()
    model, beside = tmp_path / "model" / "model.onnx", path.parent / "model.int8.onnx"
    for changed, what in ((beside, "model named by"), (model, "the source model named by")):
        good = changed.read_bytes()
        changed.write_bytes(good + b"\0")
        replaced = rf"^{what} .*calibration\.json, .*/{re.escape(changed.name)}, was replaced"
        with pytest.raises(ModelError, match=replaced):
            load_calibration_json(path).check_named_files()
        changed.write_bytes(good)
    tok = tmp_path / "model" / "tokenizer.json"
    tok.write_text(tok.read_text().replace('"good"', '"fine"'))
    with pytest.raises(ModelError, match="tokenizer files"):
        load_calibration_json(path).check_named_files()


@pytest.mark.parametrize("case, message", [("format", "is not a calibkit calibration file"),
                                           ("ranges", "not a list of objects"), ("amax", "unusable range")])
def test_calibration_json_of_another_kind_or_with_unusable_ranges_is_refused(tmp_path: Path, case: str,
                                                                             message: str) -> None:
    path = _calibration(tmp_path)
    doc = json.loads(path.read_text())
    if case == "format":
        doc["format"] = "calibkit-compare/1"
    elif case == "ranges":
        doc["table"]["ranges"] = {"x": 2.5}
    else:
        doc["table"]["ranges"][0]["amax"] = float("nan")
    path.write_text(json.dumps(doc))
    with pytest.raises(CalibrationError, match=message):
        load_calibration_json(path)


# -- smoothing records: tune's work folder -------------------------------------------------------------------

class _Reused(Exception):
    """The smoothed copy in the work folder was taken as it is."""


def _smoothed_variant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, record: str | None,
                      model_onnx: bool = True) -> str:
    """What tune does with the smoothed copy of the model left in its work folder: "smoothed again" or
    "reused"."""
    folder = tmp_path / "work" / tune.SMOOTHED_FOLDER
    folder.mkdir(parents=True)
    if record is not None:
        (folder / smoothing.SMOOTHING_FILE).write_text(record)
    if model_onnx:
        (folder / "model.onnx").write_bytes(b"smoothed")

    def smooth(*args: object, **kwargs: object) -> None:
        raise ModelError("smoothed again")

    def reused(path: object) -> None:
        raise _Reused

    monkeypatch.setattr(smoothing, "smooth", smooth)
    monkeypatch.setattr(tune, "ModelDir", SimpleNamespace(resolve=reused))
    try:
        variant, why = tune._smoothed_variant(
            tmp_path / "model", SimpleNamespace(sha="ab" * 32), CalibrationSet(tmp_path / "set", (), None, id="set-1"),
            SimpleNamespace(batch_size=8), None, Resources(), False, None, tmp_path / "work")
    except _Reused:
        return "reused"
    assert variant is None
    return str(why)


GOOD_RECORD = json.dumps(document_json(SmoothingRecord(
    alpha="auto", source_sha256="ab" * 32, calibration_set_id="set-1", calibkit="0", paths="", source_model="m.onnx",
    texts=1, tokens=1, sampled_rows={}, groups=0, smoothed=0, not_smoothed_layout=(), max_output_deviation=0.0,
    layers=(), timings={})))


@pytest.mark.parametrize("record, model_onnx, outcome", [
    (GOOD_RECORD, True, "reused"),
    (None, True, "smoothed again"),
    (GOOD_RECORD.replace("ab", "cd"), True, "smoothed again"),
    (GOOD_RECORD.replace("set-1", "set-2"), True, "smoothed again"),
    ('["not", "a", "record"]', True, "smoothed again"),
    (GOOD_RECORD, False, "smoothed again"),
], ids=["same-model-and-set", "no-record", "another-model", "another-set", "not-an-object", "no-model"])
def test_tune_reuses_a_smoothed_copy_only_for_the_same_model_and_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     record: str | None, model_onnx: bool,
                                                                     outcome: str) -> None:
    assert _smoothed_variant(tmp_path, monkeypatch, record, model_onnx) == outcome


def test_a_smoothing_record_that_is_not_json_is_smoothed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _smoothed_variant(tmp_path, monkeypatch, GOOD_RECORD[:20]) == "smoothed again"


# -- a shared statistics cache -------------------------------------------------------------------------------

SHA, KEY, BINS, TENSORS = "ab" * 32, "set+enc:0", 64, ["a", "b"]


def _store(sha: str = SHA, scale: float = 1.0) -> StatsStore:
    rng = np.random.default_rng(0)
    stats = {}
    for i, t in enumerate(TENSORS):
        acc = StatsAccumulator(t, BINS)
        acc.observe((rng.standard_normal(500) * (1 + 3 * i) * scale).astype(np.float32))
        stats[t] = acc.freeze()
    return StatsStore(stats, BINS, {"model_sha256": sha, "stats_set_key": KEY})


def test_an_entry_of_another_model_in_the_key_folder_is_never_used(tmp_path: Path) -> None:
    other = save_stats(_store(sha="cd" * 32), TENSORS, tmp_path / "other")
    assert other is not None
    path = stats_path(SHA, KEY, TENSORS, BINS, tmp_path / "cache")
    path.parent.mkdir(parents=True)
    path.write_bytes(other.read_bytes())  # another run's entry, under this model's name
    assert find_stats(SHA, KEY, TENSORS, BINS, tmp_path / "cache") is None
    assert not path.exists(), "another run's entry: removed, so the statistics are collected again"
    assert find_stats("cd" * 32, KEY, TENSORS, BINS, tmp_path / "other") is not None


def test_an_entry_is_written_whole_under_a_temporary_name_or_not_at_all(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    path = stats_path(SHA, KEY, TENSORS, BINS, tmp_path)
    seen: list[bool] = []

    def full_disk(fh: object, **arrays: object) -> None:
        fh.write(b"PK\x03\x04 half an entry")  # type: ignore[attr-defined]
        seen.append(path.exists())
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez_compressed", full_disk)
    with caplog.at_level(logging.WARNING, logger="calibkit.calibrate"):
        assert save_stats(_store(), TENSORS, tmp_path) is None
    assert seen == [False], "written under another name while it is written"
    assert not path.exists() and list(path.parent.iterdir()) == [], "nothing half-written left"
    assert "could not save statistics" in caplog.text


_UNPICKLED: list[str] = []


def _unpickled(word: str) -> str:
    _UNPICKLED.append(word)
    return word


class _Payload:
    """An object whose unpickling calls :func:`_unpickled`: it must never be unpickled."""
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (_unpickled, ("unpickled",))


def test_an_entry_holding_a_pickle_is_never_unpickled(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = save_stats(_store(), TENSORS, tmp_path)
    assert path is not None
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["counts"] = np.array([_Payload()], dtype=object)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    with np.load(path, allow_pickle=True) as z:  # the entry does hold a pickle that would run
        z["counts"]
    assert _UNPICKLED == ["unpickled"]
    _UNPICKLED.clear()
    with caplog.at_level(logging.WARNING, logger="calibkit.calibrate"):
        assert find_stats(SHA, KEY, TENSORS, BINS, tmp_path) is None
    assert _UNPICKLED == [] and "unreadable" in caplog.text and not path.exists()


def test_a_consistent_entry_is_used_whoever_wrote_it(tmp_path: Path) -> None:
    """The limit of sharing: verification checks what an entry means, not who wrote it. Statistics of other
    data, saved under this model's and set's key by anyone who can write the folder, are self-consistent and
    used: a cache folder is as trustworthy as the people who can write it."""
    assert save_stats(_store(scale=10.0), TENSORS, tmp_path) is not None
    found = find_stats(SHA, KEY, TENSORS, BINS, tmp_path)
    assert found is not None
    assert found[0]["b"].absmax == _store(scale=10.0)["b"].absmax != _store()["b"].absmax


def test_another_sets_statistics_under_this_key_are_used_unless_fresh_stats(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The same limit end to end: another calibration set's statistics, saved under this set's key, become
    this calibration's ranges; ``--fresh-stats`` reads no entry and measures this set's own."""
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    model = write_model_dir(tmp_path / "model")
    write_calibration_set(tmp_path / "a", texts(12, seed=3), None)
    write_calibration_set(tmp_path / "b", texts(12, seed=8, max_words=3), None)

    def ranges(cset: str, out: str, *extra: str) -> dict[str, float]:
        r = run("calibrate", model, "-c", tmp_path / cset, "--method", "minmax", "--out", tmp_path / out, *extra)
        assert r.exit_code == 0, r.output
        doc = json.loads((tmp_path / out / "calibration.json").read_text())
        return {x["tensor"]: x["amax"] for x in doc["table"]["ranges"]}

    own = ranges("a", "cal-a")
    (entry_a,) = [p for p in (tmp_path / "cache").rglob("*.npz")]
    other = ranges("b", "cal-b")
    assert other != own
    (entry_b,) = [p for p in (tmp_path / "cache").rglob("*.npz") if p != entry_a]
    a, b = StatsStore.load(entry_a), StatsStore.load(entry_b)
    StatsStore(b.stats, b.num_bins, a.meta).save(entry_a)  # b's statistics under a's key
    assert ranges("a", "again") == other
    assert ranges("a", "fresh", "--fresh-stats") == own


# -- a folder where a file is written ------------------------------------------------------------------------

def test_build_into_a_folder_is_refused_and_the_folder_untouched(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    model = write_model_dir(tmp_path / "model")
    out = tmp_path / "fp32.onnx"  # a folder named as an engine would be
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    r = run("build", model, "--precision", "fp32", "-o", out)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and "is a folder" in flat(r)
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"


# -- a broken pipe that is not stdout ------------------------------------------------------------------------

def test_a_broken_pipe_that_is_not_stdouts_is_an_os_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as info:
        with handle_errors():
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")
    assert info.value.exit_code == 2 != STDOUT_GONE_EXIT
    err = " ".join(capsys.readouterr().err.split())
    assert "a pipe closed" in err and "worker" in err


# -- the library's CI gate -----------------------------------------------------------------------------------

def test_the_library_returns_the_gate_the_command_line_exits_on(tmp_path: Path) -> None:
    """``ck.compare(..., min_agreement=, max_drop=)`` carries ``gate``: the targets and what the result misses of
    them, the lines ``calibkit compare`` prints and exits 8 on. Checked against the result's own values, so it
    holds whatever this CPU's INT8 kernels make of the tiny model; no target, no gate."""
    tmp = build_engines(tmp_path, eval_texts=texts(24, seed=5))

    def compare(**targets: float) -> object:
        return ck.compare(tmp / "e" / "fp32.onnx", tmp / "e" / "int8.onnx", tmp / "eval.jsonl", traffic=None,
                          layers=False, sensitivity=False, speed=False, batch_size=8, workers=1, **targets)

    assert compare(min_agreement=0.0, max_drop=100.0).gate == Gate(0.0, 100.0, ())
    res = compare(min_agreement=100.0, max_drop=0.0)
    assert res.gate == Gate(100.0, 0.0, missed_targets(res, min_agreement=100.0, max_drop=0.0))
    res = compare(min_agreement=100.0)  # agreement only
    assert res.gate == Gate(100.0, None, missed_targets(res, min_agreement=100.0))
    assert (res.gate.missed == ()) == (res.agreement == 1.0)
    assert compare().gate is None


# -- log lines over 64 MiB -----------------------------------------------------------------------------------

def test_a_line_over_the_limit_is_counted_too_long_and_never_kept(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines over ``MAX_LINE_BYTES`` (64 MiB) are counted as ``too_long``; the limit lowered to 1 kB here, so
    one line spans several read blocks (skipped unread) and one fits in a block (dropped whole)."""
    assert logs.MAX_LINE_BYTES == 64 << 20
    monkeypatch.setattr(logs, "MAX_LINE_BYTES", 1000)
    ok = [json.dumps({"text": f"request {i}"}) for i in range(3)]
    long_line = json.dumps({"text": "x" * 3_000_000})  # over the limit and over two read blocks
    short_over = json.dumps({"text": "y" * 2000})
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join([ok[0], long_line, ok[1], short_over, ok[2], long_line]))  # the last one unended
    st = logs.ReadStats()
    recs = list(logs.read_log(log, ["text"], None, stats=st))
    assert [r.text for r in recs] == ["request 0", "request 1", "request 2"]
    assert st.broken["too_long"] == 3 and st.first_lines["too_long"] == [2, 4, 6]
    assert st.lines == 6


# -- build --calibration of another model --------------------------------------------------------------------

def test_build_refuses_a_calibration_of_another_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    model = write_model_dir(tmp_path / "model")
    other = write_model_dir(tmp_path / "other", seed=3)
    write_calibration_set(tmp_path / "set", texts(12, seed=3), None)
    r = run("calibrate", model, "-c", tmp_path / "set", "--method", "minmax", "--out", tmp_path / "cal")
    assert r.exit_code == 0, r.output
    r = run("build", other, "-p", "int8", "--calibration", tmp_path / "cal", "-o", tmp_path / "x.onnx")
    assert r.exit_code == 5, r.output
    assert "computed for another model" in flat(r) and not (tmp_path / "x.onnx").exists()


# -- an older report document ----------------------------------------------------------------------------------

def test_an_older_report_is_rendered_with_a_warning_and_refused_by_the_library(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    doc = tmp_path / "old.json"
    doc.write_text(json.dumps({"format": "calibkit-compare/0", "agreement": 0.5}))
    with pytest.raises(DataError, match="calibkit-compare/0"):
        ck.load_report(doc)
    with caplog.at_level(logging.WARNING, logger="calibkit.report"):
        r = run("report", doc, "--out", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    assert "calibkit-compare/0 is older than calibkit-compare/1" in caplog.text
    assert (tmp_path / "rep" / "report.md").is_file()


# -- a table the Q/DQ writer is given (tune's tables) ----------------------------------------------------------

@pytest.mark.parametrize("amax", [float("nan"), float("inf"), -1.0, 1e-42])
def test_the_qdq_writer_refuses_an_unusable_range_of_any_table(amax: float) -> None:
    """tune's tables never pass through calibration.json: the Q/DQ writer checks their ranges itself."""
    model = tiny_model()
    tensors = plan_placement(model, DEFAULT_OP_TYPES, ()).activations
    ranges = tuple(TensorRange(t, amax if i == 0 else 1.0, Method.MINMAX) for i, t in enumerate(tensors))
    table = CalibrationTable("ab" * 32, "set-1", Method.MINMAX, MethodParams(), ranges, {})
    with pytest.raises(CalibrationError, match=re.escape(tensors[0])):
        quantize_model(model, table)
    good = CalibrationTable("ab" * 32, "set-1", Method.MINMAX, MethodParams(),
                            tuple(TensorRange(t, 1.0, Method.MINMAX) for t in tensors), {})
    assert quantize_model(model, good).model is not None


# -- an eval-set text holding a lone surrogate ---------------------------------------------------------------

def test_an_eval_text_with_a_lone_surrogate_is_an_error_naming_the_example(tmp_path: Path) -> None:
    p = tmp_path / "eval.jsonl"
    p.write_text(json.dumps({"text": "fine", "label": "positive"}) + "\n" + '{"text": "bad \\udc00", "label": "x"}\n')
    with pytest.raises(DataError, match="example 2"):
        load_eval_set(p)


# -- a model's identity, recorded by an older document -----------------------------------------------------------

def test_an_older_documents_digest_of_an_external_data_model_is_accepted(tmp_path: Path) -> None:
    """Before a model's identity covered its external data, documents recorded model.onnx's own sha256."""
    plain = write_model_dir(tmp_path / "plain") / "model.onnx"
    ext = tmp_path / "ext" / "model.onnx"
    ext.parent.mkdir()
    onnx.save_model(onnx.load(str(plain)), str(ext), save_as_external_data=True, size_threshold=0,
                    location="weights.bin")
    older = sha256_file(ext)
    assert older != model_sha256(ext)
    check_file(ext, older, what="the source model", hint="rebuild")  # accepted
    check_file(ext, model_sha256(ext), what="the source model", hint="rebuild")
    with pytest.raises(ModelError, match="was replaced"):
        check_file(ext, "0" * 64, what="the source model", hint="rebuild")


# -- documents name their files relative to their own folder ----------------------------------------------------

def test_documents_name_paths_relative_up_to_two_levels_up_and_absolute_beyond(tmp_path: Path) -> None:
    doc = tmp_path / "a" / "b" / "cal" / "calibration.json"
    assert record_path(doc, tmp_path / "a" / "b" / "cal" / "model.int8.onnx") == "model.int8.onnx"
    assert record_path(doc, tmp_path / "a" / "b" / "model" / "model.onnx") == "../model/model.onnx"
    assert record_path(doc, tmp_path / "a" / "m" / "model.onnx") == "../../m/model.onnx"
    far = tmp_path / "elsewhere" / "model.onnx"
    assert record_path(doc, far) == str(far.resolve())  # three levels up: absolute
    written = json.loads(_calibration(tmp_path / "near").read_text())
    assert written["source_model"] == "../model/model.onnx" and written["tokenizer"] == "../model"
    assert written["paths"] == "relative to this document's folder"

    engines = tmp_path / "a" / "b" / "engines"
    assert _rel(tmp_path / "a" / "b" / "model" / "model.onnx", engines) == "../model/model.onnx"
    assert _rel(tmp_path / "a" / "m" / "model.onnx", engines) == "../../m/model.onnx"
    assert _rel(far, engines) == str(far.resolve())


# -- control characters in log lines -----------------------------------------------------------------------------

def test_control_characters_in_a_log_line_are_shown_as_escapes(tmp_path: Path) -> None:
    """The real console script: ``calibkit report`` logs a warning naming an older document, whose file name
    holds an ANSI escape and a bidirectional override."""
    import subprocess
    import sys

    doc = tmp_path / "old\x1b[2J\u202e.json"
    doc.write_text(json.dumps({"format": "calibkit-compare/0", "agreement": 0.5}))
    done = subprocess.run([sys.executable, "-m", "calibkit", "report", str(doc), "--out", str(tmp_path / "rep")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "is older than" in done.stderr, done.stderr  # the log line was printed
    assert "\x1b" not in done.stderr and "\u202e" not in done.stderr
    assert "\\x1b" in done.stderr


# -- tune --out O --report D: committed together ---------------------------------------------------------------

def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_tune_failing_on_a_full_disk_keeps_out_and_report_of_one_run(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:

    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    f = sensitive_folder(tmp_path, 200)
    out, rep = tmp_path / "o", tmp_path / "rep"
    args = ["tune", f["model"], "-c", f["cset"], "-e", f["eval"], "--out", out, "--report", rep, "--method", "minmax",
            "--no-smooth", "--workers", "1"]
    r = run(*args)
    assert r.exit_code == 0, r.output
    for folder in (out, rep):  # what the first run wrote, marked
        doc = folder / ("tune.json" if folder == out else "report.json")
        doc.write_text(doc.read_text().replace("{", '{"marker-of-the-first-run": true, ', 1))
    before = (_files(out), _files(rep))
    full_disk_on_html(monkeypatch)
    r = run(*args)
    assert r.exit_code == 2 and "No space left" in flat(r), r.output
    assert (_files(out), _files(rep)) == before, "both outputs of the first run"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith((".tmp", ".old"))) == []
