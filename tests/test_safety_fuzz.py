"""Fuzz-style: generated hostile logs, eval sets, calibration tables and TensorRT caches fed to the CLI.

Every case must end with an exit code in 2-7, exactly one error message with a hint, no traceback, and no file
outside the command's --out touched. Plain ``random`` with fixed seeds: the same cases on every run.
``CALIBKIT_FUZZ_CASES=150`` runs more cases per kind (600 in about 20 s on 2 cores).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from calib_helpers import texts
from cli_helpers import build_engines, run

CASES = int(__import__("os").environ.get("CALIBKIT_FUZZ_CASES", "12"))


def _snapshot(root: Path, skip: Path) -> dict[str, tuple[int, float]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime) for p in sorted(root.rglob("*"))
            if skip != p and skip not in p.parents}


def _check(root: Path, out: Path, args: list[object], inputs: Path | None = None) -> str:
    """``root`` holds the case's files, ``inputs`` the shared model and engines: neither may change."""
    roots = [root] if inputs is None else [root, inputs]
    before = [_snapshot(r, out) for r in roots]
    r = run(*args)
    text = r.output
    assert 2 <= r.exit_code <= 7, (args, r.exit_code, text, r.exception)
    assert "Traceback" not in text, text
    assert text.count("error:") == 1 and text.count("hint:") == 1, text
    assert [_snapshot(r, out) for r in roots] == before, "a file outside --out was touched"
    return text


def _hostile_value(rng: random.Random) -> object:
    return rng.choice([
        None, True, 0, -1, 1e308, [], {}, "", "\u200b" * rng.randint(1, 5), "\udc00", "\ud83d",
        {"nested": {"deeper": ["x"]}}, "x" * rng.randint(1, 3), "[/x]", "[bold]", 10 ** 20,
    ])


def _deep(rng: random.Random) -> str:
    n = rng.randint(5_000, 120_000)
    return rng.choice(["[", '{"a":']) * n


def _bad_line(rng: random.Random) -> bytes:
    kind = rng.randrange(9)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 40))).replace(b"\n", b"")
    if kind == 1:
        return _deep(rng).encode()
    if kind == 2:
        return json.dumps([_hostile_value(rng)]).encode()
    if kind == 3:
        return json.dumps({"txet": "misspelt field"}).encode()
    if kind == 4:
        return json.dumps({"text": _hostile_value(rng)}).encode() if rng.random() < 0.5 else b'{"text": "\\udc00"}'
    if kind == 5:
        return json.dumps({"text": "\u200b\ufeff\u2060" * rng.randint(1, 4)}).encode()
    if kind == 6:
        return b'{"text": "truncated'
    if kind == 7:
        return b"NaN"
    return b"1" * rng.randint(5000, 6000)  # an integer over Python's digit limit


@pytest.mark.parametrize("seed", range(CASES))
def test_hostile_logs(tmp_path: Path, seed: int) -> None:
    rng = random.Random(1000 + seed)
    log = tmp_path / rng.choice(["[/x]", "a b", "logs"]) / rng.choice(["prod.jsonl", "[bold]x.jsonl"])
    log.parent.mkdir(parents=True)
    lines = [_bad_line(rng) for _ in range(rng.randint(1, 30))]
    log.write_bytes(b"\n".join(lines) + rng.choice([b"", b"\n", b"\r\n"]))
    out = tmp_path / "out"
    extra = rng.choice([[], ["--text-field", "text"], ["--strict"], ["--label-field", "label"]])
    _check(tmp_path, out, ["sample", log, "--size", "4", "--out", out, *extra])


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_engines(tmp_path_factory.mktemp("fuzz"))


def _eval_row(rng: random.Random, bad: bool) -> str:
    if not bad:
        return json.dumps({"text": " ".join(rng.choice(["good", "bad", "movie"]) for _ in range(3)),
                           "label": rng.choice(["positive", "negative"])})
    return rng.choice([
        lambda: json.dumps({"text": rng.choice([None, 0, [], {}, "", "\u200b", True, {"a": "b"}]),
                            "label": "positive"}),
        lambda: json.dumps({"text": "fine", "label": rng.choice([None, "", "unknown-label", [], {}, True])}),
        lambda: json.dumps({"text": "\u200b\u200c", "label": "positive"}),
        lambda: '{"text": "\\udc00 x", "label": "negative"}',
        lambda: _deep(rng),
        lambda: '{"text": "cut',
        lambda: json.dumps(["not", "an", "object"]),
    ])()


