"""Stratification, allocation, priority sampling and representativeness statistics."""

from __future__ import annotations

import random

import numpy as np
import pytest

from calibkit.data.sampling import (
    PSI_EDGES,
    Candidate,
    PriorityPool,
    allocate,
    cluster_topics,
    estimate_tokens,
    histogram,
    length_bucket,
    length_psi,
    priority,
    verdict,
    weighted_ks,
)


def test_estimate_tokens_and_buckets():
    assert estimate_tokens("Hello, world!") == 4 + 2
    assert estimate_tokens("internationalization") == 3 + 2  # one extra piece per 6 letters beyond one a word
    assert estimate_tokens("a b c d") == 4 + 2
    assert [length_bucket(n) for n in (0, 15, 16, 511, 512, 5000)] == [0, 0, 1, 5, 6, 6]


def test_priority_reproducible_and_seeded():
    assert priority(123, 0) == priority(123, 0)
    assert priority(123, 0) != priority(123, 1)
    vals = np.array([priority(k, 7) for k in range(5000)])
    assert 0 <= vals.min() and vals.max() < 1 and abs(vals.mean() - 0.5) < 0.02


def test_pool_keeps_lowest_priorities_order_independent():
    cands = [Candidate(priority(k, 0), k, f"t{k}", None, 5, k) for k in range(300)]
    a, b = PriorityPool(20), PriorityPool(20)
    for c in cands:
        a.offer("s", c)
    for c in reversed(cands):
        b.offer("s", c)
    brute = sorted(cands, key=lambda c: c.priority)[:20]
    assert a.members("s") == b.members("s") == brute
    assert a.population["s"] == 300 and a.weight("s") == pytest.approx(15.0)


def test_allocate_proportional_with_minimum():
    pop = {"big": 900.0, "mid": 95.0, "rare": 5.0}
    avail = {"big": 1000, "mid": 1000, "rare": 3}
    a = allocate(pop, avail, 100)
    assert sum(a.values()) == 100 and a["rare"] >= 1
    assert a["big"] in (89, 90) and a["mid"] in (9, 10)
    # capped by availability, remainder goes elsewhere
    a = allocate({"x": 1.0, "y": 1.0}, {"x": 2, "y": 100}, 50)
    assert a == {"x": 2, "y": 48}
    # more strata than texts: the largest get one each
    a = allocate({"a": 1.0, "b": 5.0, "c": 3.0}, {"a": 1, "b": 1, "c": 1}, 2)
    assert a == {"b": 1, "c": 1}


def test_psi_and_ks_against_brute_force():
    rng = np.random.default_rng(0)
    pop = rng.integers(2, 600, size=2000)
    w = rng.uniform(0.5, 2.0, size=2000)
    smp = rng.integers(2, 300, size=200)
    p, q = histogram(pop, w), histogram(smp)
    # brute force histogram
    bp = np.zeros(len(PSI_EDGES))
    for x, wi in zip(pop, w):
        bp[max(i for i, e in enumerate(PSI_EDGES) if x >= e)] += wi
    np.testing.assert_allclose(p, bp / bp.sum())
    pe, qe = np.maximum(p, 1e-4), np.maximum(q, 1e-4)
    assert length_psi(p, q) == pytest.approx(float(sum((b - a) * np.log(b / a) for a, b in zip(pe, qe))))
    grid = np.arange(0, 700)
    fp = np.array([w[pop <= g].sum() / w.sum() for g in grid])
    fs = np.array([(smp <= g).mean() for g in grid])
    assert weighted_ks(pop.astype(float), w, smp.astype(float)) == pytest.approx(np.abs(fp - fs).max())
    assert length_psi(p, p) == pytest.approx(0.0)
    assert verdict(0.05) == "representative" and verdict(0.2) == "slightly shifted"
    assert verdict(0.5) == "not representative"


def test_cluster_topics_separates_topics_and_is_reproducible():
    rng = random.Random(0)
    vocab = [["battery", "charger", "cable"], ["senate", "election", "budget"], ["goal", "match", "league"]]
    texts, truth = [], []
    for i in range(240):
        t = i % 3
        texts.append(" ".join(rng.choice(vocab[t]) for _ in range(6)))
        truth.append(t)
    a = cluster_topics(texts, 3, seed=0)
    assert np.array_equal(a, cluster_topics(texts, 3, seed=0))
    # each true topic maps to one cluster
    for t in range(3):
        assert len({int(a[i]) for i in range(240) if truth[i] == t}) == 1
    assert len(set(a.tolist())) == 3
    assert cluster_topics(texts[:10], 3, seed=0).tolist() == [0] * 10  # too few texts: one cluster
