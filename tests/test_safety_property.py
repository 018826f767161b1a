"""Property-based: hypothesis generates eval sets, logs, id2label maps, TensorRT caches and option
values for every command, and every run must end well.

The property, for any input: exit code 0 or 2-7; a failure is one message with a hint (calibkit's ``error:`` /
``hint:`` lines, or click's usage error with its ``Try '... --help'``); no traceback; nothing outside ``--out``
touched (the statistics cache, a designed side effect, lives in its own folder); and after exit 0 the output
loads with calibkit's own reader.

Budget: the default profile runs a few examples per test (CI, well under a minute on 2 cores);
``HYPOTHESIS_PROFILE=ci`` or ``=slow`` (tests/conftest.py) runs many more. Examples are derandomized in the
default profile, so a CI failure reproduces locally with the same command.
"""

from __future__ import annotations

import json
import math
import shutil
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("hypothesis")

from calib_helpers import WORDS, texts  # noqa: E402
from cli_helpers import build_engines, run  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from calibkit.cli import app  # noqa: E402

# ------------------------------------------------------------------------------------------- the shared inputs


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = build_engines(tmp_path_factory.mktemp("property"), eval_texts=texts(40, seed=5))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CALIBKIT_CACHE", str(tmp / "cache"))
        r = run("compare", tmp / "e" / "fp32.onnx", tmp / "e" / "int8.onnx", "-e", tmp / "eval.jsonl", "--json",
                tmp / "doc.json", "--no-report", "--no-sensitivity")
    assert r.exit_code == 0, r.output
    return tmp


def _snapshot(root: Path, skip: tuple[Path, ...], out_name: str = "\0") -> dict[str, tuple[int, int]]:
    """Size and mtime of everything under ``root`` except ``skip`` and the output's own files (an engine's
    ``NAME.calibkit.json`` / ``NAME.data`` beside ``NAME``)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if any(s == p or s in p.parents for s in skip) or p.name.startswith(out_name):
            continue
        st_ = p.lstat()
        out[str(p)] = (st_.st_size, st_.st_mtime_ns)
    return out


def _loads(out: Path, command: str) -> None:
    """The output of a successful run, read back with calibkit's own reader."""
    if command == "sample":
        from calibkit.data.calibset import load_calibration_set

        assert len(load_calibration_set(out).texts) > 0
    elif command in ("calibrate", "calibrate --from-cache", "tune"):
        from calibkit.quantize.tablefile import load_calibration_json

        assert load_calibration_json(out).table.ranges
    elif command == "smooth":
        from calibkit.data.modeldir import ModelDir
        from calibkit.graph import load_model

        load_model(ModelDir.resolve(out).onnx_path)
    elif command == "build":
        from calibkit.enginefiles.artifact import EngineArtifact

        EngineArtifact.load(out)
    elif command == "compare":
        doc = json.loads(out.read_text(encoding="utf-8"))
        assert str(doc["format"]).startswith("calibkit-compare/")
    elif command == "report":
        assert (out / "report.html").is_file() and (out / "report.md").is_file()
    else:  # pragma: no cover - every command above
        raise AssertionError(command)


def check_run(assets: Path, work: Path, out: Path, command: str, args: list[object]) -> int:
    """Run ``args``; assert the property; return the exit code."""
    cache = work.parent / f"{work.name}-cache"
    # tune's ledger beside OUT (.OUT.tune) is part of its output by design: a failed run resumes from it
    skip = (out, out.parent / f".{out.name}.calibkit-lock", out.parent / f".{out.name}.tune", cache, assets / "cache",
            *([out.parent] if out.parent != work else []))  # a folder made for the output file
    before = [_snapshot(r, skip, out.name) for r in (assets, work)]
    mp = pytest.MonkeyPatch()
    mp.setenv("CALIBKIT_CACHE", str(cache))
    try:
        r = CliRunner().invoke(app, [str(a) for a in args])
    finally:
        mp.undo()
    text = r.output
    assert r.exit_code == 0 or 2 <= r.exit_code <= 7, (args, r.exit_code, text, r.exception)
    assert "Traceback" not in text, text
    if r.exit_code:
        click_usage = "Usage:" in text and "Try '" in text and "Error" in text
        assert click_usage or (text.count("error:") == 1 and text.count("hint:") == 1), text
    assert [_snapshot(x, skip, out.name) for x in (assets, work)] == before, f"a file outside --out was touched: {args}"
    assert not list(out.parent.glob(f".{out.name}.*.tmp")) and not list(out.parent.glob(f".{out.name}.*.old"))
    if r.exit_code == 0:
        _loads(out, command)
    return r.exit_code


