"""De-duplication of request texts, exact and normalized, in bounded memory.

Each text is identified by an 8-byte BLAKE2b digest of its normalized form (Unicode NFKC, case-folded,
whitespace collapsed), so a million distinct texts cost tens of megabytes, not the texts themselves.
A second digest set over the exact text tells exact repeats from near-duplicates (case/whitespace/width).
"""

from __future__ import annotations

import hashlib
import unicodedata
from dataclasses import dataclass


def normalize(text: str) -> str:
    """The form two texts must share to count as duplicates."""
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text)
    return " ".join(text.casefold().split())


def digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


@dataclass(frozen=True)
class Seen:
    """``first`` is True for the first text of its group; ``key`` identifies the group."""

    key: int
    first: bool
    exact_repeat: bool


class DedupIndex:
    """Counts how often each normalized text was seen."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self._exact: set[int] = set()
        self.exact_duplicates = 0
        self.normalized_duplicates = 0

    def add(self, text: str) -> Seen:
        key = digest(normalize(text))
        n = self.counts.get(key, 0)
        self.counts[key] = n + 1
        if n == 0:
            self._exact.add(digest(text))
            return Seen(key, True, False)
        ek = digest(text)
        if ek in self._exact:
            self.exact_duplicates += 1
            return Seen(key, False, True)
        self._exact.add(ek)
        self.normalized_duplicates += 1
        return Seen(key, False, False)

    @property
    def unique(self) -> int:
        return len(self.counts)

    @property
    def duplicates(self) -> int:
        return self.exact_duplicates + self.normalized_duplicates

    def groups_repeated(self) -> int:
        return sum(1 for c in self.counts.values() if c > 1)
