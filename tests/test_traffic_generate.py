"""The synthetic production-log generator."""

from __future__ import annotations

import gzip
import json
import random

import pytest

from calibkit.demo.traffic import SourceText, generate_log
from calibkit.errors import DataError


def make_sources(n: int = 200, seed: int = 0) -> list[SourceText]:
    rng = random.Random(seed)
    vocab = {
        "movie": "film actor plot scene director sequel".split(),
        "news": "senate budget court reform election tax".split(),
    }
    common = "the a is was great awful very not".split()
    out = []
    for i in range(n):
        kind = "movie" if i % 2 else "news"
        words = [rng.choice(vocab[kind] + common) for _ in range(rng.randint(3, 25))]
        out.append(SourceText(" ".join(words) + ".", kind, rng.choice(("pos", "neg"))))
    return out


def _records(raw: bytes) -> list:
    out = []
    for line in raw.split(b"\n")[:-1]:
        try:
            out.append(json.loads(line.decode("utf-8")))
        except (UnicodeDecodeError, ValueError):
            out.append(None)
    return out


def _text(r: dict):
    return r["text"] if "text" in r else (r.get("request") or {}).get("text")


def test_deterministic_properties_and_counts(tmp_path):
    src = make_sources()
    a = generate_log(src, tmp_path / "a.jsonl", 6000, seed=3)
    b = generate_log(src, tmp_path / "b.jsonl", 6000, seed=3)
    generate_log(src, tmp_path / "c.jsonl", 6000, seed=4)
    raw = (tmp_path / "a.jsonl").read_bytes()
    assert raw == (tmp_path / "b.jsonl").read_bytes() != (tmp_path / "c.jsonl").read_bytes()
    assert a.records == b.records and a.lines == 6000
    recs = _records(raw)
    assert len(recs) == 6000
    assert 0.005 < a.broken_total / 6000 < 0.02
    assert all(a.broken[k] > 0 for k in a.broken)
    good = [r for r in recs if isinstance(r, dict) and isinstance(_text(r), str) and _text(r).strip()]
    texts = [_text(r) for r in good]
    assert len(texts) == a.records
    nested = sum(1 for r in good if "request" in r)
    assert nested == a.nested_text and all(r["endpoint"] == "/v2/classify" for r in good if "request" in r)
    assert sum("@" in t for t in texts) == a.emails > 0
    assert sum("<script>" in t for t in texts) == a.script_blocks > 0
    assert max(len(t.split()) for t in texts) > 512  # batch reviews make a long tail
    assert {"request_id", "ts", "endpoint", "client", "latency_ms", "status"} <= set(good[0])
    assert good[0]["ts"].startswith("2026-03-14T") and good[-1]["ts"].startswith("2026-03-14T2")


def test_topic_drift_over_the_day(tmp_path):
    src = make_sources()
    generate_log(src, tmp_path / "d.jsonl", 8000, seed=0)
    kind_of = {s.text: s.source for s in src}
    by_hour: dict[int, list[str]] = {}
    for r in _records((tmp_path / "d.jsonl").read_bytes()):
        if isinstance(r, dict) and isinstance(r.get("text"), str) and r["text"] in kind_of:
            by_hour.setdefault(int(r["ts"][11:13]), []).append(kind_of[r["text"]])
    share = {h: v.count("movie") / len(v) for h, v in by_hour.items()}
    assert max(share.values()) - min(share.values()) > 0.3


def test_gzip_nested_field_and_errors(tmp_path):
    s = generate_log(make_sources(), tmp_path / "g.jsonl.gz", 500, seed=0, text_field="request.text")
    raw = gzip.decompress((tmp_path / "g.jsonl.gz").read_bytes())
    good = [r for r in _records(raw) if isinstance(r, dict) and isinstance((r.get("request") or {}).get("text"), str)]
    assert s.nested_text == s.records and all("text" not in r for r in good)
    with pytest.raises(DataError):
        generate_log([], tmp_path / "x.jsonl", 10)
    assert not (tmp_path / "x.jsonl").exists()