def _in_tmp(fn: Callable[[Path], None]) -> None:
    with tempfile.TemporaryDirectory(prefix="calibkit-property-") as d:
        work = Path(d) / "case"
        work.mkdir()
        fn(work)


# ------------------------------------------------------------------------------------------------ strategies

hostile_text = st.one_of(
    st.sampled_from(["", " ", "\u200b\u200b", "\ufeff", "\x00\x01", ":x: :smile:", "[/x]", "[bold]red", "\ud83d",
                     "\udc00 text"]),
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=8).map(" ".join),
    st.text(max_size=30),
)
hostile_label = st.one_of(
    st.sampled_from(["positive", "negative", "POSITIVE", "0", "1", "2", "-1", "NaN", "nan", "inf", "Infinity",
                     "1e999", "", " ", "unknown", ":x:"]),
    st.sampled_from([0, 1, 2, -1, 1.0, 0.5, math.nan, math.inf, -math.inf, True, None, [], {}, [0, 1], 10 ** 30]),
)


@st.composite
def eval_files(draw: st.DrawFn) -> tuple[str, bytes]:
    rows = draw(st.lists(st.tuples(hostile_text, hostile_label), min_size=0, max_size=6))
    good = [(t, ["negative", "positive"][i % 2]) for i, t in enumerate(texts(draw(st.integers(0, 20)), seed=9))]
    rows = good + rows
    fmt = draw(st.sampled_from(["jsonl", "jsonl", "csv", "tsv"]))
    if fmt == "jsonl":
        lines = [json.dumps({"text": t, "label": lab}) for t, lab in rows]
        lines += draw(st.lists(st.sampled_from(['{"text": "cut', "[1, 2]", "NaN", '{"text": "\\udc00", "label": 1}',
                                                "[" * 3000]), max_size=2))
        return "eval.jsonl", ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
    sep = "," if fmt == "csv" else "\t"
    body = "".join(f"{str(t).replace(sep, ' ')}{sep}{lab}\n" for t, lab in rows)
    return f"eval.{fmt}", (f"text{sep}label\n" + body).encode("utf-8", "surrogatepass")


@st.composite
def log_files(draw: st.DrawFn) -> bytes:
    lines = [json.dumps({"text": t}).encode() for t in texts(draw(st.integers(0, 30)), seed=7)]
    bad = st.one_of(
        st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
        hostile_text.map(lambda t: json.dumps({"text": t}).encode("utf-8", "surrogatepass")),
        hostile_label.map(lambda v: json.dumps({"text": v}).encode()),
        st.sampled_from([b"[" * 5000, b'{"text": "cut', b"NaN", b"1" * 5000, b'{"txt": "misspelt"}']),
    )
    for line in draw(st.lists(bad, max_size=6)):
        lines.insert(draw(st.integers(0, len(lines))), line)
    return b"\n".join(lines) + b"\n"


id2label_maps = st.one_of(
    st.dictionaries(st.integers(0, 3).map(str), st.sampled_from(["negative", "positive", ":x:", "[/x]"]),
                    min_size=1, max_size=4),
    st.dictionaries(st.sampled_from(["a", "-1", "0.5", "1e3", " 0", "00", "4294967296"]), st.just("x"), max_size=3),
    st.lists(st.sampled_from(["negative", "positive"]), max_size=3),
    st.dictionaries(st.just("0"), st.sampled_from([["x"], 5, None, {"a": 1}]), min_size=1),
    st.sampled_from([None, 5, "labels", {}]),
    st.integers(2, 3000).map(lambda n: {str(i): f"label{i}" for i in range(n)}),
)


def _hex(value: float) -> str:
    return format(struct.unpack(">I", struct.pack(">f", value))[0], "x")


scale_hex = st.one_of(
    st.floats(width=32, allow_nan=True, allow_infinity=True).map(_hex),
    st.sampled_from(["7f800000", "ff800000", "7fc00000", "0", "1", "zz", "1" * 10, "-3c000000", ""]),
)

_ints = st.sampled_from(["-1", "0", "1", "3", "4294967296", str(10 ** 20), "9" * 40, "x", "1.5", "nan", "inf", "",
                         "True"])
_floats = st.sampled_from(["-1", "0", "0.5", "1", "99.99", "100", "nan", "-nan", "inf", "-inf", "1e308", "1e999",
                           "-1e300", "x", "", "1,5"])
