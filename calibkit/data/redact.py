"""Personal data out of calibration texts: e-mails, phone numbers, card numbers and IP addresses become
placeholders (``<EMAIL>``, ``<PHONE>``, ``<CARD>``, ``<IP>``).

Card numbers are redacted only when they pass the Luhn check (so order numbers and ids stay). Phone numbers
need 10-15 digits in groups (so years, dates, prices and versions stay). IP addresses are checked with
:mod:`ipaddress`.

HTML policy (see :func:`strip_scripts`): the model should see what production sees, so markup is kept as is,
except ``<script>`` and ``<style>`` blocks (tag and content), which carry no request text and would only
skew activation ranges with code tokens.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

REDACTION_KINDS: tuple[str, ...] = ("email", "phone", "card", "ip")
PLACEHOLDERS = {"email": "<EMAIL>", "phone": "<PHONE>", "card": "<CARD>", "ip": "<IP>"}

_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
_NUMBERS = re.compile(
    r"(?P<card>(?<![\w.])\d(?:[ -]?\d){12,18}(?![\w]))"
    r"|(?P<ip4>(?<![\w.])\d{1,3}(?:\.\d{1,3}){3}(?![\w]|\.\d))"
    r"|(?P<phone>(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?\d{2,4}(?:[ .-]\d{2,5}){1,4}(?![\w]|[.-]\d))"
)
_DIGIT = re.compile(r"\d")
_IP6 = re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])")
_DATE = re.compile(r"\d{4}[-.]\d{1,2}[-.]\d{1,2}|\d{1,2}[-.]\d{1,2}[-.]\d{2,4}")
_SCRIPT = re.compile(r"<(script|style)\b[^>]*>.*?(?:</\1\s*>|$)", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class Redacted:
    text: str
    counts: dict[str, int]  # kind -> number replaced (only kinds that occurred)


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _is_phone(s: str) -> bool:
    digits = sum(c.isdigit() for c in s)
    if _DATE.fullmatch(s):
        return False
    if s.startswith("+") or "(" in s:
        return 8 <= digits <= 15
    if s.isdigit():  # one run of digits without separators: an id or order number, not a phone
        return False
    return 10 <= digits <= 15


def redact(text: str) -> Redacted:
    """Replace personal data by placeholders; ``counts`` says what was replaced."""
    counts: dict[str, int] = {}

    def bump(kind: str) -> str:
        counts[kind] = counts.get(kind, 0) + 1
        return PLACEHOLDERS[kind]

    if "@" in text:
        text = _EMAIL.sub(lambda m: bump("email"), text)
    if "::" in text or text.count(":") >= 7:

        def ip6(m: re.Match[str]) -> str:
            s = m.group(0)
            try:
                ipaddress.IPv6Address(s)
            except ValueError:
                return s
            return bump("ip")

        text = _IP6.sub(ip6, text)

    def numbers(m: re.Match[str]) -> str:
        s = m.group(0)
        if m.group("card") is not None:
            digits = s.replace(" ", "").replace("-", "")
            if luhn_ok(digits):
                return bump("card")
            return bump("phone") if _is_phone(s) else s
        if m.group("ip4") is not None:
            try:
                ipaddress.IPv4Address(s)
            except ValueError:
                return s
            return bump("ip")
        return bump("phone") if _is_phone(s) else s

    if _DIGIT.search(text):
        text = _NUMBERS.sub(numbers, text)
    return Redacted(text, counts)


def strip_scripts(text: str) -> tuple[str, int]:
    """Remove ``<script>``/``<style>`` blocks (an unclosed one runs to the end); other markup is kept."""
    if "<" not in text:
        return text, 0
    out, n = _SCRIPT.subn("", text)
    if n:
        out = re.sub(r"[ \t]{2,}", " ", out).strip()
    return out, n
