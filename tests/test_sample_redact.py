"""Redaction of personal data: positives, negatives, Luhn; script stripping."""

from __future__ import annotations

import pytest

from calibkit.data.redact import luhn_ok, redact, strip_scripts


def _luhn_brute(digits: str) -> bool:
    s = 0
    for pos, ch in enumerate(digits[::-1], start=1):
        d = int(ch) * (2 if pos % 2 == 0 else 1)
        s += d // 10 + d % 10
    return s % 10 == 0


@pytest.mark.parametrize(
    "text,expected,kind",
    [
        ("write to john.doe+tag@mail.example.org please", "write to <EMAIL> please", "email"),
        ("call +1 (555) 013-2499 today", "call <PHONE> today", "phone"),
        ("call 555-013-2499.", "call <PHONE>.", "phone"),
        ("ring +44 20 7946 0958", "ring <PHONE>", "phone"),
        ("card 4111 1111 1111 1111 was charged", "card <CARD> was charged", "card"),
        ("card 4111111111111111", "card <CARD>", "card"),
        ("card 5500-0000-0000-0004 ok", "card <CARD> ok", "card"),
        ("from 192.168.12.7 at noon", "from <IP> at noon", "ip"),
        ("host 2001:db8::8a2e:370:7334 down", "host <IP> down", "ip"),
    ],
)
def test_positives(text, expected, kind):
    r = redact(text)
    assert r.text == expected
    assert r.counts == {kind: 1}


@pytest.mark.parametrize(
    "text",
    [
        "card 4111 1111 1111 1112 fails luhn",
        "order 1234567890123 shipped",
        "in 2019 I paid 300 dollars, 12.50 each",
        "version 1.2.3 released 2024-01-15",
        "meeting at 12:30:45 in room 101",
        "ip 256.1.1.1 is not an address",
        "an @ sign alone and user@localhost",
        "scores 10 - 12 - 14",
    ],
)
def test_negatives(text):
    r = redact(text)
    assert r.text == text and r.counts == {}


def test_counts_several_kinds():
    r = redact("a@b.io, c@d.io, 10.0.0.1 and 4111-1111-1111-1111")
    assert r.counts == {"email": 2, "ip": 1, "card": 1}
    assert "<EMAIL>, <EMAIL>, <IP> and <CARD>" == r.text


def test_luhn_against_brute_force():
    import random

    rng = random.Random(3)
    for _ in range(500):
        d = "".join(str(rng.randrange(10)) for _ in range(rng.randint(13, 19)))
        assert luhn_ok(d) == _luhn_brute(d)
    assert luhn_ok("79927398713") and not luhn_ok("79927398710")


def test_strip_scripts_keeps_other_markup():
    assert strip_scripts("<p>great film</p><script>track('x');</script>") == ("<p>great film</p>", 1)
    assert strip_scripts("ok <STYLE type='x'>b{}</STYLE> fine <script>unclosed") == ("ok fine", 2)
    assert strip_scripts("<b>bold</b> 3 < 4") == ("<b>bold</b> 3 < 4", 0)
