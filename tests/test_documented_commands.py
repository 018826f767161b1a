"""Every command line the documentation shows runs: each one of README.md, docs/*.md, docs/concepts/*.md and of
every command's ``--help`` examples is run here on tiny models, in a folder holding every path the documents
name (:data:`WORKSPACE` says what stands behind each), or is listed in :data:`NOT_RUNNABLE` with the reason.

A command added to a document or a ``--help`` is run by the second test: it fails unless the command works on
the tiny models or is listed with its reason."""

from __future__ import annotations

import gzip
import json
import re
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest
import typer
from calib_helpers import texts, tiny_model, write_model_dir
from cli_helpers import command_leaves
from click.testing import Result
from typer.testing import CliRunner

from calibkit.cli import app

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "concepts").glob("*.md")))
PROGRAMS = ("calibkit", "make", "python", "dask", "xdg-open")
FENCE = re.compile(r"^\s*```(\w*)\s*$")

_TRT = "needs TensorRT (not installable here); the same command with the ONNX Runtime backend runs above"
_DASK = "needs a Dask scheduler at that address (tests/test_distributed.py runs a local Dask cluster)"
_BENCH = "a benchmark: minutes to hours on BERT-size models (docs/measured.md holds its results)"
_DEMO = "the demo: a download and a fine-tuning, then minutes to 24 min (tests/test_demo_*.py run its parts)"
_HF = "needs a Hugging Face checkpoint and torch (tests/test_export.py exports tiny ones)"
_MAKE = "the repository's own tooling (a fresh virtualenv, the whole suite, ruff, mypy): run by CI, not here"

#: command -> why it is not run here (exact text, as extracted; a new command that is not run must be added)
NOT_RUNNABLE: dict[str, str] = {
    "make demo": _DEMO,
    "make test": _MAKE,
    "make test-fast": _MAKE,
    "make lint": _MAKE,
    "make typecheck": _MAKE,
    "python -m venv .venv": _MAKE,
    ". .venv/bin/activate": _MAKE,
    "calibkit demo prepare": _DEMO,
    "calibkit demo prepare --out demo_assets": _DEMO,
    "calibkit demo prepare --fast --out /tmp/demo --log-lines 5000": _DEMO,
    "calibkit demo prepare --seed 1 --out demo_seed1": _DEMO,
    "calibkit demo run": _DEMO,
    "calibkit demo run --fast": _DEMO,
    "dask scheduler": _DASK,
    "dask worker tcp://10.0.0.5:8786 --nworkers 16 --nthreads 1": _DASK,
    "calibkit tune model/ -c calib/ -e test.jsonl --executor dask://10.0.0.5:8786": _DASK,
    "calibkit calibrate model/ -c calib/ --executor dask://10.0.0.5:8786 --out runs/mse": _DASK,
    "calibkit calibrate demo_assets/model -c calib/ --executor dask://10.0.0.5:8786": _DASK,
    "calibkit tune model/ -c calib/ -e test.parquet --executor dask://10.0.0.5:8786": _DASK,
    "calibkit export hf/my-classifier --out models/my-classifier": _HF,
    "calibkit export hf/all-MiniLM-L6-v2 --out models/minilm": _HF,
    "calibkit export hf/bert-mlm --task embedding --out models/bert": _HF,
    "calibkit calibrate models/my-classifier -c ...": "a placeholder for the calibration set (`...`)",
    "xdg-open /tmp/tune/report.html": "opens a browser",
    "calibkit build demo_assets/model --precision int8 --qdq runs/mse/model.int8.onnx --backend tensorrt -o "
    "int8.engine": _TRT,
    "calibkit build demo_assets/model --precision int8 --calibration runs/entropy/calibration.json --backend "
    "tensorrt --max-seq 128 -o engines/model.int8.engine": _TRT,
    "calibkit deploy runs/tune-model --backend tensorrt --out serving-trt/ --traffic logs/prod.jsonl.gz "
    "--profiles 3": _TRT,
    "calibkit calibrate demo_assets/model --calibration-set calib/ --exclude 'layer\\.5/output' --target "
    "onnxruntime": "names a layer of a 12-layer BERT, which the tiny model does not have",
    "calibkit calibrate model/ -c calib/ --exclude 'bert.encoder.layer.5.output.dense'":
        "names a layer of a 12-layer BERT, which the tiny model does not have",
    "calibkit build demo_assets/model --precision int8 --calibration runs/entropy/calibration.json --target "
    "tensorrt --exclude '/classifier/' -o engines/int8-trt-layout.onnx":
        "names a layer of a BERT classifier, which the tiny model does not have",
}
NOT_RUNNABLE.update({f"python benchmarks/{name}": _BENCH for name in (
    "bench_sample.py", "bench_calibrate.py", "bench_ort_int8.py", "bench_tune.py", "bench_scale.py",
    "bench_distributed.py", "bench_zoo.py", "bench_gptq.py")})
