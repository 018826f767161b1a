"""Per-text fidelity values (evidence.rowfidelity): one value per text, independent of the other texts."""

from __future__ import annotations

import numpy as np
import pytest

from calibkit.evidence.rowfidelity import NO_TAG, RowFidelity, reference_tags
from calibkit.tasks import nearest_neighbour_agreement, task_class


def row_fidelity(task: str, reference: np.ndarray, candidate: np.ndarray, **kw: np.ndarray) -> RowFidelity:
    """Per-text fidelity as the task kind named ``task`` computes it."""
    return task_class(task).row_fidelity(reference, candidate, **kw)  # type: ignore[no-any-return]


def test_classification_agreement_and_predictions() -> None:
    ref = np.array([[0.0, 1.0], [2.0, 0.0], [0.0, 1.0]])
    cand = np.array([[0.0, 2.0], [0.0, 1.0], [np.nan, 0.0]])
    f = row_fidelity("classification", ref, cand)
    assert f.agreement.tolist() == [1.0, 0.0, 0.0]  # a non-finite row is a change
    assert f.predictions is not None and f.predictions[:2].tolist() == [1, 1]


def test_embedding_identical_vectors_agree_and_values_do_not_depend_on_the_chunk() -> None:
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(60, 8))
    cand = ref + rng.normal(scale=0.3, size=ref.shape)
    same = row_fidelity("embedding", ref, ref.copy(), index=ref, index_rows=np.arange(60))
    assert same.agreement.tolist() == [1.0] * 60 and np.allclose(same.cosine, 1.0)
    whole = row_fidelity("embedding", ref, cand, index=ref, index_rows=np.arange(60))
    part = row_fidelity("embedding", ref[10:25], cand[10:25], index=ref, index_rows=np.arange(10, 25))
    assert np.array_equal(whole.agreement[10:25], part.agreement)
    assert np.allclose(whole.cosine[10:25], part.cosine)
    assert 0.0 < whole.agreement.mean() < 1.0


def test_embedding_self_is_never_its_own_neighbour() -> None:
    # two clusters; without excluding itself every text would name itself and agree trivially
    ref = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    cand = np.array([[0.0, 1.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])  # text 0 moved to the other cluster
    f = row_fidelity("embedding", ref, cand, index=ref, index_rows=np.arange(4))
    assert f.agreement.tolist() == [0.0, 1.0, 1.0, 1.0]
    assert f.cosine is not None and f.cosine[0] == pytest.approx(0.0)


def test_embedding_nonfinite_vector_is_changed_and_farthest() -> None:
    ref = np.eye(3)
    cand = np.eye(3)
    cand[1, 0] = np.inf
    f = row_fidelity("embedding", ref, cand)
    assert f.agreement[1] == 0.0 and f.cosine is not None and f.cosine[1] == -1.0


def test_embedding_matches_compare_top1_when_only_queries_move() -> None:
    """Against the FP32 index, a candidate equal to the reference everywhere but one text changes only that
    text's value; compare's both-sides top-1 is the mean of the same kind of per-text outcome."""
    rng = np.random.default_rng(1)
    ref = rng.normal(size=(40, 6))
    f = row_fidelity("embedding", ref, ref, index=ref, index_rows=np.arange(40))
    nn = nearest_neighbour_agreement(ref, ref)
    assert nn is not None and f.agreement.mean() == nn.top1 == 1.0


def test_token_agreement_is_the_share_of_real_tokens() -> None:
    logits = np.zeros((2, 4, 3))
    logits[0, :, 1] = 1.0
    logits[1, :2, 2] = 1.0
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=bool)
    tags = reference_tags(logits, mask)
    assert tags[1].tolist() == [2, 2, NO_TAG, NO_TAG]
    cand = logits.copy()
    cand[0, 3] = [5.0, 0.0, 0.0]  # one of four tokens changes
    cand[1, 2:] = [9.0, 0.0, 0.0]  # padding: ignored
    f = row_fidelity("token-classification", tags, cand)
    assert f.agreement.tolist() == [0.75, 1.0]


def test_unknown_task_is_refused() -> None:
    with pytest.raises(ValueError, match="regression"):
        row_fidelity("regression", np.zeros((1, 1)), np.zeros((1, 1)))