@pytest.mark.parametrize("seed", range(CASES))
def test_hostile_eval_sets(engines: Path, tmp_path: Path, seed: int) -> None:
    rng = random.Random(2000 + seed)
    fmt = rng.choice(["jsonl", "jsonl", "csv", "tsv"])
    ev = tmp_path / f"eval.{fmt}"
    if fmt == "jsonl":
        rows = [_eval_row(rng, False) for _ in range(rng.randint(0, 5))]
        rows.insert(rng.randint(0, len(rows)), _eval_row(rng, True))
        ev.write_text("\n".join(rows) + "\n", encoding="utf-8", errors="surrogatepass")
    else:
        sep = "," if fmt == "csv" else "\t"
        ev.write_text(rng.choice([f"text{sep}label\n\u200b{sep}positive\n", f'text{sep}label\n"open{sep}x\n',
                                  f"txt{sep}lbl\nfine{sep}positive\n", "", f"text{sep}label\nfine{sep}nope\n"]))
    out = tmp_path / "report"
    e = engines / "e" / "fp32.onnx"
    _check(tmp_path, out, ["compare", e, e, "-e", ev, "--report", out, "--no-sensitivity"], engines)


def _mutate_table(rng: random.Random, doc: dict) -> str:
    kind = rng.randrange(6)
    ranges = doc["table"]["ranges"]
    if kind == 0:
        ranges[rng.randrange(len(ranges))]["amax"] = rng.choice(
            [None, -1.0, 1e300, 1e-320, "0.5", [], {}, True, 1e9])
        return json.dumps(doc)
    if kind == 1:
        doc["table"]["ranges"] = _hostile_value(rng)
        return json.dumps(doc)
    if kind == 2:
        text = json.dumps(doc)
        return text[: rng.randint(0, len(text) - 1)]
    if kind == 3:
        return _deep(rng)
    if kind == 4:
        doc["format"] = rng.choice([None, "calibkit-calibration/0", 7])
        return json.dumps(doc)
    name = ranges[0]["tensor"]
    doc["tensors"][name]["absmax"] = ranges[0]["amax"] / 1e4  # the range is far wider than the recorded data
    return json.dumps(doc)


@pytest.mark.parametrize("seed", range(CASES))
def test_hostile_calibration_tables(engines: Path, tmp_path: Path, seed: int) -> None:
    rng = random.Random(3000 + seed)
    doc = json.loads((engines / "cal" / "calibration.json").read_text())
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "calibration.json").write_text(_mutate_table(rng, doc))
    out = tmp_path / "q.onnx"
    _check(tmp_path, out, ["build", engines / "model", "--precision", "int8", "--calibration", tmp_path / "t",
                           "-o", out], engines)


_HEX: list[Callable[[random.Random], str]] = [
    lambda r: "7f800000", lambda r: "7fc00000", lambda r: "bf000000", lambda r: "1", lambda r: "7f7fffff",
    lambda r: "zz", lambda r: "1" * r.randint(9, 12), lambda r: "6e000000",
]


@pytest.mark.parametrize("seed", range(CASES))
def test_hostile_tensorrt_caches(engines: Path, tmp_path: Path, seed: int) -> None:
    rng = random.Random(4000 + seed)
    lines = (engines / "cal" / "calibration.cache").read_text().splitlines()
    kind = rng.randrange(4)
    if kind == 0:  # one matched tensor gets an unusable scale
        i = rng.randrange(1, len(lines))
        lines[i] = f"{lines[i].rpartition(': ')[0]}: {rng.choice(_HEX)(rng)}"
    elif kind == 1:  # names of another model only
        lines = [lines[0]] + [f"(Unnamed Layer* {i}) [Shuffle]_output: 3c010a14" for i in range(rng.randint(1, 9))]
    elif kind == 2:  # a broken header
        lines[0] = rng.choice(["", "TRT-x-Entropy", "not a cache", "\udc00"])
    else:  # a line without a separator
        lines.insert(rng.randint(1, len(lines)), rng.choice(["garbage", ": 3c010a14", "name:3c010a14"]))
    cache = tmp_path / "c.cache"
    cache.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    out = tmp_path / "fc"
    _check(tmp_path, out, ["calibrate", engines / "model", "--from-cache", cache, "--out", out], engines)


