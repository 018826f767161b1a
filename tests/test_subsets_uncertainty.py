"""Seeded stratified subsets (order-independent) and paired intervals, checked against brute force."""

import numpy as np
import pytest

from calibkit.errors import DataError
from calibkit.evidence.intervals import (
    evidence_warnings,
    macro_f1_intervals,
    mcnemar_exact,
    paired_difference,
    wilson,
)
from calibkit.evidence.subsets import stratified_split, stratified_subset


def _sorted_rows(n_pos=248, n_neg=60):
    texts = [f"text {i}" for i in range(n_pos + n_neg)]
    labels = ["pos"] * n_pos + ["neg"] * n_neg  # ordered by label, like the demo's test split
    return texts, labels


def test_subset_is_stratified_random_not_the_first_rows():
    texts, labels = _sorted_rows()
    sub = stratified_subset(texts, labels, 100, seed=0)
    got = [labels[i] for i in sub.indices]
    assert len(sub) == 100 and got.count("neg") == round(100 * 60 / 308)
    assert set(sub.indices) != set(range(100))
    assert stratified_subset(texts, labels, 100, seed=0) == sub
    assert set(stratified_subset(texts, labels, 100, seed=1).indices) != set(sub.indices)
    d = sub.to_dict()
    assert d["count"] == 100 and d["of"] == 308 and sorted(d["indices"]) == sorted(sub.indices)


def test_subset_ignores_file_order():
    texts, labels = _sorted_rows()
    perm = np.random.default_rng(3).permutation(len(texts))
    t2, l2 = [texts[i] for i in perm], [labels[i] for i in perm]
    a = stratified_subset(texts, labels, 77, seed=5)
    b = stratified_subset(t2, l2, 77, seed=5)
    assert a.take(texts) == b.take(t2)  # same rows, same canonical order
    assert a.content_sha256 == b.content_sha256
    s1, h1 = stratified_split(texts, labels, 0.3, seed=2)
    s2, h2 = stratified_split(t2, l2, 0.3, seed=2)
    assert h1.take(texts) == h2.take(t2) and s1.take(texts) == s2.take(t2)
    assert not set(s1.indices) & set(h1.indices) and len(s1) + len(h1) == len(texts)
    assert [labels[i] for i in h1.indices].count("neg") == 18


def test_subset_rejects_bad_sizes():
    with pytest.raises(DataError):
        stratified_subset(["a"], ["x"], 0)
    with pytest.raises(DataError):
        stratified_split(["a"], ["x"], 1.0)
    assert len(stratified_subset(["a", "b"], ["x", "y"], None)) == 2


def test_wilson_matches_formula_and_bounds():
    iv = wilson(0, 10)
    assert iv.low == 0.0 and 0.2 < iv.high < 0.35
    iv = wilson(90, 100)
    assert iv.low < 0.9 < iv.high and iv.high < 1.0
    assert wilson(5, 0).low == 0.0


def test_mcnemar_exact_brute_force():
    from math import comb

    b, c = 3, 12
    m = b + c
    brute = min(1.0, 2 * sum(comb(m, i) for i in range(min(b, c) + 1)) / 2 ** m)
    assert mcnemar_exact(b, c) == pytest.approx(brute)
    assert mcnemar_exact(0, 0) == 1.0


def test_paired_difference_significance():
    n = 1000
    a = np.ones(n, dtype=bool)
    b = a.copy()
    b[:4] = False  # 4 of 1000 flips the wrong way, 2 the right way: noise
    a[10:12] = False
    d = paired_difference(a, b)
    assert d.interval.estimate == pytest.approx(-0.002)
    assert d.interval.covers_zero and not d.significant and d.verdict == "not significant"
    assert d.examples_to_settle() is not None and d.examples_to_settle() > n
    b[:60] = False  # 60 losses: real
    d = paired_difference(a, b)
    assert d.significant and d.verdict == "loss" and d.interval.high < 0
    assert paired_difference(a, a).interval.estimate == 0.0


def test_macro_f1_intervals_contain_the_estimate():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 400)
    pa = np.where(rng.random(400) < 0.85, y, 1 - y)
    pb = np.where(rng.random(400) < 0.97, pa, 1 - pa)
    from sklearn.metrics import f1_score

    fa, fb, diff = macro_f1_intervals(y, pa, pb, 2)
    assert fa.estimate == pytest.approx(f1_score(y, pa, average="macro"))
    assert fb.estimate == pytest.approx(f1_score(y, pb, average="macro"))
    assert fa.low <= fa.estimate <= fa.high and diff.low <= diff.estimate <= diff.high


def test_evidence_warnings():
    assert evidence_warnings(np.array([0] * 300 + [1] * 300), ("neg", "pos")) == ()
    w = evidence_warnings(np.array([1]), ("neg", "pos"))
    assert any("only 1 examples" in x for x in w) and any("one class" in x for x in w)
    w = evidence_warnings(np.array([0] * 10 + [1] * 400), ("neg", "pos"))
    assert any("'neg' has only 10" in x for x in w)
