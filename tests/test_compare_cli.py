"""`calibkit compare` through typer's CliRunner: the JSON it writes, and one clear message for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from calibkit.cli import app
from calibkit.data.tokenizer import TextTokenizer
from calibkit.enginefiles.artifact import sidecar_path


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from test_compare_tiny import build_engines  # the sibling module's tiny engines

    return build_engines(tmp_path_factory.mktemp("cli"))


def _classes(engines: dict[str, Path], indices: list[int], path: Path, *, batch_size: int) -> dict[int, int]:
    """The class the engine at ``path`` gives each eval row of ``indices`` (run in that order), predicted through
    calibkit's engine runner (the session options compare uses) in batches of ``batch_size``."""
    from calibkit.enginefiles.registry import open_runner
    from calibkit.evaluate.predict import predict_logits

    every = [json.loads(x) for x in engines["eval"].read_text().splitlines()]
    with open_runner(path) as runner:
        preds = predict_logits(runner, TextTokenizer(engines["tok"]), [every[i]["text"] for i in indices],
                               batch_size=batch_size).argmax(1)
    return {i: int(p) for i, p in zip(indices, preds)}


def _accuracy(engines: dict[str, Path], indices: list[int], path: Path, *, batch_size: int) -> float:
    """The accuracy of those classes against the rows' labels."""
    every = [json.loads(x) for x in engines["eval"].read_text().splitlines()]
    got = _classes(engines, indices, path, batch_size=batch_size)
    return float(np.mean([got[i] == (1 if every[i]["label"] == "positive" else 0) for i in indices]))

def _run(*args: str) -> object:
    return CliRunner().invoke(app, list(args))


def test_compare_writes_json_and_report(engines: dict[str, Path], tmp_path: Path) -> None:
    out, rep = tmp_path / "cmp.json", tmp_path / "rep"
    r = _run("compare", str(engines["fp"]), str(engines["int8"]), "--eval-set", str(engines["eval"]),
             "--json", str(out), "--report", str(rep), "--no-sensitivity", "--batch-size", "8", "--limit", "60")
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["format"] == "calibkit-compare/1" and doc["eval_set"]["count"] == 60
    # the accuracy the CLI reports, recomputed on the rows it records, in its order and batches, through the
    # runners compare uses (the same ONNX Runtime session options): exact, whatever the CPU's INT8 kernels
    b = next(e for e in doc["engines"] if e["name"] == "B")
    assert b["accuracy"] == _accuracy(engines, doc["eval_set"]["rows"]["indices"], engines["int8"], batch_size=8)
    assert b["precision"] == "int8" and len(doc["layers"]) == 3
    assert (rep / "report.json").is_file()


def test_batch_size_one_accuracy_is_exact(engines: dict[str, Path], tmp_path: Path) -> None:
    """With batch size 1 nothing is padded: the accuracy must equal ORT + argmax exactly."""
    out = tmp_path / "cmp.json"
    r = _run("compare", str(engines["fp"]), str(engines["int8"]), "--eval-set", str(engines["eval"]), "--json",
             str(out), "--no-report", "--no-layers", "--batch-size", "1", "--limit", "30")
    assert r.exit_code == 0, r.output
    assert "B - A accuracy" in r.output and "[/" not in r.output, "no raw rich markup in the summary"
    doc = json.loads(out.read_text())
    every = [json.loads(x) for x in engines["eval"].read_text().splitlines()]
    used = doc["eval_set"]["rows"]  # --limit draws a stratified random subset and records it
    assert used["count"] == 30 and used["of"] == len(every) and sorted(used["indices"]) != list(range(30))
    for name, path in (("A", engines["fp"]), ("B", engines["int8"])):
        acc = _accuracy(engines, used["indices"], path, batch_size=1)
        assert next(e for e in doc["engines"] if e["name"] == name)["accuracy"] == acc
    assert doc["layers"] == []


