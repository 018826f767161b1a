"""Nearest-neighbour agreement among evidence texts: exact, chunked in bounded memory, never NaN."""

from __future__ import annotations

import math
import time
import tracemalloc

import numpy as np
import pytest

from calibkit.evaluate.predict import Predicted
from calibkit.tasks import EmbeddingTask, nearest_neighbour_agreement


def _brute(ref: np.ndarray, cand: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    def nbrs(x: np.ndarray) -> np.ndarray:
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        s = x @ x.T
        np.fill_diagonal(s, -np.inf)
        return np.argsort(-s, axis=1, kind="stable")[:, :k]

    a, b = nbrs(ref), nbrs(cand)
    overlap = np.mean([len(set(x) & set(y)) / k for x, y in zip(a.tolist(), b.tolist())])
    return a[:, 0] == b[:, 0], float(overlap)


def test_matches_brute_force_whatever_the_block_size() -> None:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((300, 16))
    cand = ref + 0.4 * rng.standard_normal(ref.shape)
    same, overlap = _brute(ref, cand, 10)
    results = [nearest_neighbour_agreement(ref, cand, 10, memory_bytes=m) for m in (1, 300 * 32 * 7, 1 << 30)]
    for r in results:
        assert r is not None and r.n == 300 and r.k == 10 and r.nonfinite == 0
        np.testing.assert_array_equal(r.same_top1, same)
        assert r.top1 == pytest.approx(same.mean()) and r.overlap_at_k == pytest.approx(overlap)
    assert 0.0 < results[0].top1 < 1.0


def test_thousands_of_texts_in_bounded_memory() -> None:
    rng = np.random.default_rng(1)
    n, dim = 3000, 64
    ref = rng.standard_normal((n, dim))
    cand = ref + 0.05 * rng.standard_normal((n, dim))
    budget = 8 << 20
    tracemalloc.start()
    t = time.perf_counter()
    r = nearest_neighbour_agreement(ref, cand, 10, memory_bytes=budget)
    took = time.perf_counter() - t
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert r is not None and r.n == n and 0.5 < r.top1 <= 1.0
    data = 2 * n * dim * 8  # the two unit-row copies
    assert peak < data + 2 * budget, f"peak {peak / 2**20:.1f} MiB"
    assert took < 20.0
    # the whole n x n similarity matrix alone would be 72 MB: far above what was held
    assert n * n * 8 > 4 * budget


def test_not_applicable_and_never_nan() -> None:
    one = np.ones((1, 4))
    assert nearest_neighbour_agreement(one, one) is None
    rng = np.random.default_rng(2)
    ref = rng.standard_normal((50, 8))
    cand = ref.copy()
    cand[3] = np.nan
    cand[7, 0] = np.inf
    r = nearest_neighbour_agreement(ref, cand, 5)
    assert r is not None and r.nonfinite == 2
    assert not r.same_top1[3] and not r.same_top1[7]
    assert math.isfinite(r.top1) and math.isfinite(r.overlap_at_k) and r.top1 < 1.0
    f = EmbeddingTask("sentence_embedding", pooling=None).fidelity(Predicted(ref), Predicted(cand))
    values = [f.agreement, f.cosine_mean, f.cosine_min, *f.extra.values()]
    assert all(math.isfinite(v) for v in values) and f.extra["nonfinite_texts"] == 2.0 and f.cosine_min == -1.0
    single = EmbeddingTask("sentence_embedding", pooling=None).fidelity(Predicted(one), Predicted(one * 2))
    assert "retrieval_top1_agreement" not in single.extra and single.agreement == 1.0
    with pytest.raises(ValueError, match="against"):
        nearest_neighbour_agreement(ref, cand[:10])
