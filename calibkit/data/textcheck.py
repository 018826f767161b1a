"""Is a text usable as model input? Shared by the log reader and the eval-set loader.

A text is unusable when nothing would remain for a tokenizer: only whitespace, control characters or
*format* characters (Unicode category Cf: zero-width space/joiners, the byte-order mark, bidi marks, soft
hyphen). Lone surrogates (``"\\udc00"`` from a broken UTF-16 client; they cannot be encoded as UTF-8) are
detected so callers can count the line as broken instead of crashing when they write it.
"""

from __future__ import annotations

import re
import unicodedata

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