def test_engines_of_different_models_refused(engines: dict[str, Path], tmp_path: Path) -> None:
    sc = json.loads(sidecar_path(engines["int8"]).read_text())
    other = tmp_path / "other.onnx"
    other.write_bytes(engines["int8"].read_bytes())
    sc["source_model_sha256"] = "0" * 64
    sidecar_path(other).write_text(json.dumps(sc))
    out = tmp_path / "cmp.json"
    r = _run("compare", str(engines["fp"]), str(other), "--eval-set", str(engines["eval"]), "--json", str(out))
    assert r.exit_code == 2
    assert "different models" in r.output and "Traceback" not in r.output
    assert not out.exists()


def test_unlabeled_eval_set_reports_fidelity_not_accuracy(engines: dict[str, Path], tmp_path: Path) -> None:
    ev = tmp_path / "texts.jsonl"
    ev.write_text("".join(json.dumps({"text": t}) + "\n" for t in ("good movie", "awful plot", "great fine")))
    out = tmp_path / "cmp.json"
    r = _run("compare", str(engines["fp"]), str(engines["int8"]), "--eval-set", str(ev), "--json", str(out),
             "--no-report")
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert all(e["accuracy"] is None and e["confusion_matrix"] is None for e in doc["engines"])
    assert doc["task"]["kind"] == "classification" and doc["task"]["labelled"] is False
    assert doc["task"]["fidelity"]["agreement"] == doc["agreement"]
    assert "no labels" in " ".join(r.output.split())
    assert sum(b["texts"] for b in doc["flips_by_confidence"]) == 3  # without labels too


@pytest.mark.parametrize(
    "content, code, message",
    [
        ('{"text": "good movie", "label": "neutral"}\n', 3, "labels the model does not know"),
        ("not json\n", 3, "not valid JSON"),
    ],
)
def test_bad_eval_sets(engines: dict[str, Path], tmp_path: Path, content: str, code: int, message: str) -> None:
    ev = tmp_path / "bad.jsonl"
    ev.write_text(content)
    out = tmp_path / "cmp.json"
    r = _run("compare", str(engines["fp"]), str(engines["int8"]), "--eval-set", str(ev), "--json", str(out))
    assert r.exit_code == code, r.output
    assert message in " ".join(r.output.split()) and "Traceback" not in r.output
    assert not out.exists()


def test_an_unknown_label_outside_the_limit_subset_is_still_refused(engines: dict[str, Path], tmp_path: Path) -> None:
    rows = [json.loads(x) for x in engines["eval"].read_text().splitlines()]
    rows.append({"text": "good movie", "label": "neutral"})
    ev = tmp_path / "eval.jsonl"
    ev.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for seed in range(3):
        r = _run("compare", str(engines["fp"]), str(engines["int8"]), "--eval-set", str(ev), "--limit", "5",
                 "--seed", str(seed), "--no-report", "--no-layers")
        assert r.exit_code == 3 and "labels the model does not know" in " ".join(r.output.split()), r.output


def test_missing_sidecar(engines: dict[str, Path], tmp_path: Path) -> None:
    bare = tmp_path / "bare.onnx"
    bare.write_bytes(engines["fp"].read_bytes())
    r = _run("compare", str(bare), str(engines["int8"]), "--eval-set", str(engines["eval"]), "--no-report")
    assert r.exit_code == 4 and "sidecar" in r.output


