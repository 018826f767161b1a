"""Fidelity per text: how far one variant's output for each text is from the reference's, in the task's terms.

Every decision about a variant (sensitivity, the plan search, the sequential rules of ``evidence.sequential``)
rests on values that are one per text and independent of which other texts were evaluated with it, so that a
split can be judged in chunks and the chunks' summaries add up:

- ``classification``: agreement 1 when the argmax is the reference's, else 0;
- ``embedding``: cosine of the text's vector to the reference's, and agreement 1 when the text's nearest
  neighbour among a fixed *FP32 index* (the reference vectors of the evidence texts, the text itself excluded)
  is the same for the candidate's vector as for the reference's. Querying a fixed index makes the value a
  property of the text alone, unlike "both sides quantized" neighbour agreement (compare reports that one
  too), whose per-text values depend on every other text's candidate vector. It is also the deployment case
  of an index embedded once in FP32 and queried by the INT8 model;
- ``token-classification``: agreement = the share of the text's real tokens whose argmax is the reference's
  (1.0 for a text with no tokens).

A non-finite candidate output counts as changed: agreement 0, cosine -1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np

# the names of the kinds with per-text fidelity, declared here once (the task kinds of calibkit.tasks take
# them; a kind's own module declares the names of the others)
CLASSIFICATION = "classification"
EMBEDDING = "embedding"
TOKEN_CLASSIFICATION = "token-classification"

NO_TAG = -1  # token reference: past the text's real tokens


@dataclass(frozen=True, eq=False)
class RowFidelity:
    """Per text, in the order evaluated: ``agreement`` in [0, 1]; ``cosine`` (embeddings, else None);
    ``predictions`` (classification: the argmax, else None)."""

    agreement: np.ndarray
    cosine: np.ndarray | None = None
    predictions: np.ndarray | None = None


class TextScores(Protocol):
    """A variant evaluated on some texts, as the rules read it: per text, in the order evaluated, the predicted
    class (classification), the agreement with the reference in [0, 1] and the cosine to it (embeddings); empty
    where the task has none. ``evaluate.jobs.SensitivityResult`` is one."""

    @property
    def predictions(self) -> tuple[int, ...]: ...
    @property
    def agreement_values(self) -> tuple[float, ...]: ...
    @property
    def cosine_values(self) -> tuple[float, ...]: ...


def _unit(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    ok = cast(np.ndarray, np.isfinite(x).all(axis=1))  # x is 2-D: a reduction over axis 1 is an array
    x = np.where(ok[:, None], x, 0.0)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12), ok


def _nearest(queries: np.ndarray, index: np.ndarray, own: np.ndarray, block: int = 1024) -> np.ndarray:
    """Per query row, the index row with the highest cosine, ``own[i]`` (the query's own row, -1: none)
    excluded; ties go to the lowest index row."""
    out = np.empty(len(queries), dtype=np.int64)
    for s in range(0, len(queries), block):
        sims = queries[s:s + block] @ index.T
        rows = np.arange(len(sims))
        mine = own[s:s + block]
        sims[rows[mine >= 0], mine[mine >= 0]] = -np.inf
        out[s:s + block] = sims.argmax(axis=1)
    return out


def embedding_rows(reference: np.ndarray, candidate: np.ndarray, index: np.ndarray | None = None,
                   index_rows: np.ndarray | None = None) -> RowFidelity:
    """Cosine to the reference and neighbour agreement against the FP32 ``index`` (default: the reference
    vectors themselves). ``index_rows``: each text's own row in ``index`` (-1: not in it), excluded from its
    neighbours; default: row i is text i when the index is the reference, else none."""
    ref_u, ref_ok = _unit(reference)
    cand_u, cand_ok = _unit(candidate)
    n = len(ref_u)
    cos = np.where(cand_ok & ref_ok, np.einsum("ij,ij->i", ref_u, cand_u), -1.0)
    if index is None:
        idx_u, own = ref_u, np.arange(n) if index_rows is None else np.asarray(index_rows, dtype=np.int64)
    else:
        idx_u, _ = _unit(index)
        own = np.full(n, -1, dtype=np.int64) if index_rows is None else np.asarray(index_rows, dtype=np.int64)
    if len(idx_u) - int((own >= 0).any()) < 1:  # no neighbour to name: agreement stands for a finite vector
        return RowFidelity(cand_ok.astype(np.float64), cos)
    same = _nearest(ref_u, idx_u, own) == _nearest(cand_u, idx_u, own)
    return RowFidelity((same & cand_ok).astype(np.float64), cos)


def token_rows(reference_tags: np.ndarray, candidate: np.ndarray) -> RowFidelity:
    """``reference_tags`` [texts, seq]: the reference's argmax per real token, :data:`NO_TAG` past the text;
    ``candidate`` [texts, seq', labels] logits (padded positions ignored)."""
    ref = np.asarray(reference_tags, dtype=np.int64).reshape(len(reference_tags), -1)
    cand = np.asarray(candidate)
    width = min(ref.shape[1], cand.shape[1] if cand.ndim == 3 else 0)
    real = ref[:, :width] != NO_TAG
    if cand.ndim == 3 and width:
        ok = np.isfinite(cand[:, :width]).all(axis=-1)
        same = (cand[:, :width].argmax(axis=-1) == ref[:, :width]) & ok
    else:
        same = np.zeros_like(real)
    counts = real.sum(axis=1)
    extra = (ref[:, width:] != NO_TAG).sum(axis=1)  # reference tokens the candidate has no position for
    agree = np.where(counts + extra > 0, (same & real).sum(axis=1) / np.maximum(counts + extra, 1), 1.0)
    return RowFidelity(agree.astype(np.float64))


def reference_tags(logits: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """A token model's reference for :func:`token_rows`: argmax per real token, :data:`NO_TAG` elsewhere."""
    tags = np.asarray(logits).argmax(axis=-1).astype(np.int64)
    if mask is not None:
        tags = np.where(np.asarray(mask, dtype=bool), tags, NO_TAG)
    return tags


def classification_rows(reference_logits: np.ndarray, candidate: np.ndarray) -> RowFidelity:
    ref = np.asarray(reference_logits, dtype=np.float64)
    cand = np.asarray(candidate, dtype=np.float64)
    pred = cand.argmax(axis=1) if len(cand) else np.zeros(0, dtype=np.int64)
    ok = np.isfinite(cand).all(axis=1) if len(cand) else np.zeros(0, dtype=bool)
    same = (pred == ref.argmax(axis=1)) & ok if len(ref) else np.zeros(0, dtype=bool)
    return RowFidelity(same.astype(np.float64), predictions=pred)

