"""Paths that ended in a traceback (exit 1) are clear errors: exit 2-7, one message saying what is wrong and
what to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from calib_helpers import texts, write_model_dir
from cli_helpers import flat, run

from calibkit.data.calibset import write_calibration_set


@pytest.fixture()
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    write_model_dir(tmp_path / "model")
    write_calibration_set(tmp_path / "set", texts(20, seed=3), None)
    (tmp_path / "eval.jsonl").write_text(
        "".join(json.dumps({"text": t, "label": ["negative", "positive"][i % 2]}) + "\n"
                for i, t in enumerate(texts(40, seed=2))))
    return tmp_path


def _clear(r: object, *words: str) -> None:
    assert 2 <= r.exit_code <= 7, r.output  # type: ignore[attr-defined]  # usage/data/model/...: never 1
    text = flat(r)  # type: ignore[arg-type]
    assert "Traceback" not in text and "unexpected" not in text and "hint:" in text
    for w in words:
        assert w in text, text


def test_tune_limit_1_with_traffic(env: Path) -> None:
    traffic = env / "traffic.jsonl"
    traffic.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(600, seed=9, max_words=14)))
    r = run("tune", env / "model", "-c", env / "set", "-e", env / "eval.jsonl", "--traffic", traffic,
            "--limit", "1", "--out", env / "tu", "--no-report")
    _clear(r, "labelled example", "holdout", "--limit")
    assert not (env / "tu").exists()


def test_a_5000_digit_label(env: Path) -> None:
    ev = env / "huge.jsonl"
    ev.write_text('{"text": "good movie", "label": 1}\n{"text": "bad film", "label": ' + "9" * 5000 + "}\n")
    r = run("tune", env / "model", "-c", env / "set", "-e", ev, "--out", env / "tu", "--no-report")
    _clear(r, "huge.jsonl:2", "too long")


@pytest.mark.parametrize("value", ["abc", "nan", "-1"])
def test_a_progress_interval_that_is_not_a_number(env: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CALIBKIT_PROGRESS_INTERVAL", value)
    r = run("calibrate", env / "model", "-c", env / "set", "--out", env / "cal")
    _clear(r, "CALIBKIT_PROGRESS_INTERVAL")
    assert not (env / "cal").exists()


def test_tokenizer_ids_past_the_vocabulary_are_named(env: Path) -> None:
    import onnx
    from calib_helpers import tiny_model, write_tokenizer

    (env / "small").mkdir()
    onnx.save(tiny_model(vocab=6), str(env / "small" / "model.onnx"))  # the tokenizer's ids run to 15
    write_tokenizer(env / "small")
    r = run("calibrate", env / "small", "-c", env / "set", "--out", env / "cal")
    _clear(r, "past the model's vocabulary", "6 rows", "tokenizer")