_sizes = st.sampled_from(["0", "1", "1K", "512M", "4G", "-1G", "9" * 400 + "G", "1e3", "x", ""])
OPTIONS: dict[str, dict[str, st.SearchStrategy[str]]] = {
    "sample": {"--size": _ints, "--seed": _ints, "--clusters": _ints,
               "--text-field": st.sampled_from(["text", "", "a.b", "missing", ":x:", "text,other"]),
               "--label-field": st.sampled_from(["label", "", "x.y"])},
    "calibrate": {"--method": st.sampled_from(["entropy", "minmax", "percentile", "mse", "x", ""]),
                  "--percentile": _floats, "--batch-size": _ints, "--num-bins": _ints, "--memory-budget": _sizes,
                  "--max-batch-tokens": _ints, "--target": st.sampled_from(["tensorrt", "onnxruntime", "x"]),
                  "--exclude": st.sampled_from(["", "[", "*", "layer.0"]), "--op-types": st.sampled_from(
                      ["MatMul", "", "Conv", "x"])},
    "build": {"--min-seq": _ints, "--opt-seq": _ints, "--max-seq": _ints, "--workspace-mib": _ints,
              "--precision": st.sampled_from(["fp32", "fp16", "int8", "int4", ""]),
              "--target": st.sampled_from(["tensorrt", "onnxruntime", "x"]),
              "--exclude": st.sampled_from(["", "[", "*"]), "--backend": st.sampled_from(["onnxruntime", "x"])},
    "compare": {"--seed": _ints, "--limit": _ints, "--batch-size": _ints, "--layer-samples": _ints,
                "--max-disagreements": _ints, "--threshold-sqnr": _floats, "--threshold-clipped": _floats,
                "--threshold-outlier": _floats, "--threshold-recovery": _floats, "--threshold-cost": _floats,
                "--threshold-cosine": _floats, "--threshold-zeroed-weights": _floats,
                "--sensitivity-samples": _ints, "--workers": _ints,
                "--traffic-size": _ints, "--min-agreement": _floats, "--max-drop": _floats,
                "--task": st.sampled_from(["classification", "embedding", "regression", "multi-label", "x"]),
                "--memory-budget": _sizes, "--max-batch-tokens": _ints, "--sensitivity-layers": _ints,
                "--text-column": st.sampled_from(["text", "label", "x", ""]),
                "--label-column": st.sampled_from(["label", "text", "x", ""])},
    "tune": {"--seed": _ints, "--max-drop": _floats, "--min-agreement": _floats, "--holdout": _floats,
             "--max-evaluations": _ints, "--agreement-confidence": _floats, "--percentile": _floats,
             "--limit": _ints, "--method": st.sampled_from(["auto", "entropy", "x"]),
             "--sensitivity-samples": _ints, "--memory-budget": _sizes, "--min-cosine": _floats, "--workers": _ints,
             "--max-batch-tokens": _ints, "--sensitivity-layers": _ints, "--traffic-size": _ints},
    "smooth": {"--alpha": st.sampled_from(["0.5", "auto", "0", "1", "1.5", "-1", "nan", "x"]),
               "--batch-size": _ints, "--memory-budget": _sizes, "--max-batch-tokens": _ints},
}


def test_the_options_cover_every_numeric_option_of_these_commands() -> None:
    """Every int or float option of the commands above is driven with NaN, infinities, huge, negative and
    non-numeric values (the other commands' are by test_safety_validation's parser test)."""
    from test_safety_validation import NUMERIC

    missing = [f"{cmd} {opt}" for cmd, opt, _ in NUMERIC if cmd in OPTIONS and opt not in OPTIONS[cmd]]
    assert missing == []


def _base(assets: Path, command: str, work: Path, out: Path) -> list[object]:
    e = assets / "e"
    return {
        "sample": ["sample", work / "log.jsonl", "--size", "6", "--clusters", "1", "--out", out],
        "calibrate": ["calibrate", assets / "model", "-c", assets / "set", "--out", out, "--workers", "1"],
        "build": ["build", assets / "model", "-p", "fp32", "--calibration", assets / "cal", "-o", out],
        "compare": ["compare", e / "fp32.onnx", e / "int8.onnx", "-e", assets / "eval.jsonl", "--json", out,
                    "--no-report", "--no-sensitivity", "--workers", "1", "--layer-samples", "8"],
        "tune": ["tune", assets / "model", "-c", assets / "set", "-e", assets / "eval.jsonl", "--out", out,
                 "--no-report", "--workers", "1", "--max-evaluations", "2", "--sensitivity-samples", "8"],
        "smooth": ["smooth", assets / "model", "-c", assets / "set", "--out", out],
    }[command]


# ------------------------------------------------------------------------------------------------- properties


