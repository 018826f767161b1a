"""A synthetic production log built from real texts, with the properties of real traffic.

Every line is a JSON object as an inference service writes it::

    {"request_id": "9f3c...", "ts": "2026-03-14T09:12:33.120Z", "endpoint": "/v1/classify",
     "client": "web-eu-2", "latency_ms": 12.7, "status": 200, "text": "...", "label": "pos"}

Endpoints, and where the text lives (a deliberate mix, so readers must cope with both):
- ``/v1/classify`` (most traffic): one source text at ``text_field`` (default top-level ``text``).
- ``/v2/classify`` (~20 %): always nested, ``{"request": {"text": ...}}``.
- ``/v1/batch-review`` (~2 %): 8-40 source texts joined (often longer than 512 tokens), at ``text_field``.
When ``text_field`` is itself nested (e.g. ``"request.text"``) every endpoint nests. ``label`` (top-level) is the
source text's label when it has one.

Traffic properties: a few hot queries repeated all day (~4 % of lines); near-duplicates differing only in case,
whitespace or full-width letters (~3 %); a long tail of lengths; topic drift (the mix of ``source`` kinds
follows the hour of the day); e-mail addresses, phone numbers, Luhn-valid card numbers and IP addresses
inside some texts; HTML and ``<script>`` fragments; and about 1 % broken lines (truncated JSON, invalid UTF-8,
missing / empty / non-string text field, blank lines). Deterministic for a seed; written as a stream
(1M lines never sit in memory) and atomically; ``.gz`` output is gzip-compressed (with a fixed mtime).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from calibkit._io import atomic_open
from calibkit.errors import DataError

DAY_START = 1_773_446_400  # 2026-03-14T00:00:00Z
BROKEN_KINDS = ("truncated_json", "invalid_utf8", "missing_text", "empty_text", "non_string_text", "blank")
_CLIENTS = ("web-eu-1", "web-eu-2", "web-us-1", "ios-app", "android-app", "partner-api", "batch-etl")
_FIRST = ("john", "maria", "wei", "fatima", "lukas", "aiko", "omar", "sofia")
_LAST = ("doe", "garcia", "chen", "khan", "muller", "sato", "haddad", "rossi")
_DOMAINS = ("example.com", "mail.example.org", "corp.example.net")


@dataclass(frozen=True)
class SourceText:
    text: str
    source: str  # kind of text (e.g. "movie", "tweet"): drives topic drift over the day
    label: str | None = None


@dataclass(frozen=True)
class LogSummary:
    """What was written, and how much of each traffic property was injected."""

    path: Path
    lines: int
    records: int  # lines with a usable text
    nested_text: int
    hot_query_lines: int
    near_duplicate_lines: int
    batch_review_lines: int
    emails: int
    phones: int
    cards: int
    ips: int
    html_fragments: int
    script_blocks: int
    broken: dict[str, int] = field(default_factory=dict)

    @property
    def broken_total(self) -> int:
        return sum(self.broken.values())


def _luhn_card(rng: random.Random) -> str:
    digits = [4] + [rng.randrange(10) for _ in range(14)]
    total = 0
    for i, d in enumerate(reversed(digits)):
        if i % 2 == 0:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    digits.append((10 - total % 10) % 10)
    s = "".join(map(str, digits))
    return " ".join(s[i : i + 4] for i in range(0, 16, 4)) if rng.random() < 0.6 else s


def _fullwidth(word: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in word)


def _near_duplicate(text: str, rng: random.Random) -> str:
    r = rng.random()
    if r < 0.3:
        return text.upper()
    if r < 0.55:
        return text.lower()
    if r < 0.8:
        return "  " + text.replace(" ", "  ", 3) + " \t"
    words = text.split(" ")
    i = rng.randrange(len(words))
    words[i] = _fullwidth(words[i])
    return " ".join(words)


def _put(rec: dict[str, Any], path: Sequence[str], value: object) -> None:
    cur = rec
    for key in path[:-1]:
        cur = cur.setdefault(key, {})
    cur[path[-1]] = value


def generate_log(
    sources: Sequence[SourceText],
    out_path: str | os.PathLike[str],
    n_lines: int,
    seed: int = 0,
    text_field: str = "text",
) -> LogSummary:
    """Write ``n_lines`` lines of synthetic production traffic built from ``sources``; see the module doc.
    Each line: a text (:func:`_pick_text`), personal data or markup injected (:func:`_inject`), the request
    record around it (:func:`_request`), and sometimes broken on purpose (:func:`_encode`); one seeded
    generator draws in that order, so the same seed writes the same bytes."""
    if not sources:
        raise DataError("generate_log needs at least one source text")
    if n_lines < 0:
        raise DataError(f"n_lines must be >= 0 (got {n_lines})")
    usable = [s for s in sources if s.text.strip()]
    if not usable:
        raise DataError("every source text is empty")
    path_parts = tuple(text_field.split("."))
    rng = random.Random(seed)
    mix = _SourceMix.of(usable, rng)
    counts = dict.fromkeys(
        ("records", "nested", "hot", "near", "batch", "email", "phone", "card", "ip", "html", "script"), 0
    )
    broken = dict.fromkeys(BROKEN_KINDS, 0)
    out = Path(out_path)
    gz = out.name.endswith(".gz")
    with atomic_open(out, "wb") as raw:
        fh: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=6) if gz else raw  # type: ignore[assignment]
        buf: list[bytes] = []
        for i in range(n_lines):
            t = DAY_START + (i + rng.random()) * 86400.0 / max(1, n_lines)
            inj: list[str] = []  # properties injected into this line, counted only if the line is usable
            src, text, endpoint = _pick_text(rng, mix, int((t - DAY_START) // 3600) % 24, inj)
            text = _inject(rng, text, inj)
            rec = _request(rng, t, endpoint, text)
            nested = endpoint == "/v2/classify" or len(path_parts) > 1
            tpath = ("request", "text") if endpoint == "/v2/classify" and len(path_parts) == 1 else path_parts
            line, kind = _encode(rng, rec, tpath, text, src)
            if kind:
                broken[kind] += 1
            else:
                counts["records"] += 1
                counts["nested"] += nested
                for k in inj:
                    counts[k] += 1
            buf.append(line)
            if len(buf) >= 4096:
                fh.write(b"\n".join(buf) + b"\n")
                buf.clear()
        if buf:
            fh.write(b"\n".join(buf) + b"\n")
        if gz:
            fh.close()
    return LogSummary(
        path=out,
        lines=n_lines,
        records=counts["records"],
        nested_text=counts["nested"],
        hot_query_lines=counts["hot"],
        near_duplicate_lines=counts["near"],
        batch_review_lines=counts["batch"],
        emails=counts["email"],
        phones=counts["phone"],
        cards=counts["card"],
        ips=counts["ip"],
        html_fragments=counts["html"],
        script_blocks=counts["script"],
        broken=broken,
    )


@dataclass(frozen=True)
class _SourceMix:
    """The source texts by kind, each kind's weight per hour (each peaks at its own hour) and five hot
    queries drawn from the shortest tenth."""

    kinds: list[str]
    by_kind: dict[str, list[SourceText]]
    hour_weights: list[list[float]]
    hot: list[SourceText]

    @classmethod
    def of(cls, usable: Sequence[SourceText], rng: random.Random) -> _SourceMix:
        kinds = sorted({s.source for s in usable})
        by_kind = {k: [s for s in usable if s.source == k] for k in kinds}
        hour_weights = []
        for h in range(24):
            ws = [1.0 + 0.9 * math.cos(2 * math.pi * (h / 24 - i / max(1, len(kinds)))) for i in range(len(kinds))]
            hour_weights.append(ws)
        short = sorted(usable, key=lambda s: (len(s.text), s.text))[: max(1, len(usable) // 10)]
        hot = [short[rng.randrange(len(short))] for _ in range(5)]
        return cls(kinds, by_kind, hour_weights, hot)


def _pick_text(rng: random.Random, mix: _SourceMix, hour: int, inj: list[str]) -> tuple[SourceText, str, str]:
    """(source, text, endpoint) of one request: a hot query (4 %), else a text of the hour's source mix, now
    and then a near duplicate (3 %) or a batch of reviews joined (2 %); 20 % go to the v2 endpoint."""
    r = rng.random()
    endpoint = "/v1/classify"
    if r < 0.04:
        src = mix.hot[min(4, int(rng.paretovariate(1.2)) - 1)]
        inj.append("hot")
        return src, src.text, endpoint
    kind = rng.choices(mix.kinds, weights=mix.hour_weights[hour])[0]
    src = rng.choice(mix.by_kind[kind])
    text = src.text
    if r < 0.07:
        text = _near_duplicate(text, rng)
        inj.append("near")
    elif r < 0.09:
        parts = [rng.choice(mix.by_kind[kind]).text for _ in range(rng.randint(8, 40))]
        text = " ".join(parts)
        endpoint = "/v1/batch-review"
        inj.append("batch")
    elif r < 0.29:
        endpoint = "/v2/classify"
    return src, text, endpoint


def _inject(rng: random.Random, text: str, inj: list[str]) -> str:
    """Personal data (an email, a phone number, a Luhn-valid card, an IP) or markup (HTML, a script block)
    appended to a few texts, each kind recorded in ``inj``."""
    p = rng.random()
    if p < 0.012:
        name = f"{rng.choice(_FIRST)}.{rng.choice(_LAST)}{rng.randrange(100)}@{rng.choice(_DOMAINS)}"
        text = f"{text} Contact me at {name}"
        inj.append("email")
    elif p < 0.022:
        num = rng.choice(("+1 (555) {:03d}-{:04d}", "555-{:03d}-{:04d}", "+44 20 7{:03d} {:04d}"))
        text = f"{text} Call me on {num.format(rng.randrange(1000), rng.randrange(10000))}."
        inj.append("phone")
    elif p < 0.03:
        text = f"{text} My card {_luhn_card(rng)} was charged twice."
        inj.append("card")
    elif p < 0.035:
        text = f"{text} (sent from 10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)})"
        inj.append("ip")
    elif p < 0.045:
        if rng.random() < 0.5:
            text = f"<p>{text}</p><script>track('{rng.getrandbits(32):08x}');</script>"
            inj.append("script")
        else:
            text = f'<div class="review"><b>{text}</b><br/></div>'
        inj.append("html")
    return text


def _request(rng: random.Random, t: float, endpoint: str, text: str) -> dict[str, Any]:
    """The request record around a text (without the text)."""
    return {
        "request_id": f"{rng.getrandbits(64):016x}",
        "ts": _iso(t),
        "endpoint": endpoint,
        "client": _CLIENTS[rng.randrange(len(_CLIENTS))],
        "latency_ms": round(3.0 + len(text) / 60.0 * rng.lognormvariate(0.0, 0.4), 2),
        "status": 200 if rng.random() > 0.01 else rng.choice((429, 500, 503)),
    }


def _encode(rng: random.Random, rec: dict[str, Any], tpath: Sequence[str], text: str,
            src: SourceText) -> tuple[bytes, str | None]:
    """The line's bytes and, for the 1 % broken on purpose, the kind of breakage (None: a usable line with
    the text at ``tpath`` and the source's label)."""
    b = rng.random()
    if b < 0.0025:
        line = json.dumps({**rec, "text": text}, ensure_ascii=False).encode()
        return line[: rng.randrange(1, max(2, len(line) - 1))], "truncated_json"
    if b < 0.004:
        _put(rec, tpath, "\u0000MARK")
        line = json.dumps(rec, ensure_ascii=False).encode()
        return line.replace(b"\\u0000MARK", b"caf\xe9 \xff\xfe" + text[:40].encode().replace(b'"', b"")), \
            "invalid_utf8"
    if b < 0.0055:
        return json.dumps(rec, ensure_ascii=False).encode(), "missing_text"
    if b < 0.007:
        _put(rec, tpath, rng.choice(("", "   ")))
        return json.dumps(rec, ensure_ascii=False).encode(), "empty_text"
    if b < 0.0085:
        _put(rec, tpath, rng.choice((42, None, ["a", "list"], {"nested": "object"})))
        return json.dumps(rec, ensure_ascii=False).encode(), "non_string_text"
    if b < 0.01:
        return b"", "blank"
    _put(rec, tpath, text)
    if src.label is not None:
        rec["label"] = src.label
    return json.dumps(rec, ensure_ascii=False).encode(), None


def _iso(t: float) -> str:
    import time

    ms = int(round((t - int(t)) * 1000)) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(t))) + f".{ms:03d}Z"