NOT_RUNNABLE.update({f"python benchmarks/{line}": _BENCH for line in (
    "bench_tune_scale.py --log logs.jsonl --tokenizer tok --shape base --traffic-size 2000 --rules sequential "
    "--workers 4 --sensitivity-layers 4 --max-evaluations 6",
    "bench_suffix.py --model bert-base --table cal-minmax-base/calibration.json --texts-from logs.jsonl --texts 256 "
    "--nodes 4 --threads 1",
    "bench_tune_speed.py --model bert-base --log logs.jsonl --work WORK --strategy new --traffic-size 2000 "
    "--budget 555",
    "bench_tune_speed.py --model bert-base --log logs.jsonl --work WORK2 --strategy old --code OLD --traffic-size "
    "2000 --budget 530")})
#: the CI gates: on the tiny models a target may be missed, which these commands report by exit code 8
GATES = ("--min-agreement", "--max-drop", "--fail-if-missed")

#: text of a document -> what the tiny workspace runs instead (a placeholder or a path outside the workspace)
SUBSTITUTE = {
    "reports/<run>/report.json": "reports/minilm-int8/report.json",
    "<512-text calibration set>": "calibration_sets/logs-n512-s0",
    "/tmp/tune": "tmp-tune",
    "report compare.json": "report cmp.json",
    "report tune.json": "report runs/tune-model/tune.json",
}
#: benchmark-sized options, shrunk for the tiny logs
SHRINK = {"--traffic-size 3600": "--traffic-size 300", "--measure-texts 2000": "--measure-texts 100",
          "--limit 500": "--limit 60", "--workers 4": "--workers 2"}


# ---------------------------------------------------------------------------------------------- extraction


def _strip_comment(line: str) -> str:
    """``line`` without a shell comment (a ``#`` outside quotes, after a space or at the start)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _joined(lines: list[str]) -> Iterator[str]:
    """Logical command lines: a trailing backslash continues a line, ``&&`` and ``;`` separate commands."""
    current = ""
    for raw in lines:
        current = f"{current} {raw.strip()}".strip()
        if current.endswith("\\"):
            current = current[:-1].rstrip()
            continue
        for part in re.split(r"\s+(?:&&|;)\s+", current):
            if part:
                yield part.removeprefix("$ ")
        current = ""


def markdown_commands(page: Path) -> Iterator[str]:
    """The command lines of ``page``'s shell code blocks (bash, sh, console or unnamed)."""
    block: list[str] = []
    lang = None
    for line in page.read_text(encoding="utf-8").splitlines():
        fence = FENCE.match(line)
        if fence and lang is None:
            lang, block = fence.group(1), []
        elif fence:
            if lang in ("", "bash", "sh", "shell", "console"):
                yield from (c for c in _joined([_strip_comment(x) for x in block]) if c.split()[0] in PROGRAMS
                            or c.startswith(". "))
            lang = None
        elif lang is not None:
            block.append(line)


def help_commands() -> Iterator[tuple[str, str]]:
    """(``calibkit X --help``, command) for every example of every command's help text; a remark after three
    spaces and a parenthesis, or after ``#``, is not part of the command."""
    for path, cmd in command_leaves(typer.main.get_command(app)):
        text = "\n".join(t for t in (cmd.help, cmd.epilog) if t)
        if "Examples:" not in text:
            continue
        lines = [re.split(r"\s{3,}\(", _strip_comment(x))[0] for x in text.split("Examples:", 1)[1].splitlines()]
        for command in _joined([x for x in lines if x.strip()]):
            if command.split()[0] in PROGRAMS:
                yield f"calibkit {' '.join(path)} --help", command


def documented_commands() -> dict[str, list[str]]:
    """Every documented command -> where it is shown (pages relative to the repository, or ``--help``)."""
    found: dict[str, list[str]] = {}
    for page in PAGES:
        for command in markdown_commands(page):
            found.setdefault(command, []).append(str(page.relative_to(ROOT)))
    for where, command in help_commands():
        found.setdefault(command, []).append(where)
    return found


