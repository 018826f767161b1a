"""Exact and normalized de-duplication."""

from __future__ import annotations

from calibkit.data.dedup import DedupIndex, normalize


def test_normalize():
    assert normalize("  Hello\tWORLD \n") == "hello world"
    assert normalize("ｇｒｅａｔ film") == "great film"  # full-width letters (NFKC)
    assert normalize("Straße") == normalize("STRASSE")  # casefold


def test_index_counts_exact_and_normalized():
    idx = DedupIndex()
    texts = ["Great film", "Great film", "great  FILM", "ＧＲＥＡＴ film", "other", "Great film"]
    seen = [idx.add(t) for t in texts]
    assert [s.first for s in seen] == [True, False, False, False, True, False]
    assert [s.exact_repeat for s in seen] == [False, True, False, False, False, True]
    assert idx.unique == 2
    assert idx.exact_duplicates == 2 and idx.normalized_duplicates == 2 and idx.duplicates == 4
    assert idx.counts[seen[0].key] == 5 and idx.counts[seen[4].key] == 1
    assert idx.groups_repeated() == 1
    brute = {}
    for t in texts:
        brute[normalize(t)] = brute.get(normalize(t), 0) + 1
    assert sorted(idx.counts.values()) == sorted(brute.values())
