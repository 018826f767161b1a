"""A robust, streaming reader of JSON Lines request logs (plain or gzip-compressed).

The file is read in binary blocks (never whole), hashed while it is read, and split into lines; every line
is either a :class:`LogRecord` or counted as broken by kind. Broken lines never stop the reader unless
``strict`` is set, in which case the first one raises a :class:`DataError` naming its line number.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from calibkit.data.textcheck import has_lone_surrogate, is_usable, is_utf16, replace_surrogates, utf16_hint
from calibkit.errors import DataError
from calibkit.results.files import BrokenLines, ManifestLines, OversizedTexts

log = logging.getLogger("calibkit.data.logs")

# Where request texts usually live, in the order auto-detection prefers them.
TEXT_FIELD_CANDIDATES: tuple[str, ...] = (
    "text",
    "request.text",
    "input",
    "request.input",
    "prompt",
    "request.prompt",
    "query",
    "request.query",
    "inputs",
    "message",
    "content",
    "sentence",
    "body.text",
    "payload.text",
)

MAX_LINE_BYTES = 64 << 20  # a longer line is skipped unread (counted as too_long): memory stays bounded

# Kinds of broken lines, in the order they are checked.
BROKEN_KINDS: tuple[str, ...] = (
    "blank",
    "too_long",
    "invalid_utf8",
    "invalid_json",
    "too_deep",
    "not_object",
    "missing_text",
    "non_string_text",
    "empty_text",
    "lone_surrogate",
)
_BROKEN_DESCRIPTIONS = {
    "blank": "blank line",
    "too_long": f"line longer than {MAX_LINE_BYTES >> 20} MiB",
    "invalid_utf8": "invalid UTF-8 bytes",
    "invalid_json": "invalid or truncated JSON",
    "too_deep": "JSON nested too deeply to parse",
    "not_object": "JSON value is not an object",
    "missing_text": "text field missing",
    "non_string_text": "text field is not a string",
    "empty_text": "text field is empty or holds only invisible (zero-width, format, control) characters",
    "lone_surrogate": "text holds a lone UTF-16 surrogate escape (e.g. \\udc00) that no encoder accepts",
}
FIRST_LINES_KEPT = 5
_BLOCK = 1 << 20
_DETECT_LINES = 2000
# a text is cut to this many characters before anything else sees it (redaction, dedup, tokenizer): a model
# reads at most a few thousand characters, and one 50 MB request must not cost gigabytes (counted: oversized)
MAX_TEXT_CHARS = 65536
TOO_LONG: Final = None  # what iter_lines yields in place of a line over MAX_LINE_BYTES


@dataclass(frozen=True)
class LogRecord:
    line_no: int  # 1-based
    text: str
    label: str | None


@dataclass
class ReadStats:
    """Filled in while a log is read (mutable on purpose: it is the reader's running tally)."""

    lines: int = 0
    records: int = 0
    broken: dict[str, int] = field(default_factory=lambda: {k: 0 for k in BROKEN_KINDS})
    first_lines: dict[str, list[int]] = field(default_factory=lambda: {k: [] for k in BROKEN_KINDS})
    bytes_read: int = 0  # of the file on disk (compressed when gzip)
    sha256: str = ""
    gzip_truncated: bool = False  # the compressed stream ended early (a log copied while being written)
    oversized: int = 0  # texts cut to MAX_TEXT_CHARS
    oversized_first_lines: list[int] = field(default_factory=list)

    @property
    def broken_total(self) -> int:
        return sum(self.broken.values())

    def add_broken(self, kind: str, line_no: int) -> None:
        self.broken[kind] += 1
        if len(self.first_lines[kind]) < FIRST_LINES_KEPT:
            self.first_lines[kind].append(line_no)

    def record(self) -> ManifestLines:
        """The manifest's ``lines`` section: what this tally counted (broken kinds that occurred only)."""
        return ManifestLines(
            gzip_truncated=self.gzip_truncated, read=self.lines, usable=self.records, broken_total=self.broken_total,
            oversized=OversizedTexts(self.oversized, tuple(self.oversized_first_lines), MAX_TEXT_CHARS),
            broken={k: BrokenLines(self.broken[k], tuple(self.first_lines[k])) for k in BROKEN_KINDS
                    if self.broken[k]})


def is_gzip(path: str | os.PathLike[str]) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


# compressions calibkit does not read, by their first bytes: refused by name instead of "no JSON object found"
_OTHER_COMPRESSIONS = ((b"\x28\xb5\x2f\xfd", "zstd", "zstd -d"), (b"BZh", "bzip2", "bunzip2"),
                       (b"\xfd7zXZ\x00", "xz", "unxz"), (b"PK\x03\x04", "zip", "unzip"),
                       (b"\x04\x22\x4d\x18", "lz4", "lz4 -d"))
_BOM = b"\xef\xbb\xbf"


def _check_compression(path: Path) -> None:
    with open(path, "rb") as fh:
        head = fh.read(16)
    for magic, name, tool in _OTHER_COMPRESSIONS:
        if head.startswith(magic):
            raise DataError(f"{path} is {name}-compressed; calibkit reads JSON Lines plain or gzip-compressed",
                            hint=f"decompress it first ({tool} {path}), or recompress it with gzip")
    if is_utf16(head):  # every line would be counted broken, with a hint about --text-field
        raise DataError(f"{path} is UTF-16 text; calibkit reads JSON Lines in UTF-8", hint=utf16_hint(path))


def _raw_blocks(path: Path, on_bytes: Callable[[bytes], None], st: ReadStats) -> Iterator[bytes]:
    """Decompressed blocks of the file; ``on_bytes`` sees the bytes as they are on disk."""
    gz = is_gzip(path)
    if not gz:
        _check_compression(path)
    fed = False
    with open(path, "rb") as fh:
        dec = zlib.decompressobj(wbits=47) if gz else None
        while block := fh.read(_BLOCK):
            on_bytes(block)
            if dec is None:
                yield block
                continue
            while block:
                fed = True
                try:
                    out = dec.decompress(block)
                except zlib.error as exc:
                    raise DataError(
                        f"{path}: corrupt gzip data ({exc})", hint="re-compress the log or pass it uncompressed"
                    ) from exc
                if out:
                    yield out
                if dec.eof:  # concatenated gzip members (as `cat a.gz b.gz` or log rotation writes them)
                    block = dec.unused_data
                    dec = zlib.decompressobj(wbits=47)
                    fed = False
                else:
                    block = b""
        if dec is not None:
            tail = dec.flush()
            if tail:
                yield tail
            if fed and not dec.eof:
                st.gzip_truncated = True
                log.warning("%s: gzip stream ends early (truncated file); the lines before the cut are used", path)


def iter_lines(path: str | os.PathLike[str], stats: ReadStats | None = None) -> Iterator[tuple[int, bytes | None]]:
    """(1-based line number, bytes without the line ending); a final line without newline is included.

    A line longer than ``MAX_LINE_BYTES`` is not kept in memory: it is yielded as ``TOO_LONG`` (None).
    """
    p = Path(path)
    st = stats or ReadStats()
    digest = hashlib.sha256()

    def seen(b: bytes) -> None:
        digest.update(b)
        st.bytes_read += len(b)

    n = 0
    rest = b""
    skipping = False  # inside a line over MAX_LINE_BYTES: discard until its newline
    for block in _raw_blocks(p, seen, st):
        if skipping:
            cut = block.find(b"\n")
            if cut < 0:
                continue
            n += 1
            yield n, TOO_LONG
            skipping, block = False, block[cut + 1 :]
        parts = (rest + block).split(b"\n") if rest else block.split(b"\n")
        if n == 0 and parts[0].startswith(_BOM):  # a UTF-8 byte order mark (Windows editors write one)
            parts[0] = parts[0][len(_BOM):]
        rest = parts.pop()
        for part in parts:
            n += 1
            yield n, TOO_LONG if len(part) > MAX_LINE_BYTES else (part[:-1] if part.endswith(b"\r") else part)
        if len(rest) > MAX_LINE_BYTES:
            rest, skipping = b"", True
    if skipping:
        n += 1
        yield n, TOO_LONG
    elif rest:
        n += 1
        rest = rest[len(_BOM):] if n == 1 and rest.startswith(_BOM) else rest
        yield n, rest[:-1] if rest.endswith(b"\r") else rest
    st.sha256 = digest.hexdigest()


def cut_text(text: str, limit: int | None = None) -> str:
    """``text`` cut to at most ``limit`` (MAX_TEXT_CHARS) characters, at the last whitespace of its final
    kilobyte when there is one: a cut through an e-mail address or card number would leave a fragment that
    redaction no longer recognises."""
    limit = MAX_TEXT_CHARS if limit is None else limit
    if len(text) <= limit:
        return text
    head = text[:limit]
    window = head[-1024:]
    for i in range(len(window) - 1, -1, -1):
        if window[i].isspace():
            return head[: limit - len(window) + i]
    return head


def get_path(obj: dict[str, Any], path: Sequence[str]) -> tuple[bool, Any]:
    cur: Any = obj
    for key in path:
        if not isinstance(cur, dict) or key not in cur:
            return False, None
        cur = cur[key]
    return True, cur


def _split(path: str) -> tuple[str, ...]:
    parts = tuple(p for p in path.strip().split("."))
    if not path.strip() or any(not p for p in parts):
        raise DataError(f"invalid field path {path!r}", hint="use a dotted path such as text or request.text")
    return parts


def parse_field_paths(spec: str) -> tuple[str, ...]:
    """``"request.text,text"`` -> ("request.text", "text"): fallbacks tried in order on every line."""
    paths = tuple(s.strip() for s in spec.split(",") if s.strip())
    if not paths:
        raise DataError(f"invalid field path {spec!r}", hint="use a dotted path such as text or request.text")
    for p in paths:
        _split(p)
    return paths


def detect_text_fields(path: str | os.PathLike[str], max_lines: int = _DETECT_LINES) -> tuple[str, ...]:
    """Pick the text field(s) from the first good lines.

    The most common candidate wins; further candidates are added only when they cover lines the chosen ones
    do not (logs where one endpoint nests its text, e.g. ``request.text``, and the others do not).
    """
    objects: list[dict[str, Any]] = []
    keys_seen: set[str] = set()
    for _, raw in iter_lines(path):
        if len(objects) >= max_lines:
            break
        if raw is TOO_LONG:
            continue
        try:
            obj = json.loads(raw)
        except (UnicodeDecodeError, ValueError, RecursionError):
            continue
        if isinstance(obj, dict):
            objects.append(obj)
            keys_seen.update(map(str, obj.keys()))
    if not objects:
        raise DataError(
            f"{path}: no JSON object found in the first lines",
            hint="calibkit sample reads JSON Lines (one JSON object per line), plain or .gz",
        )
    covers: dict[str, set[int]] = {}
    for cand in TEXT_FIELD_CANDIDATES:
        parts = _split(cand)
        hit = set()
        for i, obj in enumerate(objects):
            ok, v = get_path(obj, parts)
            if ok and isinstance(v, str) and v.strip():
                hit.add(i)
        if hit:
            covers[cand] = hit
    chosen: list[str] = []
    covered: set[int] = set()
    min_new = max(1, len(objects) // 100)
    while True:
        best = max(
            (c for c in covers if c not in chosen),
            key=lambda c: (len(covers[c] - covered), -TEXT_FIELD_CANDIDATES.index(c)),
            default=None,
        )
        if best is None or len(covers[best] - covered) < min_new:
            break
        chosen.append(best)
        covered |= covers[best]
    if not chosen:
        raise DataError(
            f"{path}: no text field found among {', '.join(TEXT_FIELD_CANDIDATES)} "
            f"(top-level fields seen: {', '.join(sorted(keys_seen)[:12]) or 'none'})",
            hint="name it with --text-field, a dotted path such as request.text",
        )
    return tuple(chosen)


def read_log(
    path: str | os.PathLike[str],
    text_fields: Sequence[str],
    label_field: str | None = None,
    *,
    strict: bool = False,
    stats: ReadStats | None = None,
) -> Iterator[LogRecord]:
    """Yield the usable records of a JSON Lines log; count the rest in ``stats`` by kind."""
    st = stats if stats is not None else ReadStats()
    fields = [_split(f) for f in text_fields]
    label_parts = _split(label_field) if label_field else None
    loads = json.loads
    for n, raw in iter_lines(path, st):
        st.lines += 1
        kind: str | None = None
        text: Any = None
        if raw is TOO_LONG:
            kind = "too_long"
        elif not raw.strip():
            kind = "blank"
        else:
            try:
                s = raw.decode("utf-8")
            except UnicodeDecodeError:
                kind = "invalid_utf8"
            else:
                try:
                    obj = loads(s)
                except ValueError:
                    kind = "invalid_json"
                except RecursionError:
                    kind = "too_deep"
                else:
                    if not isinstance(obj, dict):
                        kind = "not_object"
                    else:
                        found = False
                        for parts in fields:
                            cur: Any = obj
                            for key in parts:
                                if isinstance(cur, dict) and key in cur:
                                    cur = cur[key]
                                else:
                                    break
                            else:
                                found = True
                                text = cur
                                if isinstance(cur, str) and cur.strip():
                                    break
                        if not found:
                            kind = "missing_text"
                        elif not isinstance(text, str):
                            kind = "non_string_text"
                        elif not is_usable(text):
                            kind = "empty_text"
                        elif has_lone_surrogate(text):
                            kind = "lone_surrogate"
        if kind is not None:
            if strict:
                raise DataError(
                    f"{path}:{n}: {_BROKEN_DESCRIPTIONS[kind]} (--strict stops at the first bad line)",
                    hint="fix or drop that line, or run without --strict to skip and count bad lines",
                )
            st.add_broken(kind, n)
            continue
        label = None
        if label_parts is not None:
            ok, lv = get_path(obj, label_parts)
            if ok and lv is not None and not isinstance(lv, (dict, list)):
                label = replace_surrogates(str(lv))
        if len(text) > MAX_TEXT_CHARS:
            text = cut_text(text)
            st.oversized += 1
            if len(st.oversized_first_lines) < FIRST_LINES_KEPT:
                st.oversized_first_lines.append(n)
        st.records += 1
        yield LogRecord(n, text, label)