def test_memory_budget_reaches_the_layer_taps_and_changes_no_measurement(engines: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    """--max-batch-tokens cuts the tapped batches (more runner calls) but the per-layer ranges stay the same."""
    docs = []
    for extra in ([], ["--max-batch-tokens", "16", "--memory-budget", "64K"]):
        out = tmp_path / f"cmp{len(extra)}.json"
        r = _run("compare", str(engines["fp"]), str(engines["int8"]), "--eval-set", str(engines["eval"]), "--json",
                 str(out), "--no-report", "--no-sensitivity", "--batch-size", "8", "--limit", "40", *extra)
        assert r.exit_code == 0, r.output
        docs.append(json.loads(out.read_text()))
    ranges = [{x["node"]: (x.get("fp_absmax"), x.get("clipped_fraction")) for x in d["layers"]} for d in docs]
    # per-token layers: padding is masked out, so the batching cannot show
    assert all(ranges[0][n] == ranges[1][n] for n in ("fc1", "fc2"))
    # the tiny model's mean pooling reads padded positions, so its classifier input shows that the budget did
    # reach the taps and cut the batches differently
    assert ranges[0]["classifier"] != ranges[1]["classifier"]


def test_a_bad_memory_budget_is_one_message(engines: dict[str, Path], tmp_path: Path) -> None:
    r = _run("compare", str(engines["fp"]), str(engines["int8"]), "--eval-set", str(engines["eval"]),
             "--no-report", "--memory-budget", "lots")
    assert r.exit_code == 2 and "cannot read the size" in r.output and "Traceback" not in r.output


def test_ci_gate_exits_8_after_writing_when_a_target_is_missed(engines: dict[str, Path], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    import calibkit as ck
    import calibkit.api

    common = ["compare", str(engines["fp"]), str(engines["int8"]), "--eval-set", str(engines["eval"]), "--no-report",
              "--no-layers", "--batch-size", "8", "--limit", "40"]
    out = tmp_path / "cmp.json"
    r = _run(*common, "--json", str(out), "--min-agreement", "0", "--max-drop", "100")
    assert r.exit_code == 0, r.output
    c = ck.load_report(out)
    assert ck.api.missed_targets(c, min_agreement=100 * c.agreement, max_drop=0.0) == () or \
        c.engines[0].accuracy > c.engines[1].accuracy
    worse = dataclasses.replace(c, agreement=0.95, engines=(c.engines[0], dataclasses.replace(
        c.engines[1], accuracy=c.engines[0].accuracy - 0.02)))
    missed = ck.api.missed_targets(worse, min_agreement=99, max_drop=1.0)
    assert missed == ("agreement 95.00 % is below --min-agreement 99 %",
                      "accuracy drop 2.00 points is above --max-drop 1")
    assert ck.api.missed_targets(worse, min_agreement=95, max_drop=2.5) == ()
    # the CLI: every output written, then exit code 8 with the misses as the message
    # the pipeline reads the request's targets: the result's gate, the line that says it, and the exit code
    r = _run(*common, "--json", str(tmp_path / "met.json"), "--min-agreement", "0")
    assert r.exit_code == 0 and "CI gate (--min-agreement 0 %): met" in r.output, r.output
    from calibkit.results.runs import Gate

    assert ck.load_report(tmp_path / "met.json").gate == Gate(0.0, None, ())
    import calibkit.evaluate.decisions

    monkeypatch.setattr(calibkit.evaluate.decisions, "missed_targets", lambda result, **kw: missed)
    r = _run(*common, "--json", str(tmp_path / "gate.json"), "--min-agreement", "99")
    assert r.exit_code == 8, r.output
    assert "below --min-agreement 99" in r.output and (tmp_path / "gate.json").is_file()
    assert ck.load_report(tmp_path / "gate.json").gate.missed == missed
    r = _run(*common, "--min-agreement", "101")
    assert r.exit_code == 2 and "percentage" in r.output


def test_save_outputs_keeps_each_texts_outputs_of_both_engines(engines: dict[str, Path], tmp_path: Path) -> None:
    saved, out = tmp_path / "outputs", tmp_path / "cmp.json"
    r = _run("compare", str(engines["fp"]), str(engines["int8"]), "--eval-set", str(engines["eval"]), "--no-report",
             "--no-layers", "--batch-size", "8", "--limit", "30", "--seed", "3", "--json", str(out),
             "--save-outputs", str(saved))
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in (saved / "outputs.jsonl").read_text().splitlines()]
    with np.load(saved / "outputs.npz") as arrays:
        assert len(lines) == 30 and arrays["A"].shape[0] == arrays["B"].shape[0] == 30
    doc = json.loads(out.read_text())
    assert sum(x["flipped"] for x in lines) == round(doc["flip_rate"] * 30)
    # a saved class is reproduced from the saved rows: the engine run on those texts, in compare's order and
    # batches, through compare's runner, gives the saved class of every text
    rows = [json.loads(x) for x in engines["eval"].read_text().splitlines()]
    got = _classes(engines, doc["eval_set"]["rows"]["indices"], engines["int8"], batch_size=8)
    for x in lines:
        assert rows[x["row"]]["text"] == x["text"]
        assert x["B_class"] == got[x["row"]]
