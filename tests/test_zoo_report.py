"""compare's Markdown and HTML reports show the task's fidelity block (and, for a token classifier with gold
word tags, each engine against them) for zoo models: an embedding encoder and a token classifier, through the
CLI (calibrate -> build -> compare --report)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner
from zoo import write_texts, zoo_texts

from calibkit.cli import app

pytestmark = pytest.mark.slow

NAMES = {"anna", "bob", "carla", "david", "paris", "london", "berlin"}  # gold entities of the NER eval set


def cli(*args: object) -> None:
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, f"calibkit {' '.join(map(str, args))}\n{r.output}\n{r.exception!r}"


@pytest.fixture(scope="module")
def models(zoo: dict) -> dict:
    """The session's zoo (tests/conftest.py), built once for every zoo test."""
    return zoo


def _ner_rows(texts: list[str]) -> list[dict]:
    """CoNLL-style rows: a run of name words is one entity (B-ENT, then I-ENT), everything else O."""
    rows = []
    for t in texts:
        words = t.split()
        tags, prev = [], False
        for w in words:
            name = w.strip(".") in NAMES
            tags.append(("I-ENT" if prev else "B-ENT") if name else "O")
            prev = name
        rows.append({"tokens": words, "ner_tags": tags})
    return rows


def _build(z, tmp_path: Path) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
    write_texts(tmp_path / "logs.jsonl", zoo_texts(120, seed=5))
    cli("sample", tmp_path / "logs.jsonl", "--size", 60, "--tokenizer", z.folder, "--out", tmp_path / "calib")
    cli("calibrate", z.folder, "-c", tmp_path / "calib", "--out", tmp_path / "cal")
    cli("build", z.folder, "--precision", "fp32", "-o", tmp_path / "fp32.onnx")
    cli("build", z.folder, "--precision", "int8", "--calibration", tmp_path / "cal", "-o", tmp_path / "int8.onnx")
    return tmp_path / "fp32.onnx", tmp_path / "int8.onnx"


def _report(fp32: Path, int8: Path, eval_path: Path, out: Path) -> tuple[dict, str, str]:
    cli("compare", fp32, int8, "-e", eval_path, "--report", out, "--layer-samples", 64)
    doc = json.loads((out / "report.json").read_text())
    return doc, (out / "report.md").read_text().replace("\\", ""), (out / "report.html").read_text()


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))


def test_embedding_report_shows_cosine_and_retrieval(models: dict, tmp_path: Path) -> None:
    fp32, int8 = _build(models["bert-encoder-legacy"], tmp_path)
    write_texts(tmp_path / "eval.jsonl", zoo_texts(80, seed=9))
    doc, md, html = _report(fp32, int8, tmp_path / "eval.jsonl", tmp_path / "report")
    fid = doc["task"]["fidelity"]
    assert doc["task"]["kind"] == "embedding" and fid["k"] == 10
    for out in (md, html):
        assert "Task fidelity: embedding" in out
        assert f"{fid['cosine_min']:.5f}" in out and f"{fid['cosine_mean']:.5f}" in out
        assert f"{100 * fid['retrieval_top1_agreement']:.2f} %" in out
        assert "top-10 neighbour overlap" in out and f"{fid['retrieval_overlap_at_k']:.4f}" in out


def test_token_report_shows_agreement_entity_f1_and_the_gold_scores(models: dict, tmp_path: Path) -> None:
    fp32, int8 = _build(models["bert-token-legacy"], tmp_path)
    rows = _ner_rows(zoo_texts(80, seed=9))
    assert sum(t != "O" for r in rows for t in r["ner_tags"]) > 20
    (tmp_path / "ner.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    doc, md, html = _report(fp32, int8, tmp_path / "ner.jsonl", tmp_path / "report")
    task = doc["task"]
    fid, gold = task["fidelity"], task["gold"]
    assert task["kind"] == "token-classification" and task["labelled"] is True
    assert set(gold["engines"]) == {"A", "B"}
    # words past the 64-token limit are not scored; every word before it is
    assert gold["words"] + gold["unscored_words"] == sum(len(r["tokens"]) for r in rows)
    assert 0 < gold["unscored_words"] < gold["words"]
    for out in (md, html):
        assert "Task fidelity: token classification" in out
        assert f"{100 * fid['agreement']:.2f} %" in out and f"{fid['entity_f1']:.4f}" in out
        assert "Against the gold labels" in out and f"{gold['words']} words scored" in out
        for e in gold["engines"].values():
            assert f"{100 * e['token_accuracy']:.2f} %" in out and f"{e['entity_f1']:.4f}" in out
