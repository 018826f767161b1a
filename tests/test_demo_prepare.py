"""prepare_demo's step bookkeeping (reuse, redo, no test leak into the log) with the heavy steps faked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibkit.demo import archive, prepare
from calibkit.demo.prepare import PrepareOptions, is_complete, prepare_demo


def _corpora() -> dict[str, archive.Corpus]:
    def corpus(name: str, n: int) -> archive.Corpus:
        texts = tuple(
            archive.LabelledText(f"{name}{i}", f"{name} snippet number {i}", 1.0 if i % 2 else -1.0,
                                 "positive" if i % 2 else "negative", name)
            for i in range(n)
        )
        return archive.Corpus(name, texts, dropped_zero=1)

    return {"movie": corpus("movie", 50), "tweet": corpus("tweet", 10), "amazon": corpus("amazon", 10),
            "nyt": corpus("nyt", 10)}


@pytest.fixture()
def faked(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    calls = {"model": 0, "embedder": 0}
    monkeypatch.setattr(archive, "fetch_archive", lambda cache=None, progress=None: Path("unused.tar.gz"))
    monkeypatch.setattr(archive, "read_corpora", lambda path: _corpora())

    def fake_model(out: Path, split: archive.Split, corpora: object, options: PrepareOptions, cb: object) -> list[str]:
        calls["model"] += 1
        (out / "model").mkdir(parents=True, exist_ok=True)
        (out / "model" / "model.onnx").write_bytes(b"onnx" * calls["model"])
        (out / "model" / "metrics.json").write_text(json.dumps({"accuracy": 0.5}))
        return ["model/metrics.json", "model/model.onnx"]

    def fake_embedder(out: Path, probe_texts: object, cb: object) -> list[str]:
        calls["embedder"] += 1
        (out / "embedder").mkdir(parents=True, exist_ok=True)
        (out / "embedder" / "model.onnx").write_bytes(b"embedder" * calls["embedder"])
        return ["embedder/model.onnx"]

    monkeypatch.setattr(prepare, "_build_model_dir", fake_model)
    monkeypatch.setattr(prepare, "_build_embedder_dir", fake_embedder)
    return calls


def test_rerun_reuses_complete_steps(tmp_path: Path, faked: dict[str, int]) -> None:
    opts = PrepareOptions(fast=True, log_lines=40, seed=0)
    assert not is_complete(tmp_path, opts)
    first = prepare_demo(tmp_path, opts)
    assert first.made == ("data", "model", "logs", "embedder") and first.complete
    assert is_complete(tmp_path, opts)
    assert not is_complete(tmp_path, PrepareOptions(fast=False, log_lines=40, seed=0))

    second = prepare_demo(tmp_path, opts)
    assert second.made == () and second.reused == ("data", "model", "logs", "embedder")
    assert faked["model"] == 1 and faked["embedder"] == 1

    # a changed log size redoes only the log; a damaged model file redoes only the model
    third = prepare_demo(tmp_path, PrepareOptions(fast=True, log_lines=60, seed=0))
    assert third.made == ("logs",)
    (tmp_path / "model" / "model.onnx").write_bytes(b"damaged")
    assert not is_complete(tmp_path, PrepareOptions(fast=True, log_lines=60, seed=0))
    fourth = prepare_demo(tmp_path, PrepareOptions(fast=True, log_lines=60, seed=0))
    assert fourth.made == ("model",) and faked["model"] == 2
    # the embedder is its own step: a damaged embedder redoes only it
    (tmp_path / "embedder" / "model.onnx").write_bytes(b"damaged")
    assert not is_complete(tmp_path, PrepareOptions(fast=True, log_lines=60, seed=0))
    fifth = prepare_demo(tmp_path, PrepareOptions(fast=True, log_lines=60, seed=0))
    assert fifth.made == ("embedder",) and faked["embedder"] == 2

    manifest = json.loads((tmp_path / "prepare.json").read_text())
    assert manifest["complete"] is True
    assert set(manifest["steps"]["data"]["files"]) == {"data/train.jsonl", "data/test.jsonl"}


def test_data_files_are_the_seeded_split(tmp_path: Path, faked: dict[str, int]) -> None:
    prepare_demo(tmp_path, PrepareOptions(fast=True, log_lines=10, seed=3))
    train = [json.loads(line) for line in (tmp_path / "data" / "train.jsonl").read_text().splitlines()]
    test = [json.loads(line) for line in (tmp_path / "data" / "test.jsonl").read_text().splitlines()]
    assert len(train) == 40 and len(test) == 10
    assert set(train[0]) == {"text", "label"}
    expected = archive.split_movies(_corpora()["movie"].texts, seed=3)
    assert [r["text"] for r in test] == [t.text for t in expected.test]
    assert {r["text"] for r in train}.isdisjoint({r["text"] for r in test})


def test_log_sources_exclude_only_the_movie_test_split() -> None:
    corpora = _corpora()
    split = archive.split_movies(corpora["movie"].texts, seed=0)
    sources = prepare.log_sources(corpora, split)
    texts = {s.text for s in sources}
    assert texts.isdisjoint({t.text for t in split.test})
    assert {t.text for t in split.train} <= texts
    assert len(sources) == len(split.train) + 30
    assert {s.source for s in sources} == {"movie", "tweet", "amazon", "nyt"}
    assert all(s.label in ("positive", "negative") for s in sources)


def test_bad_arguments_are_usage_errors(tmp_path: Path) -> None:
    from calibkit.errors import UsageError

    with pytest.raises(UsageError):
        prepare_demo(tmp_path, PrepareOptions(log_lines=0))
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(UsageError, match="not a folder"):
        prepare_demo(f, PrepareOptions())