@given(eval_files())
def test_any_eval_set(assets: Path, case: tuple[str, bytes]) -> None:
    name, data = case

    def one(work: Path) -> None:
        (work / name).write_bytes(data)
        out = work / "doc.json"
        check_run(assets, work, out, "compare",
                  ["compare", assets / "e" / "fp32.onnx", assets / "e" / "int8.onnx", "-e", work / name, "--json",
                   out, "--no-report", "--no-sensitivity", "--workers", "1", "--layer-samples", "8"])

    _in_tmp(one)


@given(log_files(), st.sampled_from(["4", "1", "50"]), st.booleans())
def test_any_log(assets: Path, log: bytes, size: str, strict: bool) -> None:
    def one(work: Path) -> None:
        (work / "log.jsonl").write_bytes(log)
        out = work / "set"
        check_run(assets, work, out, "sample", ["sample", work / "log.jsonl", "--size", size, "--clusters", "1",
                                                "--out", out, *(["--strict"] if strict else [])])

    _in_tmp(one)


@given(id2label_maps, st.sampled_from(["build", "compare", "calibrate"]))
def test_any_id2label(assets: Path, id2label: object, command: str) -> None:
    def one(work: Path) -> None:
        model = work / "model"
        shutil.copytree(assets / "model", model)
        cfg = json.loads((model / "config.json").read_text())
        cfg["id2label"] = id2label
        (model / "config.json").write_text(json.dumps(cfg))
        if command == "build":
            out = work / "e" / "fp32.onnx"
            check_run(assets, work, out, "build", ["build", model, "-p", "fp32", "-o", out])
        elif command == "calibrate":
            out = work / "cal"
            check_run(assets, work, out, "calibrate", ["calibrate", model, "-c", assets / "set", "--out", out])
        else:  # an engine whose sidecar (written before labels were recorded) names the edited folder
            engine = work / "engines" / "fp32.onnx"
            shutil.copytree(assets / "e", engine.parent)
            sidecar = json.loads((engine.parent / "fp32.onnx.calibkit.json").read_text())
            sidecar.update(tokenizer=str(model), labels_sha256=None)
            (engine.parent / "fp32.onnx.calibkit.json").write_text(json.dumps(sidecar))
            out = work / "doc.json"
            check_run(assets, work, out, "compare", ["compare", engine, engine, "-e", assets / "eval.jsonl", "--json",
                                                     out, "--no-report", "--no-layers"])

    _in_tmp(one)


@given(st.lists(st.tuples(st.booleans(), scale_hex), min_size=0, max_size=8),
       st.sampled_from(["TRT-8601-EntropyCalibration2", "TRT-x", "", "\udc00"]))
def test_any_tensorrt_cache(assets: Path, entries: list[tuple[bool, str]], header: str) -> None:
    good = (assets / "cal" / "calibration.cache").read_text().splitlines()
    names = [line.rpartition(": ")[0] for line in good[1:]]

    def one(work: Path) -> None:
        lines = [header] + good[1:]
        for i, (known, value) in enumerate(entries):
            name = names[i % len(names)] if known else f"(Unnamed Layer* {i}) [Shuffle]_output"
            lines.append(f"{name}: {value}")
        cache = work / "c.cache"
        cache.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
        out = work / "fc"
        check_run(assets, work, out, "calibrate --from-cache",
                  ["calibrate", assets / "model", "--from-cache", cache, "--out", out])

    _in_tmp(one)


@st.composite
def command_lines(draw: st.DrawFn) -> tuple[str, dict[str, str]]:
    command = draw(st.sampled_from(sorted(OPTIONS)))
    pool = OPTIONS[command]
    names = draw(st.lists(st.sampled_from(sorted(pool)), min_size=1, max_size=3, unique=True))
    return command, {n: draw(pool[n]) for n in names}


@given(command_lines())
def test_any_option_values(assets: Path, line: tuple[str, dict[str, str]]) -> None:
    command, options = line

    def one(work: Path) -> None:
        (work / "log.jsonl").write_text("".join(json.dumps({"text": t, "label": "x"}) + "\n"
                                                for t in texts(30, seed=1)))
        out = work / ("out.onnx" if command == "build" else "doc.json" if command == "compare" else "out")
        args = _base(assets, command, work, out)
        for name, value in options.items():  # a later value of an option replaces the base one
            args += [name, value]
        check_run(assets, work, out, command, args)

    _in_tmp(one)


def test_a_report_from_a_compare_document(assets: Path) -> None:
    """``report`` completes the set of commands: its input is the compare document of the fixture."""
    def one(work: Path) -> None:
        assert check_run(assets, work, work / "rep", "report",
                         ["report", assets / "doc.json", "--out", work / "rep"]) == 0

    _in_tmp(one)
