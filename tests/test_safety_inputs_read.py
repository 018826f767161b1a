"""Inputs read as they say: an eval set's columns come from all its rows, texts longer than the model reads are
cut before tokenizing (to the same tokens), undecodable bytes are counted and reported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from calib_helpers import WORDS, write_tokenizer

from calibkit.data.evalset import load_eval_set
from calibkit.data.tokenizer import CHARS_PER_TOKEN, TextTokenizer
from calibkit.errors import DataError


def test_a_partly_labelled_eval_set_is_refused_naming_the_unlabelled_rows(tmp_path: Path) -> None:
    p = tmp_path / "ev.jsonl"
    rows: list[dict[str, Any]] = [{"text": "good movie"}, {"text": "bad film"}]  # the first rows carry no label
    rows += [{"text": f"fun plot {i}", "label": "positive"} for i in range(6)]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"2 of 8 examples have no label in column 'label' \(example 1, 2\)"):
        load_eval_set(p)


def test_a_column_only_later_rows_have_is_still_found(tmp_path: Path) -> None:
    p = tmp_path / "ev.jsonl"
    p.write_text(json.dumps({"sentence": "a", "text": "good movie", "label": "positive"}) + "\n"
                 + json.dumps({"text": "bad film", "label": "negative", "extra": 1}) + "\n")
    ev = load_eval_set(p)
    assert ev.labels == ("positive", "negative")


class _Recording:
    """A fast tokenizer that records how many characters it was handed."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.seen = inner, 0

    def encode_batch(self, texts: list[str]) -> Any:
        self.seen = max([self.seen, *map(len, texts)])
        return self.inner.encode_batch(texts)

    def encode(self, text: str) -> Any:
        self.seen = max(self.seen, len(text))
        return self.inner.encode(text)


@pytest.mark.parametrize("head", ["", " " * 20_000])  # a text of words; one that starts with blank space
def test_a_long_text_is_cut_before_tokenizing_to_the_same_tokens(tmp_path: Path, head: str) -> None:
    write_tokenizer(tmp_path, max_positions=16)
    tok = TextTokenizer(tmp_path)
    long = head + " ".join(WORDS[i % len(WORDS)] for i in range(400_000))  # about 2 MB
    full = tok._fast.encode(long).ids  # type: ignore[union-attr]
    expected = [*full[: tok.max_length - 1], full[-1]]  # what encode keeps of the whole text
    rec = _Recording(tok._fast)
    tok._fast = rec  # type: ignore[assignment]
    enc = tok.encode([long, "good movie"])
    assert list(enc.input_ids[0]) == expected and bool(enc.truncated[0]) and not bool(enc.truncated[1])
    assert rec.seen <= 4 * (len(head) + CHARS_PER_TOKEN * tok.max_length)  # never the 2 MB
    assert int(tok.token_lengths([long])[0]) > tok.max_length


def test_a_utf8_bom_in_a_jsonl_log_is_accepted(tmp_path: Path) -> None:
    from cli_helpers import run

    log = tmp_path / "bom.jsonl"
    log.write_bytes(b"\xef\xbb\xbf" + b"".join(json.dumps({"text": f"good movie {w}"}).encode() + b"\n"
                                             for w in WORDS))
    r = run("sample", log, "--size", "4", "--clusters", "1", "--out", tmp_path / "s")
    assert r.exit_code == 0, r.output
    lines = json.loads((tmp_path / "s" / "manifest.json").read_text())["lines"]
    assert lines["broken_total"] == 0 and lines["usable"] == len(WORDS)


def test_a_zstd_compressed_log_is_named_as_such(tmp_path: Path) -> None:
    from cli_helpers import flat, run

    log = tmp_path / "prod.jsonl.zst"
    log.write_bytes(b"\x28\xb5\x2f\xfd\x04\x00" + bytes(range(40)))
    r = run("sample", log, "--size", "4", "--out", tmp_path / "s")
    assert r.exit_code == 3, r.output
    assert "zstd-compressed" in flat(r) and "zstd -d" in flat(r)


def test_undecodable_bytes_in_an_eval_set_are_counted_and_reported(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    p = tmp_path / "ev.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"text": "good movie", "label": "positive"}\n'
                  b'{"text": "bad \xff\xfe film", "label": "negative"}\n'
                  b'{"text": "dull plot", "label": "negative"}\n')
    with caplog.at_level("WARNING", logger="calibkit.data"):
        ev = load_eval_set(p)
    assert ev.texts[0] == "good movie" and len(ev) == 3  # the byte order mark is not part of the first line
    assert "1 line(s) hold bytes that are not UTF-8 (line 2)" in caplog.text


def test_undecodable_bytes_in_a_calibration_set_are_counted_and_reported(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    from calibkit.data.calibset import load_calibration_set

    p = tmp_path / "cal.jsonl"
    p.write_bytes(b'{"text": "good movie"}\n{"text": "fine"}\n{"text": "bad \xff\xfe film"}\n')
    with caplog.at_level("WARNING", logger="calibkit.data"):
        cset = load_calibration_set(p)
    assert cset.texts[2] == "bad \ufffd\ufffd film"
    assert "calibration set" in caplog.text and "1 line(s) hold bytes that are not UTF-8 (line 3)" in caplog.text
