"""Is a text usable as model input? Shared by the log reader and the eval-set and calibration-set loaders.

A text is unusable when nothing would remain for a tokenizer: only whitespace, control characters or
*format* characters (Unicode category Cf: zero-width space/joiners, the byte-order mark, bidi marks, soft
hyphen). Lone surrogates (``"\\udc00"`` from a broken UTF-16 client; they cannot be encoded as UTF-8) are
detected so callers can count the line as broken instead of crashing when they write it.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from pathlib import Path

_SURROGATE = re.compile("[\ud800-\udfff]")
_INVISIBLE = frozenset({"Cf", "Cc", "Zs", "Zl", "Zp"})


def has_lone_surrogate(text: str) -> bool:
    return not text.isascii() and _SURROGATE.search(text) is not None


def replace_surrogates(text: str) -> str:
    """Lone surrogates -> U+FFFD, so the text can be written as UTF-8."""
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


def is_usable(text: str) -> bool:
    """True when the text holds at least one visible character."""
    if not text.strip():
        return False
    if text.isascii():
        return any(c.isprintable() and not c.isspace() for c in text)
    return any(unicodedata.category(c) not in _INVISIBLE for c in text)


def decode_counted(data: bytes, what: str) -> str:
    """``data`` (a file's bytes) as text: a UTF-8 byte order mark dropped; bytes that are not UTF-8 read as
    U+FFFD, never silently: the lines holding them are counted and named in a warning about ``what`` (the file,
    as the user knows it)."""
    data = data[3:] if data.startswith(b"\xef\xbb\xbf") else data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    bad = []
    for n, line in enumerate(data.split(b"\n"), 1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            bad.append(n)
    shown = ", ".join(map(str, bad[:5])) + (" …" if len(bad) > 5 else "")
    logging.getLogger("calibkit.data").warning(
        "%s: %d line(s) hold bytes that are not UTF-8 (line %s); each such byte is read as U+FFFD; re-encode the "
        "file as UTF-8 to use those texts as written", what, len(bad), shown)
    return data.decode("utf-8", errors="replace")


def is_utf16(head: bytes) -> bool:
    """Whether a file's first bytes are UTF-16 text (calibkit reads UTF-8): a UTF-16 byte order mark, or the NUL
    byte UTF-16 writes beside each ASCII character (Windows PowerShell's ``>`` writes such files)."""
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return True
    head = head[: len(head) // 2 * 2][:16]
    if len(head) < 4:
        return False
    even, odd = head[0::2], head[1::2]
    return (odd.count(0) == len(odd) and 0 not in even) or (even.count(0) == len(even) and 0 not in odd)


def utf16_hint(path: Path) -> str:
    copy = path.with_name(f"{path.stem}.utf8{path.suffix}")
    return f"convert it to UTF-8 first (iconv -f UTF-16 -t UTF-8 {path} > {copy}) and pass the copy"
