"""The streaming log reader: every broken-line kind, gzip, strict mode, text-field detection."""

from __future__ import annotations

import gzip
import json

import pytest

from calibkit.data.logs import ReadStats, detect_text_fields, parse_field_paths, read_log
from calibkit.errors import DataError

GOOD = [
    {"text": "first request"},
    {"text": "second request", "label": "pos"},
    {"request": {"text": "nested request"}, "label": 1},
]


def _write(path, lines: list[bytes]) -> None:
    path.write_bytes(b"\n".join(lines) + b"\n")


def _broken_log(path) -> None:
    _write(
        path,
        [
            json.dumps(GOOD[0]).encode(),  # 1
            b"",  # 2 blank
            b"   ",  # 3 blank
            b'{"text": "caf\xe9 \xff"}',  # 4 invalid utf-8
            b'{"text": "cut off',  # 5 truncated json
            b"[1, 2, 3]",  # 6 not an object
            b'{"other": "x"}',  # 7 missing text
            b'{"text": 42}',  # 8 non-string
            b'{"text": "  "}',  # 9 empty
            json.dumps(GOOD[1]).encode(),  # 10
            json.dumps(GOOD[2]).encode(),  # 11 (missing for field "text" alone)
        ],
    )


def test_every_broken_kind_is_counted_with_line_numbers(tmp_path):
    p = tmp_path / "log.jsonl"
    _broken_log(p)
    st = ReadStats()
    recs = list(read_log(p, ["text"], "label", stats=st))
    assert [r.line_no for r in recs] == [1, 10]
    assert [r.text for r in recs] == ["first request", "second request"]
    assert [r.label for r in recs] == [None, "pos"]
    assert st.lines == 11 and st.records == 2
    expected = {
        "blank": [2, 3],
        "invalid_utf8": [4],
        "invalid_json": [5],
        "not_object": [6],
        "missing_text": [7, 11],
        "non_string_text": [8],
        "empty_text": [9],
    }
    for kind, lines in expected.items():
        assert st.broken[kind] == len(lines), kind
        assert st.first_lines[kind] == lines, kind
    assert st.broken_total == 9


def test_fallback_fields_and_numeric_label(tmp_path):
    p = tmp_path / "log.jsonl"
    _broken_log(p)
    recs = list(read_log(p, ["text", "request.text"], "label"))
    assert [r.text for r in recs] == ["first request", "second request", "nested request"]
    assert recs[-1].label == "1"


def test_strict_raises_at_first_bad_line(tmp_path):
    p = tmp_path / "log.jsonl"
    _broken_log(p)
    with pytest.raises(DataError, match=r":2: blank line"):
        list(read_log(p, ["text"], strict=True))


def test_gzip_and_concatenated_members_and_crlf(tmp_path):
    plain = tmp_path / "a.jsonl"
    _broken_log(plain)
    gz = tmp_path / "a.jsonl.gz"
    data = plain.read_bytes()
    gz.write_bytes(gzip.compress(data[:40]) + gzip.compress(data[40:]))
    sp, sg = ReadStats(), ReadStats()
    a = list(read_log(plain, ["text"], stats=sp))
    b = list(read_log(gz, ["text"], stats=sg))
    assert a == b and sp.broken == sg.broken
    assert sp.sha256 != sg.sha256 and len(sg.sha256) == 64  # hash of the file as it is on disk
    crlf = tmp_path / "crlf.jsonl"
    crlf.write_bytes(b'{"text": "a"}\r\n{"text": "b"}')  # no final newline
    assert [r.text for r in read_log(crlf, ["text"])] == ["a", "b"]


def test_large_lines_across_block_boundaries(tmp_path, monkeypatch):
    import calibkit.data.logs as logs_mod

    monkeypatch.setattr(logs_mod, "MAX_TEXT_CHARS", 1 << 24)  # this test is about line assembly, not the cap
    p = tmp_path / "big.jsonl"
    texts = [f"word{i} " * (160_000 + i) for i in range(3)]  # each line longer than the 1 MiB read block
    _write(p, [json.dumps({"text": t}).encode() for t in texts])
    assert [r.text for r in read_log(p, ["text"])] == texts


def test_detect_text_fields_mixed_nesting(tmp_path):
    p = tmp_path / "log.jsonl"
    lines = []
    for i in range(300):
        if i % 5 == 0:
            lines.append({"id": i, "request": {"text": f"nested {i}"}})
        else:
            lines.append({"id": i, "text": f"plain {i}", "query": "" if i % 2 else "q"})
    _write(p, [b"garbage"] + [json.dumps(x).encode() for x in lines])
    assert detect_text_fields(p) == ("text", "request.text")


def test_detect_text_fields_prompt_and_failure(tmp_path):
    p = tmp_path / "log.jsonl"
    _write(p, [json.dumps({"prompt": "hello there"}).encode()] * 3)
    assert detect_text_fields(p) == ("prompt",)
    q = tmp_path / "none.jsonl"
    _write(q, [json.dumps({"body": "x", "n": 1}).encode()])
    with pytest.raises(DataError, match="no text field found") as ei:
        detect_text_fields(q)
    assert "--text-field" in (ei.value.hint or "")
    r = tmp_path / "junk.jsonl"
    _write(r, [b"not json", b"[1]"])
    with pytest.raises(DataError, match="no JSON object"):
        detect_text_fields(r)


def test_parse_field_paths():
    assert parse_field_paths("request.text, text") == ("request.text", "text")
    for bad in ("", "a..b", ".text", ","):
        with pytest.raises(DataError):
            parse_field_paths(bad)


def test_truncated_gzip_keeps_lines_before_the_cut(tmp_path):
    body = b"".join(json.dumps({"text": f"request {i}"}).encode() + b"\n" for i in range(2000))
    gz = tmp_path / "cut.jsonl.gz"
    gz.write_bytes(gzip.compress(body)[:-200])
    st = ReadStats()
    recs = list(read_log(gz, ["text"], stats=st))
    assert st.gzip_truncated and 1000 < len(recs) < 2000
    assert [r.text for r in recs] == [f"request {i}" for i in range(len(recs))]
    full = tmp_path / "ok.jsonl.gz"
    full.write_bytes(gzip.compress(body))
    st = ReadStats()
    assert len(list(read_log(full, ["text"], stats=st))) == 2000 and not st.gzip_truncated