def test_the_extraction_sees_every_kind_of_example() -> None:
    found = documented_commands()
    readme = [c for c, where in found.items() if "README.md" in where]
    assert "calibkit compare engines/fp32.onnx engines/int8.onnx -e demo_assets/data/test.jsonl" in readme
    assert ("calibkit tune demo_assets/model -c calibration_sets/logs-n512-s0 -e demo_assets/data/test.jsonl "
            "--max-drop 0.5 --min-agreement 99 --traffic auto --target onnxruntime") in readme  # a continued line
    assert found["calibkit compare embedder/fp32.onnx embedder/int8.onnx --traffic auto"] == [
        "calibkit compare --help"]  # its remark after the command left out
    assert "calibkit demo run --fast" in found  # its `# ...` remark left out
    assert "xdg-open /tmp/tune/report.html" in found and "calibkit report tune.json -o /tmp/tune" in found  # &&
    assert {"calibkit smooth --help", "calibkit deploy --help"} <= {w for ws in found.values() for w in ws}
    assert not [c for c in NOT_RUNNABLE if c not in found], "listed as not runnable, shown nowhere"


# ---------------------------------------------------------------------------------------------- workspace


def _embedder_model() -> onnx.ModelProto:
    """The tiny classifier cut before its pooling: one vector per token (``last_hidden_state``), no labels."""
    model = tiny_model()
    graph = model.graph
    keep = [n for n in graph.node if n.name not in ("pool", "classifier")]
    del graph.node[:]
    graph.node.extend(keep)
    for node in graph.node:
        node.output[:] = ["last_hidden_state" if o == "O" else o for o in node.output]
    del graph.output[:]
    graph.output.append(onnx.helper.make_tensor_value_info("last_hidden_state", onnx.TensorProto.FLOAT,
                                                           ["batch", "seq", 8]))
    return model


def _jsonl(path: Path, rows: list[dict], gz: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)


def _label(text: str) -> str:
    return "positive" if ("good" in text or "great" in text) else "negative"


def _invoke(*args: object) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def _must(*args: object) -> None:
    r = _invoke(*args)
    assert r.exit_code == 0, (args, r.output)


#: path a document names -> what stands there in the tiny workspace (the fixture builds each)
WORKSPACE = {
    "demo_assets/model, model/, models/my-classifier, models/minilm, bert-large/": "the tiny classifier folder",
    "model.onnx, hf/minilm, hf/bert, hf/my-classifier": "its ONNX file alone; tokenizer folders (its folder)",
    "demo_assets/embedder, embedder/": "the tiny classifier cut before pooling: a token-vector embedder",
    "demo_assets/logs.jsonl, logs.jsonl, requests.jsonl": "a 1,500-line request log ({text})",
    "prod.jsonl, logs/prod.jsonl.gz, requests.jsonl.gz": "the same log nested ({request: {text}}, labels as "
                                                        "feedback.label and intent)",
    "demo_assets/data/test.jsonl, test.jsonl, data/test.jsonl, test.parquet, test.csv": "240 labelled texts",
    "calib/": "`calibkit sample logs.jsonl --size 200 --out calib/` (its manifest names the log)",
    "runs/entropy, calibration.cache, trt/calibration.cache": "`calibkit calibrate model/ -c calib/ --method "
                                                              "entropy` and its TensorRT cache",
    "fp32.onnx, fp16.onnx, int8.onnx, a.onnx, b.onnx": "engines of the tiny classifier built from runs/entropy",
    "embedder/fp32.onnx, embedder/int8.onnx": "the embedder's engines, built as the docs say",
}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("documented")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("CALIBKIT_CACHE", str(root / ".cache"))
        for name in ("demo_assets/model", "model", "models/my-classifier", "models/minilm", "bert-large",
                     "hf/minilm", "hf/bert", "hf/my-classifier"):
            write_model_dir(root / name)
        shutil.copy(root / "model" / "model.onnx", root / "model.onnx")
        for name in ("demo_assets/embedder", "embedder"):
            write_model_dir(root / name)
            onnx.save(_embedder_model(), str(root / name / "model.onnx"))
            (root / name / "config.json").write_text(json.dumps({"max_position_embeddings": 16}))
        log = texts(1500, seed=1, max_words=12)
        for name in ("demo_assets/logs.jsonl", "logs.jsonl", "requests.jsonl"):
            _jsonl(root / name, [{"text": t} for t in log])
        nested = [{"request": {"text": t}, "feedback": {"label": _label(t)}, "intent": _label(t)} for t in log]
        _jsonl(root / "prod.jsonl", nested)
        _jsonl(root / "logs" / "prod.jsonl.gz", nested, gz=True)
        _jsonl(root / "requests.jsonl.gz", nested, gz=True)
        labelled = [{"text": t, "label": _label(t)} for t in texts(240, seed=2, max_words=12)]
        for name in ("demo_assets/data/test.jsonl", "test.jsonl", "data/test.jsonl"):
            _jsonl(root / name, labelled)
        import pandas as pd

        pd.DataFrame(labelled).to_parquet(root / "test.parquet")
        pd.DataFrame(labelled).to_csv(root / "test.csv", index=False)
        _must("sample", "logs.jsonl", "--size", 200, "--tokenizer", "model", "--out", "calib")
        _must("calibrate", "model", "-c", "calib", "--method", "entropy", "--out", "runs/entropy")
        cache = next((root / "runs" / "entropy").glob("*.cache"))
        (root / "trt").mkdir()
        shutil.copy(cache, root / "calibration.cache")
        shutil.copy(cache, root / "trt" / "calibration.cache")
        for name, precision in (("fp32", "fp32"), ("fp16", "fp16"), ("a", "fp32")):
            _must("build", "model", "--precision", precision, "-o", f"{name}.onnx")
        for name in ("int8", "b"):
            _must("build", "model", "--precision", "int8", "--calibration", "runs/entropy", "-o", f"{name}.onnx")
        _must("calibrate", "embedder", "-c", "calib", "--method", "minmax", "--out", "runs/embedder")
        _must("build", "embedder", "--precision", "fp32", "-o", "embedder/fp32.onnx")
        _must("build", "embedder", "--precision", "int8", "--qdq", "runs/embedder/model.int8.onnx", "-o",
              "embedder/int8.onnx")
        yield root


