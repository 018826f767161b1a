"""Eval sets from JSONL, CSV, TSV, Parquet and datasets folders; labels by name or id."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from calibkit.data.evalset import label_ids, load_eval_set
from calibkit.errors import DataError

ROWS = [("a fine film", "positive"), ("dull, flat", "negative"), ('says "hi", then, leaves', "positive")]
ID2LABEL = {0: "negative", 1: "positive"}


def _check(ev, labels=("positive", "negative", "positive")) -> None:
    assert ev.texts == tuple(t for t, _ in ROWS)
    assert ev.labels == labels


def test_jsonl(tmp_path: Path) -> None:
    p = tmp_path / "e.jsonl"
    p.write_text("".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in ROWS) + "\n")
    ev = load_eval_set(p)
    _check(ev)
    assert list(label_ids(ev, ID2LABEL, 2)) == [1, 0, 1]


def test_csv_keeps_labels_as_written(tmp_path: Path) -> None:
    p = tmp_path / "e.csv"
    pl.DataFrame({"sentence": [t for t, _ in ROWS], "label": ["1", "0", "1"]}).write_csv(p)
    ev = load_eval_set(p)
    _check(ev, ("1", "0", "1"))
    assert list(label_ids(ev, ID2LABEL, 2)) == [1, 0, 1]


def test_parquet_int_labels_and_custom_columns(tmp_path: Path) -> None:
    p = tmp_path / "e.parquet"
    pl.DataFrame({"body": [t for t, _ in ROWS], "y": [1, 0, 1]}).write_parquet(p)
    ev = load_eval_set(p, text_column="body", label_column="y")
    _check(ev, ("1", "0", "1"))
    assert list(label_ids(ev, {}, 2)) == [1, 0, 1]


def test_hf_datasets_folder(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    feats = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])})
    ds = datasets.Dataset.from_dict({"text": [t for t, _ in ROWS], "label": [1, 0, 1]}, features=feats)
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "hf"))
    ev = load_eval_set(tmp_path / "hf")
    _check(ev, ("1", "0", "1"))
    with pytest.raises(DataError, match="no split"):
        load_eval_set(tmp_path / "hf", split="validation")


def test_label_names_case_insensitive_and_unknown(tmp_path: Path) -> None:
    p = tmp_path / "e.jsonl"
    p.write_text('{"text": "x", "label": "Positive"}\n{"text": "y", "label": "meh"}\n{"text": "z", "label": 7}\n')
    ev = load_eval_set(p)
    with pytest.raises(DataError, match="2 labels the model does not know") as exc:
        label_ids(ev, ID2LABEL, 2)
    assert "negative" in (exc.value.hint or "")
    assert list(label_ids(ev.head(1), ID2LABEL, 2)) == [1]


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("e.txt", "x", "unknown format"),
        ("e.jsonl", "", "holds no examples"),
        ("e.jsonl", '{"text": 3, "label": "a"}\n', "has no text"),
        ("e.jsonl", '{"text": "t", "label": ""}\n', "has no label"),
    ],
)
def test_bad_files(tmp_path: Path, name: str, content: str, message: str) -> None:
    p = tmp_path / name
    p.write_text(content)
    with pytest.raises(DataError, match=message):
        load_eval_set(p)


def test_missing_and_limit(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        load_eval_set(tmp_path / "nope.jsonl")
    p = tmp_path / "e.jsonl"
    p.write_text("".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in ROWS))
    assert len(load_eval_set(p).head(2)) == 2
    assert np.array_equal(label_ids(load_eval_set(p).head(2), ID2LABEL, 2), [1, 0])


def test_unlabeled_set_is_accepted_and_a_named_label_column_must_exist(tmp_path: Path) -> None:
    f = tmp_path / "e.csv"
    f.write_text("text,other\nhi,1\nyo,2\n")
    es = load_eval_set(f)
    assert es.texts == ("hi", "yo") and es.labels == () and not es.has_labels
    assert es.head(1).texts == ("hi",)
    with pytest.raises(DataError, match="no label column 'intent'"):
        load_eval_set(f, label_column="intent")
