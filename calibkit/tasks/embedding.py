"""The ``embedding`` kind: a vector per text (``last_hidden_state`` mean-pooled over real tokens, or a pooled
``[batch, dim]`` output such as ``sentence_embedding`` / ``pooler_output``). Fidelity is the cosine of each
text's vector to the reference's, and retrieval agreement over the eval texts themselves (for each text, do both
models rank the same nearest neighbours? top-1 agreement and top-k overlap), so no labels are needed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, cast

import numpy as np

from calibkit.data.evalset import EvalSet
from calibkit.data.tokenizer import TextTokenizer
from calibkit.engines.base import BaseRunner
from calibkit.evaluate.predict import Predicted, predict_outputs
from calibkit.evidence.rowfidelity import EMBEDDING, RowFidelity, embedding_rows
from calibkit.progress import ProgressCallback
from calibkit.results.runs import Fidelity
from calibkit.tasks.base import (
    EMBEDDING_OUTPUTS,
    SEQUENCE_OUTPUTS,
    ModelFacts,
    NoClasses,
    Task,
    TaskScore,
    check_same,
    row_cosine,
    share,
)

RETRIEVAL_K = 10


NEIGHBOUR_MEMORY_BYTES = 64 << 20  # similarity rows held at once by nearest_neighbour_agreement


@dataclass(frozen=True)
class NeighbourAgreement:
    """Nearest-neighbour agreement among ``n`` evidence texts: each text queries the others by cosine under both
    models. ``same_top1``: per text, whether its nearest neighbour is the same (a text whose candidate vector is
    not finite counts as changed, and is nobody's neighbour there); ``top1``: their mean; ``overlap_at_k``: the
    mean share of the ``k`` nearest neighbours both models name. Per-text values depend on the whole set of
    texts (the neighbours are among them), so they are not independent draws: judge them on a fixed set."""

    top1: float
    overlap_at_k: float
    k: int
    n: int
    same_top1: np.ndarray
    nonfinite: int = 0


def _unit_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows scaled to length 1 (zero rows stay zero) and which rows were finite (non-finite rows become zero)."""
    x = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    finite: np.ndarray = np.asarray(np.isfinite(x).all(axis=1))
    if not finite.all():
        x = np.where(finite[:, None], x, 0.0)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12), finite


def _top_k(sims: np.ndarray, k: int) -> np.ndarray:
    part = np.argpartition(-sims, k - 1, axis=1)[:, :k]
    # ties broken by index, so the result does not depend on the block size
    vals = np.take_along_axis(sims, part, axis=1)
    order = np.lexsort((part, -vals), axis=1)
    return np.take_along_axis(part, order, axis=1)