# ---------------------------------------------------------------------------------------------- running

#: the order commands run in, so that each finds what an earlier one wrote (sample's sets, calibrate's runs,
#: build's engines, compare's report, tune's folder)
STAGES = ("sample", "export", "smooth", "calibrate", "build", "compare", "tune", "report", "deploy")


def _stage(command: str) -> int:
    words = command.split()
    return STAGES.index(words[1]) if words[0] == "calibkit" and words[1] in STAGES else len(STAGES)


def _runnable(command: str) -> list[str]:
    for old, new in {**SUBSTITUTE, **SHRINK}.items():
        command = command.replace(old, new)
    args = shlex.split(command)[1:]
    if args[0] == "compare" and "engines/fp32.onnx" in args and "--report" not in args:
        args += ["--report", "reports/minilm-int8", "--force"]
    return args


@pytest.mark.slow  # about 60 commands: 53-62 s alone on 2 cores, up to 2 min on a busy machine
def test_every_documented_command_runs_or_says_why_not(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workspace)
    monkeypatch.setenv("CALIBKIT_CACHE", str(workspace / ".cache"))
    (workspace / "compare.json").unlink(missing_ok=True)
    commands = sorted((c for c in documented_commands() if c not in NOT_RUNNABLE), key=_stage)
    failed, said = [], {}
    for command in commands:
        if command.split()[0] != "calibkit":
            failed.append((command, "not a calibkit command: list it in NOT_RUNNABLE with the reason"))
            continue
        r = _invoke(*_runnable(command))
        said[command] = " ".join(r.output.split())
        gated = r.exit_code == 8 and any(g in command.split() for g in GATES) and "(8)" in r.output
        if r.exit_code != 0 and not gated:
            failed.append((command, " ".join(r.output.split())[-600:]))
    assert failed == [], "\n".join(f"{c}\n    -> {why}" for c, why in failed)
    # the embedder's agreement says its interval (or why it has none) and the index it was judged in
    embedder = said["calibkit compare embedder/fp32.onnx embedder/int8.onnx --traffic auto"]
    assert re.search(r"nearest-neighbour agreement [\d.]+ % (\[[\d.]+, [\d.]+\]|\(no interval: neighbours are looked"
                     r" up among the same texts, not drawn apart\)) \(top-1 in an FP32 index of the \d+ traffic "
                     r"texts: it depends on the index size\)", embedder), embedder
    # tune.json names its traffic log relative to its own folder, as every document's paths are read
    traffic = json.loads((workspace / "runs" / "tune-model" / "tune.json").read_text())["eval_set"]["traffic"]
    assert not Path(traffic["path"]).is_absolute()
    assert (workspace / "runs" / "tune-model" / traffic["path"]).resolve().is_file(), traffic["path"]
    classifier = said["calibkit compare engines/fp32.onnx engines/int8.onnx -e demo_assets/data/test.jsonl"]
    assert re.search(r"agreement [\d.]+ % \[[\d.]+, [\d.]+\] on 240 texts, flips \(texts whose prediction "
                     r"changed\)", classifier), classifier
