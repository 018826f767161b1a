"""Eval sets from JSONL, CSV, TSV, Parquet and datasets folders; labels by name or id."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from calibkit.data.evalset import label_ids, load_eval_set, word_label_ids
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


# ---------------------------------------------------------------- one tag per word (NER, CoNLL style)

NER = [(["Anna", "flew", "to", "New", "York."], ["B-PER", "O", "O", "B-LOC", "I-LOC"]),
       (["Bob", "stayed"], ["B-PER", "O"])]
NER_LABELS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}


def _words(ev, i: int) -> list[str]:
    return [ev.texts[i][a:b] for a, b in ev.word_labels[i].spans]


def test_conll_tokens_and_ner_tags_jsonl(tmp_path: Path) -> None:
    p = tmp_path / "ner.jsonl"
    p.write_text("".join(json.dumps({"tokens": w, "ner_tags": t}) + "\n" for w, t in NER))
    ev = load_eval_set(p)
    assert ev.texts == ("Anna flew to New York.", "Bob stayed")
    assert ev.has_word_labels and not ev.has_labels and ev.labels == ()
    assert _words(ev, 0) == NER[0][0] and ev.word_labels[0].tags == tuple(NER[0][1])
    ids = word_label_ids(ev, NER_LABELS, 5)
    assert [list(x) for x in ids] == [[1, 0, 0, 3, 4], [1, 0]]


def test_text_with_a_tags_list_aligned_to_whitespace_words_and_int_tags(tmp_path: Path) -> None:
    p = tmp_path / "ner.jsonl"
    p.write_text(json.dumps({"text": "Anna  flew\tto Paris", "tags": [1, 0, 0, 3.0]}) + "\n")
    ev = load_eval_set(p)
    assert _words(ev, 0) == ["Anna", "flew", "to", "Paris"] and ev.word_labels[0].tags == ("1", "0", "0", "3")
    assert list(word_label_ids(ev, NER_LABELS, 5)[0]) == [1, 0, 0, 3]


def test_hf_datasets_ner_tags_become_the_datasets_tag_names(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    # the dataset's ids differ from the model's: names are what match
    names = ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    feats = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                               "ner_tags": datasets.Sequence(datasets.ClassLabel(names=names))})
    ds = datasets.Dataset.from_dict({"tokens": [w for w, _ in NER],
                                     "ner_tags": [[names.index(x) for x in t] for _, t in NER]}, features=feats)
    datasets.DatasetDict({"test": ds}).save_to_disk(str(tmp_path / "hf"))
    ev = load_eval_set(tmp_path / "hf")
    assert ev.word_labels[0].tags == tuple(NER[0][1])
    assert [list(x) for x in word_label_ids(ev, NER_LABELS, 5)] == [[1, 0, 0, 3, 4], [1, 0]]


@pytest.mark.parametrize(
    "rows, message",
    [
        ([{"tokens": ["a", "b"], "ner_tags": ["O"]}], "example 1 has 1 tags in 'ner_tags' for 2 words"),
        ([{"tokens": ["a"], "ner_tags": ["O"]}, {"tokens": ["b", "c"], "ner_tags": ["O", "O", "O"]}],
         "example 2 has 3 tags in 'ner_tags' for 2 words in 'tokens': tags and words are misaligned"),
        ([{"text": "a b c", "labels": ["O", "O"]}], "example 1 has 2 tags in 'labels' for 3 words in 'text'"),
        ([{"tokens": ["a"], "ner_tags": ["O"]}, {"tokens": ["b"], "ner_tags": "O"}],
         "example 2 has no list of tags in column 'ner_tags'"),
        ([{"tokens": ["a", "b"], "ner_tags": ["O", None]}], "tag 2 \\(None\\) of word 'b'"),
        ([{"tokens": ["a", 3], "ner_tags": ["O", "O"]}], "column 'tokens' is not a list of words"),
    ],
)
def test_misaligned_or_malformed_word_tags_name_the_row(tmp_path: Path, rows: list, message: str) -> None:
    p = tmp_path / "ner.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=message) as exc:
        load_eval_set(p)
    assert "one tag per word" in (exc.value.hint or "") or "list of words" in str(exc.value)


def test_unknown_word_tags_are_named(tmp_path: Path) -> None:
    p = tmp_path / "ner.jsonl"
    p.write_text(json.dumps({"tokens": ["Anna", "Corp"], "ner_tags": ["B-PER", "B-ORG"]}) + "\n")
    with pytest.raises(DataError, match="1 word tags the model does not know: 'B-ORG'") as exc:
        word_label_ids(load_eval_set(p), NER_LABELS, 5)
    assert "B-LOC" in (exc.value.hint or "")


def test_subsets_keep_words_and_tags_together(tmp_path: Path) -> None:
    from calibkit.evaluate.inputs import limit_eval_set

    p = tmp_path / "ner.jsonl"
    rows = [{"tokens": [f"w{i}", "x"], "ner_tags": ["B-PER" if i % 2 else "O", "O"]} for i in range(40)]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ev = load_eval_set(p)
    for sub in (ev.head(7), limit_eval_set(ev, 9, seed=3)[0]):
        assert sub.has_word_labels and len(sub.word_labels) == len(sub.texts)
        for text, wl in zip(sub.texts, sub.word_labels):
            i = int(text.split()[0][1:])
            assert wl.tags[0] == ("B-PER" if i % 2 else "O")


def test_label_sets_for_multi_label_models(tmp_path: Path) -> None:
    """With label_sets a list is the example's labels (names, ids or a 0/1 vector), not one tag per word."""
    from calibkit.data.evalset import SET_SEPARATOR

    p = tmp_path / "multi.jsonl"
    rows = [{"text": "a b c", "labels": ["toxic", "insult"]}, {"text": "d", "labels": [1, 0, 1]},
            {"text": "e f", "labels": []}, {"text": "g", "labels": "toxic"}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ev = load_eval_set(p, label_sets=True)
    assert [x.split(SET_SEPARATOR) if x else [] for x in ev.labels] == [["insult", "toxic"], ["0", "2"], [], ["toxic"]]
    assert not ev.has_word_labels
    with pytest.raises(DataError, match="tags and words are misaligned"):
        load_eval_set(p)  # without it, lists are word tags, as before


def test_unknown_labels_without_id2label_say_ids_are_expected() -> None:
    from calibkit.data.evalset import map_labels

    with pytest.raises(DataError) as info:
        map_labels(["class_0", "1"], {}, 3, "eval set x")
    assert "no id2label" in (info.value.hint or "") and "0..2" in (info.value.hint or "")
    assert list(map_labels(["2", "0"], {}, 3, "eval set x")) == [2, 0]