def nearest_neighbour_agreement(reference: np.ndarray, candidate: np.ndarray, k: int = RETRIEVAL_K, *,
                                memory_bytes: int = NEIGHBOUR_MEMORY_BYTES) -> NeighbourAgreement | None:
    """Top-1 agreement and top-``k`` overlap of each text's neighbours among the others (cosine), computed in
    blocks of rows so memory stays about ``memory_bytes`` whatever the number of texts (a few thousand texts
    take a few hundred milliseconds). None when it does not apply (fewer than two texts). Never NaN."""
    n = len(reference)
    if len(candidate) != n:
        raise ValueError(f"{n} reference vectors against {len(candidate)} candidate ones")
    k = min(k, n - 1)
    if k < 1:
        return None
    ra, ok_a = _unit_rows(reference)
    cb, ok_b = _unit_rows(candidate)
    # two similarity blocks, their top-k and the argpartition copies: about 4 arrays of block x n float64
    block = int(max(1, min(4096, memory_bytes // max(1, 4 * 8 * n))))
    same = np.zeros(n, dtype=bool)
    overlap = 0.0
    for start in range(0, n, block):
        rows = np.arange(start, min(n, start + block))
        tops = []
        for x, ok in ((ra, ok_a), (cb, ok_b)):
            s = x[rows] @ x.T
            s[:, ~ok] = -np.inf  # a text without a finite vector is nobody's neighbour
            s[np.arange(len(rows)), rows] = -np.inf  # a text is not its own neighbour
            tops.append(_top_k(s, k))
        a, b = tops
        same[rows] = a[:, 0] == b[:, 0]
        shared = (a[:, :, None] == b[:, None, :]).any(axis=2).sum(axis=1) / k
        bad = ~(ok_a[rows] & ok_b[rows])
        same[rows[bad]] = False
        overlap += float(np.where(bad, 0.0, shared).sum())
    nonfinite = int((~(ok_a & ok_b)).sum())
    return NeighbourAgreement(float(same.mean()), overlap / n, k, n, same, nonfinite)


def retrieval_agreement(reference: np.ndarray, candidate: np.ndarray, k: int = RETRIEVAL_K) -> tuple[float, float, int]:
    """(top-1 agreement, mean top-k overlap, k): each text queries the others by cosine, under both models
    (:func:`nearest_neighbour_agreement`; (1.0, 1.0, 0) for fewer than two texts, where nothing can change)."""
    nn = nearest_neighbour_agreement(reference, candidate, k)
    if nn is None:
        return 1.0, 1.0, 0
    return nn.top1, nn.overlap_at_k, nn.k


@dataclass(frozen=True)
class EmbeddingTask(NoClasses):
    output_name: str
    pooling: str | None = "mean"  # "mean" for a sequence output; None for a pooled [batch, dim] output
    k: int = RETRIEVAL_K
    labels: tuple[str, ...] = ()
    logits_distribution: bool = False  # outputs are logits of a class distribution (KL divergence applies)
    kind: ClassVar[str] = EMBEDDING
    per_text: ClassVar[bool] = True
    pools: ClassVar[bool] = True
    neighbour_index: ClassVar[bool] = True
    margin_scale: ClassVar[str | None] = "quantile"
    cosine_target: ClassVar[bool] = True
    fidelity_name: ClassVar[str] = "nearest-neighbour agreement"

    @classmethod
    def detect(cls, model: ModelFacts) -> bool:
        """No ``logits`` but an output named as an encoder's (pooled, per token or the pooler's), of a head
        config.json does not say scores; the registry's fallback too."""
        return not model.scores and model.logits is None and model.has_encoder_outputs

    @classmethod
    def for_model(cls, model: ModelFacts) -> Task:
        """A pooled embedding output as it is, else a sequence output mean-pooled over real tokens, else the
        pooler's output, else the first output (mean-pooled where it has a sequence axis)."""
        names, outputs = list(model.outputs), model.outputs
        pooled = next((n for n in names if n in EMBEDDING_OUTPUTS and outputs[n] in (2, None)), None)
        seq = next((n for n in names if n in SEQUENCE_OUTPUTS), None)
        if pooled:
            task = cls(pooled, pooling=None)
        elif seq:
            task = cls(seq, pooling="mean")
        elif "pooler_output" in names:
            task = cls("pooler_output", pooling=None)
        else:
            task = cls(model.first, pooling="mean" if outputs[model.first] == 3 else None)
        return cast(Task, task)

    @classmethod
    def row_fidelity(cls, reference: np.ndarray, candidate: np.ndarray, *, index: np.ndarray | None = None,
                     index_rows: np.ndarray | None = None) -> RowFidelity:
        return embedding_rows(reference, candidate, index, index_rows)

    @classmethod
    def row_reference(cls, values: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        return values.reshape(len(values), -1).astype(np.float32)

    @classmethod
    def flip_margins(cls, reference: np.ndarray) -> np.ndarray | None:
        """Per text, the cosine gap between its two nearest neighbours among the others (at least three texts)."""
        if len(reference) < 3:
            return None
        u = reference.reshape(len(reference), -1)
        u = u / np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1e-12)
        out = np.empty(len(u))
        for s in range(0, len(u), 1024):
            sims = u[s:s + 1024] @ u.T
            sims[np.arange(len(sims)), np.arange(s, s + len(sims))] = -np.inf
            two = np.partition(sims, -2, axis=1)[:, -2:]
            out[s:s + 1024] = two[:, 1] - two[:, 0]
        return out

    @classmethod
    def variant_error(cls, reference: np.ndarray, outputs: np.ndarray) -> tuple[float, float]:
        if not len(reference):
            return float("nan"), float("nan")
        with np.errstate(over="ignore", invalid="ignore"):
            mse = float(np.mean((reference.reshape(len(reference), -1) - outputs.reshape(len(outputs), -1)) ** 2))
        return mse, float("nan")

    @classmethod
    def fidelity_basis(cls, labelled: bool) -> str:
        return f"{cls.fidelity_name} and cosine to the reference"

    @classmethod
    def terminal_fidelity(cls, fidelity: Fidelity, texts: int, interval: str = "") -> str:
        return (f"nearest-neighbour agreement {share(fidelity.agreement)} %{interval} (top-1 in an FP32 index of "
                f"the {texts} eval texts: it depends on the index size)")

    @classmethod
    def terminal_traffic(cls, fidelity: Fidelity, texts: int, interval: str = "") -> str | None:
        return (f"nearest-neighbour agreement {share(fidelity.agreement)} %{interval} (top-1 in an FP32 index of "
                f"the {texts} traffic texts: it depends on the index size), top-10 overlap "
                f"{share(fidelity.extra.get('retrieval_overlap_at_k'))} %")

    @classmethod
    def default_targets(cls) -> tuple[float, float | None]:
        from calibkit.evaluate.tune_config import DEFAULT_EMBEDDING_AGREEMENT, DEFAULT_EMBEDDING_COSINE

        return DEFAULT_EMBEDDING_AGREEMENT, DEFAULT_EMBEDDING_COSINE

    def predict(self, runner: BaseRunner, tokenizer: TextTokenizer, texts: Sequence[str], *, batch_size: int,
                progress: ProgressCallback | None = None, task: str = "inference") -> Predicted:
        out = predict_outputs(runner, tokenizer, texts, batch_size=batch_size, output_name=self.output_name,
                              pooling=self.pooling, progress=progress, task=task)
        return Predicted(out.values.reshape(len(out.values), -1) if len(out.values) else out.values)

    def fidelity(self, reference: Predicted, candidate: Predicted) -> Fidelity:
        check_same(reference, candidate)
        if not len(reference.values):
            return Fidelity(0.0, 0.0, 0.0)
        with np.errstate(invalid="ignore", over="ignore"):  # non-finite vectors: handled just below
            cos = row_cosine(reference.values, candidate.values)
        finite = (np.isfinite(cos) & np.isfinite(reference.values.reshape(len(cos), -1)).all(axis=1)
                  & np.isfinite(candidate.values.reshape(len(cos), -1)).all(axis=1))
        cos = np.where(finite, cos, -1.0)  # a non-finite candidate vector is as far from the reference as can be
        nn = nearest_neighbour_agreement(reference.values, candidate.values, self.k)
        extra: dict[str, float] = {}
        if not finite.all():
            extra["nonfinite_texts"] = float((~finite).sum())
        if nn is None:  # one text: no neighbours to compare; agreement stands for the vector being finite
            return Fidelity(float(finite.mean()), float(cos.mean()), float(cos.min()), extra)
        extra.update({"retrieval_top1_agreement": nn.top1, "retrieval_overlap_at_k": nn.overlap_at_k,
                      "k": float(nn.k)})
        return Fidelity(nn.top1, float(cos.mean()), float(cos.min()), extra)

    @property
    def tunable(self) -> str | None:
        return None  # judged on per-text fidelity (evidence.rowfidelity)

    def gold(self, eval_set: EvalSet, tokenizer: TextTokenizer | None = None, width: int | None = None) -> None:
        return None  # an embedding's fidelity needs no labels; none are scored

    def score(self, outputs: Mapping[str, Predicted], gold: object | None, *, seed: int = 0) -> TaskScore:
        return TaskScore()