@pytest.mark.parametrize("seed", range(CASES))
def test_hostile_calibration_sets(engines: Path, tmp_path: Path, seed: int) -> None:
    rng = random.Random(5000 + seed)
    cset = tmp_path / "set"
    cset.mkdir()
    good = [json.dumps({"text": "good movie"})] * rng.randint(0, 3)
    kind = rng.randrange(3)
    if kind == 0:  # a broken line among good ones
        good.insert(rng.randint(0, len(good)), rng.choice([_deep(rng), '{"text": "\\udc00"}', "[1]", '{"txt": 1}',
                                                           '{"text": 5}', '{"text": "cut']))
        (cset / "texts.jsonl").write_text("\n".join(good) + "\n")
    elif kind == 1:  # good texts, a broken manifest
        (cset / "texts.jsonl").write_text("\n".join(good or ['{"text": "fine"}']) + "\n")
        (cset / "manifest.json").write_text(rng.choice([_deep(rng), "{", "[]", "null"]))
    else:  # nothing usable
        (cset / "texts.jsonl").write_text(rng.choice(["", "\n\n", "   \n"]))
    out = tmp_path / "cal"
    _check(tmp_path, out, ["calibrate", engines / "model", "-c", cset, "--out", out], engines)


@pytest.mark.parametrize("seed", range(CASES))
def test_hostile_engine_sidecars(engines: Path, tmp_path: Path, seed: int) -> None:
    rng = random.Random(6000 + seed)
    good = json.loads((engines / "e" / "fp32.onnx.calibkit.json").read_text())
    engine = tmp_path / "x.onnx"
    engine.write_bytes((engines / "e" / "fp32.onnx").read_bytes())
    kind = rng.randrange(4)
    if kind == 0:
        text = rng.choice([_deep(rng), "{", "[]", "null", '"a string"'])
    elif kind == 1:
        good[rng.choice(["precision", "backend"])] = _hostile_value(rng)
        text = json.dumps(good)
    elif kind == 2:
        del good[rng.choice(["precision", "backend", "source_model_sha256"])]
        text = json.dumps(good)
    else:
        good[rng.choice(["versions", "extra", "kept_higher_precision"])] = rng.choice([5, True])
        text = json.dumps(good)
    (tmp_path / "x.onnx.calibkit.json").write_text(text)
    ev = tmp_path / "eval.jsonl"
    ev.write_text(json.dumps({"text": "good movie", "label": "positive"}) + "\n")
    out = tmp_path / "report"
    _check(tmp_path, out, ["compare", engine, engines / "e" / "fp32.onnx", "-e", ev, "--report", out], engines)


@pytest.mark.parametrize("damage", ["empty", "half", "text", "zeros", "another-proto"])
@pytest.mark.parametrize("command", ["calibrate", "build-fp16", "build-fp32", "tune", "smooth"])
def test_damaged_model_files(engines: Path, tmp_path: Path, damage: str, command: str) -> None:
    """A model.onnx that is empty, cut in half, text, zeros or another protobuf: one error, no traceback, no output."""
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(engines / "model", folder)
    onnx_file = folder / "model.onnx"
    data = onnx_file.read_bytes()
    onnx_file.write_bytes({"empty": b"", "half": data[: len(data) // 2], "text": b"version https://git-lfs\n",
                           "zeros": bytes(64), "another-proto": b"\x08\x01"}[damage])
    out = tmp_path / "out"
    ev = tmp_path / "eval.jsonl"
    ev.write_text("".join(json.dumps({"text": t, "label": "positive"}) + "\n" for t in texts(20, seed=1)))
    args: list[object] = {
        "calibrate": ["calibrate", folder, "-c", engines / "set", "--out", out],
        "build-fp16": ["build", folder, "-p", "fp16", "-o", out / "e.onnx"],
        "build-fp32": ["build", folder, "-p", "fp32", "-o", out / "e.onnx"],
        "tune": ["tune", folder, "-c", engines / "set", "-e", ev, "--out", out],
        "smooth": ["smooth", folder, "-c", engines / "set", "--out", out],
    }[command]
    text = " ".join(_check(tmp_path, out, args, inputs=engines).split())
    assert "ONNX model" in text, text  # says what is wrong: the model file, not a later symptom of it
    assert not out.exists() or not any(out.rglob("*.onnx"))
