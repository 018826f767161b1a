"""What a model's outputs mean: the ``Task`` that turns them into predictions, fidelity and task metrics.

compare and tune ask the task, never the model type:
- ``classification`` (a ``[batch, classes]`` logits output): agreement = same argmax; accuracy, macro-F1 where
  the eval set has labels.
- ``embedding`` (``last_hidden_state`` mean-pooled over real tokens, or a pooled ``[batch, dim]`` output such as
  ``sentence_embedding`` / ``pooler_output``): fidelity = cosine of each text's vector to the reference's, and
  retrieval agreement over the eval texts themselves (for each text, do both models rank the same nearest
  neighbours? top-1 agreement and top-k overlap), so no labels are needed.
- ``token-classification`` (``[batch, seq, labels]`` logits): agreement = same argmax per real token; for BIO
  label sets, entity-level F1 of the candidate's entities against the reference's. Where the eval set carries
  gold tags per word (:attr:`EvalSet.word_labels`), :meth:`TokenClassificationTask.gold_metrics` scores each
  model against them: a word's prediction is that of its first token (the usual convention for CoNLL-style
  evaluation), per-word accuracy and entity-level (exact span and type) precision, recall and F1.

:func:`choose_task` picks one from the ONNX outputs (name, rank) and config.json (``id2label``,
``architectures``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import numpy as np

from calibkit.data.evalset import SET_SEPARATOR, EvalSet, describe_labels, label_ids, word_label_ids
from calibkit.data.tokenizer import TextTokenizer
from calibkit.engines.base import BaseRunner
from calibkit.errors import DataError, ModelError
from calibkit.evaluate.metrics import ClassificationMetrics, classification_metrics
from calibkit.evaluate.predict import Predicted, predict_outputs
from calibkit.evidence.intervals import (
    Interval,
    PairedDifference,
    evidence_warnings,
    macro_f1_intervals,
    paired_difference,
    proportion,
)
from calibkit.progress import ProgressCallback
from calibkit.results.runs import Fidelity, GoldResult, GoldScores, Range, finite

RETRIEVAL_K = 10
EMBEDDING_OUTPUTS = ("sentence_embedding", "sentence_embeddings", "embeddings", "text_embeds", "pooled_output")
SEQUENCE_OUTPUTS = ("last_hidden_state", "token_embeddings", "hidden_states")


class TaskKind(str, enum.Enum):
    CLASSIFICATION = "classification"
    EMBEDDING = "embedding"
    TOKEN_CLASSIFICATION = "token-classification"
    REGRESSION = "regression"
    MULTI_LABEL = "multi-label"


# a regression output counts as unchanged within this share of the reference's spread across the eval texts
REGRESSION_TOLERANCE = 0.01


@dataclass(frozen=True, eq=False)
class EngineScore:
    """One engine against the eval set's labels, with Wilson / bootstrap 95 % intervals."""

    metrics: ClassificationMetrics
    accuracy_ci: Interval | None
    macro_f1_ci: Interval | None


@dataclass(frozen=True, eq=False)
class TaskScore:
    """What a task makes of the engines' outputs against its gold labels (:meth:`Task.score`).

    ``engines``: per engine name, class metrics (classification only); ``accuracy_diff`` / ``macro_f1_diff``:
    B − A paired on the same examples; ``extra``: label scores that join the fidelity numbers (regression
    MAE/RMSE, multi-label exact-set accuracy and F1, per engine); ``gold``: token classification against gold
    word tags; ``class_ids``: the labels as class ids where per-layer accuracy sensitivity can use them;
    ``warnings``: what the evidence cannot support."""

    engines: Mapping[str, EngineScore] = field(default_factory=dict)
    accuracy_diff: PairedDifference | None = None
    macro_f1_diff: Interval | None = None
    extra: Mapping[str, float | None] = field(default_factory=dict)
    gold: GoldScores | None = None
    class_ids: np.ndarray | None = None
    warnings: tuple[str, ...] = ()

    @property
    def labelled(self) -> bool:
        return bool(self.engines) or bool(self.extra) or self.gold is not None


class Task(Protocol):
    """What a model's outputs mean. compare and tune only ever ask these questions:

    - ``predict``: the task's output per text (pooled, with the real-token mask of sequence outputs);
    - ``gold``: the eval set's labels in the task's terms, validated (DataError names a label the model does
      not know) — None when the eval set has nothing this task scores; ``width`` (the output's last axis,
      once known) completes the labels of a model without ``id2label``;
    - ``fidelity``: the candidate against the reference in the task's terms;
    - ``predictions``: a class per text where the task has one (None otherwise);
    - ``score``: every engine's outputs against ``gold`` (metrics, paired differences, label scores);
    - ``tunable``: None when tune can search plans for this task, else why not (the message of a UsageError).
    """

    kind: TaskKind
    output_name: str
    labels: tuple[str, ...]
    logits_distribution: bool

    def predict(self, runner: BaseRunner, tokenizer: TextTokenizer, texts: Sequence[str], *, batch_size: int,
                progress: ProgressCallback | None = None, task: str = "inference") -> Predicted: ...

    def fidelity(self, reference: Predicted, candidate: Predicted) -> Fidelity: ...

    def predictions(self, out: Predicted) -> np.ndarray | None: ...

    def metrics(self, out: Predicted, y_true: np.ndarray | None) -> ClassificationMetrics | None: ...

    def gold(self, eval_set: EvalSet, tokenizer: TextTokenizer | None = None, width: int | None = None
             ) -> object | None: ...

    def score(self, outputs: Mapping[str, Predicted], gold: object | None, *, seed: int = 0) -> TaskScore: ...

    @property
    def tunable(self) -> str | None: ...


def _not_tunable(kind: TaskKind) -> str:
    return (f"tune searches plans for classifiers, embedders and token classifiers (on fidelity to FP32); this "
            f"model's outputs make it a {kind.value} model, whose per-text fidelity tune does not measure yet")


def _no_labels(kind: TaskKind, eval_set: EvalSet) -> tuple[str, ...]:
    if eval_set.has_word_labels and kind is not TaskKind.TOKEN_CLASSIFICATION:
        return (f"the eval set's word tags are used for token-classification models, not {kind.value}: "
                "fidelity to A is reported, accuracy is not",)
    if not eval_set.has_labels:
        return ("the eval set has no labels: fidelity to A is reported, accuracy is not",)
    return (f"labels are not used for {kind.value} models yet: fidelity to A is reported, accuracy is not",)


def unscored_warnings(task: Task, eval_set: EvalSet) -> tuple[str, ...]:
    """Why a task scored no labels on this eval set (for the report's warnings)."""
    return _no_labels(task.kind, eval_set)


def _row_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64).reshape(len(a), -1)
    b = np.asarray(b, dtype=np.float64).reshape(len(b), -1)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    denom = na * nb
    dots = np.einsum("ij,ij->i", a, b)
    # two zero vectors are identical; a zero vector against a non-zero one shares no direction
    return np.where(denom > 0, dots / np.where(denom > 0, denom, 1.0), np.where((na == 0) & (nb == 0), 1.0, 0.0))


def _check_same(reference: Predicted, candidate: Predicted) -> None:
    if reference.values.shape != candidate.values.shape:
        raise ModelError(f"the engines' outputs differ in shape: {reference.values.shape} vs "
                         f"{candidate.values.shape}", hint="compare engines built from the same model")


def _per_text(output: str, what: str, runner: BaseRunner, tokenizer: TextTokenizer, texts: Sequence[str],
              batch_size: int, progress: ProgressCallback | None, task: str) -> Predicted:
    """One row of ``what`` per text from ``output`` (refused when the output has a sequence axis)."""
    out = predict_outputs(runner, tokenizer, texts, batch_size=batch_size, output_name=output, progress=progress,
                          task=task)
    if out.values.ndim != 2 and len(texts):
        raise ModelError(f"output {output!r} has shape {out.values.shape[1:]} per text, not [{what}]",
                         hint="pass --task embedding or token-classification for this model")
    return out


def _decision_fidelity(reference: Predicted, candidate: Predicted, decide: Callable[[np.ndarray], np.ndarray],
                       extra: Callable[[np.ndarray, np.ndarray], dict[str, float | None]] | None = None
                       ) -> Fidelity:
    """Agreement: the share of texts whose decision (``decide`` of its output row: a class, a label set) the
    candidate keeps; the cosines of the rows; ``extra`` of the two decisions ([texts, ...] each)."""
    _check_same(reference, candidate)
    if not len(reference.values):
        return Fidelity(0.0, 0.0, 0.0)
    a, b = decide(reference.values), decide(candidate.values)
    same = (a == b).reshape(len(a), -1).all(axis=1)
    cos = _row_cosine(reference.values, candidate.values)
    return Fidelity(float(same.mean()), float(cos.mean()), float(cos.min()), extra(a, b) if extra else {})


@dataclass(frozen=True)
class _PerTextHead:
    """What the heads with one output row per text share (classification, regression, multi-label): the row
    read from ``output_name`` (refused where the output has a sequence axis; ``row`` names what it holds)."""

    output_name: str
    labels: tuple[str, ...] = ()
    kind: TaskKind = TaskKind.CLASSIFICATION
    logits_distribution: bool = True  # outputs are logits of a class distribution (KL divergence applies)
    row: ClassVar[str] = "outputs"

    def predict(self, runner: BaseRunner, tokenizer: TextTokenizer, texts: Sequence[str], *, batch_size: int,
                progress: ProgressCallback | None = None, task: str = "inference") -> Predicted:
        return _per_text(self.output_name, self.row, runner, tokenizer, texts, batch_size, progress, task)

    def gold(self, eval_set: EvalSet, tokenizer: TextTokenizer | None = None, width: int | None = None
             ) -> np.ndarray | None:
        """The eval set's labels as this head's targets (None without labels; see :meth:`_gold`)."""
        return self._gold(eval_set, width) if eval_set.has_labels else None

    def _gold(self, eval_set: EvalSet, width: int | None) -> np.ndarray | None:
        raise NotImplementedError

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.labels))


class _NoClasses:
    """A task without one class per text (embedding, regression, multi-label): no class predictions or metrics."""

    def predictions(self, out: Predicted) -> np.ndarray | None:
        return None

    def metrics(self, out: Predicted, y_true: np.ndarray | None) -> ClassificationMetrics | None:
        return None


@dataclass(frozen=True)
class _ClasslessHead(_NoClasses, _PerTextHead):
    """A per-text head without one class per text (regression, multi-label), not tunable yet."""

    @property
    def tunable(self) -> str | None:
        return _not_tunable(self.kind)

    def score(self, outputs: Mapping[str, Predicted], gold: object | None, *, seed: int = 0) -> TaskScore:
        """A's and B's outputs against the gold targets (:meth:`_against_gold`), each measure named
        ``<engine>_<measure>``."""
        if gold is None:
            return TaskScore()
        y = np.asarray(gold, dtype=self.gold_dtype)
        extra: dict[str, float | None] = {}
        for name in ("A", "B"):
            if name in outputs:
                extra.update({f"{name}_{k}": v for k, v in self._against_gold(outputs[name].values, y).items()})
        return TaskScore(extra=extra)

    gold_dtype: ClassVar[type] = np.float64

    def _against_gold(self, values: np.ndarray, y: np.ndarray) -> dict[str, float | None]:
        raise NotImplementedError


@dataclass(frozen=True)
class ClassificationTask(_PerTextHead):
    kind: TaskKind = TaskKind.CLASSIFICATION
    row: ClassVar[str] = "classes"

    def fidelity(self, reference: Predicted, candidate: Predicted) -> Fidelity:
        return _decision_fidelity(reference, candidate, lambda v: v.argmax(axis=1))

    def predictions(self, out: Predicted) -> np.ndarray | None:
        return out.values.argmax(axis=1) if out.values.size else np.zeros(0, dtype=np.int64)

    def metrics(self, out: Predicted, y_true: np.ndarray | None) -> ClassificationMetrics | None:
        if y_true is None:
            return None
        labels = self.labels or tuple(str(i) for i in range(out.values.shape[1]))
        return classification_metrics(y_true, out.values.argmax(axis=1), labels)

    @property
    def tunable(self) -> str | None:
        return None

    def _gold(self, eval_set: EvalSet, width: int | None) -> np.ndarray | None:
        """Class ids of the eval set's labels (by name or id); without ``id2label``, by id once ``width`` is known."""
        if self.labels:
            return label_ids(eval_set, self.id2label, len(self.labels))
        return label_ids(eval_set, {}, width) if width is not None else None

    def score(self, outputs: Mapping[str, Predicted], gold: object | None, *, seed: int = 0) -> TaskScore:
        if gold is None or not outputs:
            return TaskScore()
        y = np.asarray(gold, dtype=np.int64)
        first = next(iter(outputs.values())).values
        n = len(self.labels) or (int(first.shape[1]) if first.ndim == 2 else 0)
        names = self.labels or tuple(str(i) for i in range(n))
        engines: dict[str, EngineScore] = {}
        preds: dict[str, np.ndarray] = {}
        for name, out in outputs.items():
            pred = preds[name] = out.values.argmax(axis=1)
            f1 = macro_f1_intervals(y, pred, pred, n, seed=seed)[0] if len(y) else None
            engines[name] = EngineScore(classification_metrics(y, pred, names), proportion(pred == y), f1)
        pa, pb = list(preds.values())[:2]
        return TaskScore(
            engines=engines,
            accuracy_diff=paired_difference(pa == y, pb == y, seed=seed),
            macro_f1_diff=macro_f1_intervals(y, pa, pb, n, seed=seed)[2] if len(y) else None,
            class_ids=y,
            warnings=tuple(evidence_warnings(y, names)),
        )


@dataclass(frozen=True)
class RegressionTask(_ClasslessHead):
    """A score head (``problem_type`` regression, or a single output): no argmax, no classes. Fidelity is the
    share of texts whose every output moved by at most :data:`REGRESSION_TOLERANCE` of the reference's spread
    over the eval texts, with the error and the rank correlation to the reference."""

    kind: TaskKind = TaskKind.REGRESSION
    logits_distribution: bool = False
    row: ClassVar[str] = "scores"

    def fidelity(self, reference: Predicted, candidate: Predicted) -> Fidelity:
        _check_same(reference, candidate)
        a = np.asarray(reference.values, dtype=np.float64)
        b = np.asarray(candidate.values, dtype=np.float64)
        if not len(a):
            return Fidelity(0.0, 0.0, 0.0)
        err = np.abs(a - b)
        spread = a.std(axis=0)
        tol = REGRESSION_TOLERANCE * np.where(spread > 0, spread, 1.0)
        within = (err <= tol).all(axis=1)
        cols = [_column_cosine(a[:, j], b[:, j]) for j in range(a.shape[1])]
        extra = {"mean_abs_error": float(err.mean()), "max_abs_error": float(err.max()),
                 "tolerance": float(tol.max()), "spearman": _spearman(a[:, 0], b[:, 0])}
        return Fidelity(float(within.mean()), float(np.mean(cols)), float(np.min(cols)), extra)

    def _gold(self, eval_set: EvalSet, width: int | None) -> np.ndarray | None:
        """The labels as target scores (a label that is not a finite number is refused, naming the example)."""
        return numeric_labels(eval_set)

    def _against_gold(self, values: np.ndarray, y: np.ndarray) -> dict[str, float | None]:
        """Mean absolute and root-mean-square error of the first score against the gold scores."""
        err = np.asarray(values, dtype=np.float64).reshape(len(y), -1)[:, 0] - y
        return {"mae_vs_labels": finite(np.abs(err).mean()) if len(y) else None,
                "rmse_vs_labels": finite(np.sqrt((err ** 2).mean())) if len(y) else None}


@dataclass(frozen=True)
class MultiLabelTask(_ClasslessHead):
    """Independent yes/no per label (``problem_type`` multi_label_classification): a label is on where its
    logit is above 0 (sigmoid above 0.5). Fidelity: the share of texts whose whole label set is unchanged, and
    the share of (text, label) decisions unchanged."""

    kind: TaskKind = TaskKind.MULTI_LABEL
    row: ClassVar[str] = "labels"

    def fidelity(self, reference: Predicted, candidate: Predicted) -> Fidelity:
        return _decision_fidelity(reference, candidate, lambda v: v > 0,
                                  lambda a, b: {"label_decision_agreement": float((a == b).mean()),
                                                "labels_on_per_text": float(a.sum(axis=1).mean())})

    gold_dtype: ClassVar[type] = bool

    def _gold(self, eval_set: EvalSet, width: int | None) -> np.ndarray | None:
        """[examples, labels] bool from the eval set's label sets (unknown labels refused)."""
        return multi_hot(eval_set, self.id2label)

    def _against_gold(self, values: np.ndarray, y: np.ndarray) -> dict[str, float | None]:
        """The decisions (logit > 0) against the gold label sets: exact-set accuracy, micro and macro F1."""
        d = np.asarray(values) > 0
        tp, fp, fn = (d & y).sum(0), (d & ~y).sum(0), (~d & y).sum(0)
        per_label = np.where(2 * tp + fp + fn > 0, 2 * tp / np.maximum(2 * tp + fp + fn, 1), 1.0)
        total = 2 * tp.sum() + fp.sum() + fn.sum()
        return {"exact_set_accuracy": finite((d == y).all(axis=1).mean()) if len(y) else None,
                "micro_f1": float(2 * tp.sum() / total) if total else 1.0,
                "macro_f1": finite(per_label.mean()) if per_label.size else None}


def _column_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine between two engines' scores over the eval texts, centred (Pearson correlation)."""
    a, b = a - a.mean(), b - b.mean()
    d = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / d) if d > 0 else float(np.allclose(a, b))


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra = np.argsort(np.argsort(a, kind="stable"), kind="stable").astype(np.float64)
    rb = np.argsort(np.argsort(b, kind="stable"), kind="stable").astype(np.float64)
    return _column_cosine(ra, rb)


def is_multi_label(config: Mapping[str, object] | None) -> bool:
    return dict(config or {}).get("problem_type") == "multi_label_classification"


def is_regression(config: Mapping[str, object] | None) -> bool:
    """config.json says the head scores rather than classifies (problem_type, or a single label)."""
    cfg = dict(config or {})
    raw = cfg.get("id2label")
    return cfg.get("problem_type") == "regression" or (isinstance(raw, Mapping) and len(raw) == 1)


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
    finite = np.isfinite(x).all(axis=1)
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
class EmbeddingTask(_NoClasses):
    output_name: str
    pooling: str | None = "mean"  # "mean" for a sequence output; None for a pooled [batch, dim] output
    k: int = RETRIEVAL_K
    labels: tuple[str, ...] = ()
    kind: TaskKind = TaskKind.EMBEDDING
    logits_distribution: bool = False  # outputs are logits of a class distribution (KL divergence applies)

    def predict(self, runner: BaseRunner, tokenizer: TextTokenizer, texts: Sequence[str], *, batch_size: int,
                progress: ProgressCallback | None = None, task: str = "inference") -> Predicted:
        out = predict_outputs(runner, tokenizer, texts, batch_size=batch_size, output_name=self.output_name,
                              pooling=self.pooling, progress=progress, task=task)
        return Predicted(out.values.reshape(len(out.values), -1) if len(out.values) else out.values)

    def fidelity(self, reference: Predicted, candidate: Predicted) -> Fidelity:
        _check_same(reference, candidate)
        if not len(reference.values):
            return Fidelity(0.0, 0.0, 0.0)
        with np.errstate(invalid="ignore", over="ignore"):  # non-finite vectors: handled just below
            cos = _row_cosine(reference.values, candidate.values)
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


def bio_entities(tags: Sequence[str]) -> set[tuple[int, int, str]]:
    """(start, end, type) spans of a BIO/IOB2 tag sequence; an I- without its B- starts an entity."""
    out: set[tuple[int, int, str]] = set()
    start, kind = -1, ""
    for i, t in enumerate([*tags, "O"]):
        prefix, _, typ = t.partition("-")
        continues = prefix == "I" and kind == typ and start >= 0
        if start >= 0 and not continues:
            out.add((start, i, kind))
            start, kind = -1, ""
        if prefix in ("B", "I") and not continues:
            start, kind = i, typ
    return out


@dataclass(frozen=True)
class EntityScore:
    """Micro entity-level scores of a candidate's spans against a reference's (exact span and type)."""

    tp: int
    fp: int
    fn: int

    @property
    def f1(self) -> float:
        return 1.0 if self.tp + self.fp + self.fn == 0 else 2 * self.tp / (2 * self.tp + self.fp + self.fn)

    @property
    def precision(self) -> float:
        return 1.0 if self.tp + self.fp == 0 else self.tp / (self.tp + self.fp)

    @property
    def recall(self) -> float:
        return 1.0 if self.tp + self.fn == 0 else self.tp / (self.tp + self.fn)


def entity_scores(reference: Sequence[Sequence[str]], candidate: Sequence[Sequence[str]]) -> EntityScore:
    if len(reference) != len(candidate):
        raise ValueError(f"{len(reference)} reference tag sequences vs {len(candidate)} candidate ones")
    tp = fp = fn = 0
    for r, c in zip(reference, candidate):
        er, ec = bio_entities(r), bio_entities(c)
        tp += len(er & ec)
        fp += len(ec - er)
        fn += len(er - ec)
    return EntityScore(tp, fp, fn)


def entity_f1(reference: Sequence[Sequence[str]], candidate: Sequence[Sequence[str]]) -> float:
    """Micro entity-level F1 of the candidate's spans against the reference's (exact span and type)."""
    return entity_scores(reference, candidate).f1


def first_token_positions(offsets: Sequence[Sequence[tuple[int, int]]],
                          spans: Sequence[Sequence[tuple[int, int]]]) -> list[np.ndarray]:
    """Per text, the token position of each word's first token (int64), -1 where a word has none (past the
    token limit, or characters the tokenizer drops). ``offsets``: per text, each token position's character
    span ((0, 0) for special tokens); ``spans``: per text, each word's character span."""
    if len(offsets) != len(spans):
        raise ValueError(f"token offsets of {len(offsets)} texts for word spans of {len(spans)}")
    out = []
    for offs, words in zip(offsets, spans):
        starts = [(a, j) for j, (a, b) in enumerate(offs) if b > a]  # increasing in a for every tokenizer here
        pos = np.full(len(words), -1, dtype=np.int64)
        k = 0
        for w, (ws, we) in enumerate(words):
            while k < len(starts) and starts[k][0] < ws:
                k += 1
            if k < len(starts) and starts[k][0] < we:
                pos[w] = starts[k][1]
        out.append(pos)
    return out


@dataclass(frozen=True)
class WordGold:
    """Gold tags aligned to token positions: per text, each word's first-token position (-1: not scored) and
    gold label id."""

    positions: tuple[np.ndarray, ...]
    label_ids: tuple[np.ndarray, ...]

    @property
    def words(self) -> int:
        return int(sum(int((p >= 0).sum()) for p in self.positions))

    @property
    def unscored_words(self) -> int:
        return int(sum(int((p < 0).sum()) for p in self.positions))


def align_word_labels(tokenizer: TextTokenizer, eval_set: EvalSet, labels: Sequence[str]) -> WordGold:
    """The eval set's gold word tags as the model's label ids, at their words' first token positions.
    Raises DataError for tags the model does not know."""
    ids = word_label_ids(eval_set, dict(enumerate(labels)), len(labels))
    offsets = tokenizer.token_offsets(eval_set.texts)
    positions = first_token_positions(offsets, [w.spans for w in eval_set.word_labels])
    return WordGold(tuple(positions), tuple(ids))


@dataclass(frozen=True)
class TokenGoldMetrics:
    """One model against gold word tags: per-word accuracy (Wilson 95 % interval over words) and, for BIO
    label sets, entity-level precision, recall and F1 (None otherwise)."""

    token_accuracy: float
    token_accuracy_ci: Interval
    entities: EntityScore | None
    words: int
    unscored_words: int
    gold_entities: int

    def to_dict(self) -> dict[str, object]:
        e = self.entities
        return {"token_accuracy": self.token_accuracy, "token_accuracy_ci": self.token_accuracy_ci.to_dict(),
                "entity_f1": e.f1 if e else None, "entity_precision": e.precision if e else None,
                "entity_recall": e.recall if e else None, "words": self.words,
                "unscored_words": self.unscored_words, "entities": self.gold_entities}


@dataclass(frozen=True)
class TokenClassificationTask:
    output_name: str
    labels: tuple[str, ...] = ()
    kind: TaskKind = TaskKind.TOKEN_CLASSIFICATION
    logits_distribution: bool = True  # outputs are logits of a class distribution (KL divergence applies)

    @property
    def is_bio(self) -> bool:
        return bool(self.labels) and all(x == "O" or x[:2] in ("B-", "I-") for x in self.labels)

    def predict(self, runner: BaseRunner, tokenizer: TextTokenizer, texts: Sequence[str], *, batch_size: int,
                progress: ProgressCallback | None = None, task: str = "inference") -> Predicted:
        out = predict_outputs(runner, tokenizer, texts, batch_size=batch_size, output_name=self.output_name,
                              progress=progress, task=task)
        if out.mask is None and len(texts):
            raise ModelError(f"output {self.output_name!r} has no sequence axis (shape {out.values.shape[1:]})",
                             hint="a token classifier returns logits [batch, sequence, labels]")
        return out

    def fidelity(self, reference: Predicted, candidate: Predicted) -> Fidelity:
        _check_same(reference, candidate)
        if not len(reference.values) or reference.mask is None:
            return Fidelity(0.0, 0.0, 0.0)
        mask = reference.mask
        pa, pb = reference.values.argmax(axis=-1), candidate.values.argmax(axis=-1)
        agreement = float((pa == pb)[mask].mean()) if mask.any() else 1.0
        # per text: cosine over its real tokens' logits
        a = np.where(mask[..., None], reference.values, 0.0)
        b = np.where(mask[..., None], candidate.values, 0.0)
        cos = _row_cosine(a, b)
        extra: dict[str, float] = {}
        if self.is_bio:
            tags = np.asarray(self.labels)
            ref_tags = [list(tags[p[m]]) for p, m in zip(pa, mask)]
            cand_tags = [list(tags[p[m]]) for p, m in zip(pb, mask)]
            extra["entity_f1"] = entity_f1(ref_tags, cand_tags)
        return Fidelity(agreement, float(cos.mean()), float(cos.min()), extra)

    def predictions(self, out: Predicted) -> np.ndarray | None:
        return None

    def metrics(self, out: Predicted, y_true: np.ndarray | None) -> ClassificationMetrics | None:
        return None  # gold tags are per word, not per text: see gold_metrics

    def gold_metrics(self, out: Predicted, gold: WordGold) -> TokenGoldMetrics:
        """``out`` (this task's predictions for the eval texts, in order) against gold word tags: a word's
        prediction is its first token's; words without a token position are not scored."""
        if len(gold.positions) != len(out.values):
            raise ValueError(f"gold tags of {len(gold.positions)} texts for predictions of {len(out.values)}")
        pred = out.values.argmax(axis=-1) if out.values.size else np.zeros((len(gold.positions), 0), np.int64)
        width = pred.shape[1] if pred.ndim == 2 else 0
        same: list[np.ndarray] = []
        gold_tags: list[list[str]] = []
        pred_tags: list[list[str]] = []
        names = np.asarray(self.labels) if self.labels else None
        for i, (pos, ids) in enumerate(zip(gold.positions, gold.label_ids)):
            keep = (pos >= 0) & (pos < width)
            p = pred[i, pos[keep]] if width else np.zeros(0, dtype=np.int64)
            g = ids[keep]
            same.append(p == g)
            if names is not None:
                gold_tags.append(list(names[g]))
                pred_tags.append(list(names[p]))
        hits = np.concatenate(same) if same else np.zeros(0, dtype=bool)
        ci = proportion(hits)
        scores = entity_scores(gold_tags, pred_tags) if self.is_bio else None
        n_gold = sum(len(bio_entities(t)) for t in gold_tags) if self.is_bio else 0
        return TokenGoldMetrics(float(hits.mean()) if hits.size else float("nan"), ci, scores, int(hits.size),
                                gold.unscored_words + (gold.words - int(hits.size)), n_gold)

    @property
    def tunable(self) -> str | None:
        return None  # judged on per-text fidelity (evidence.rowfidelity)

    def gold(self, eval_set: EvalSet, tokenizer: TextTokenizer | None = None, width: int | None = None
             ) -> WordGold | None:
        """The eval set's gold word tags at their words' first token positions (tags the model does not know are
        refused); without ``id2label``, by label id once ``width`` is known."""
        if not eval_set.has_word_labels or tokenizer is None:
            return None
        labels = self.labels or (tuple(str(i) for i in range(width)) if width is not None else None)
        return align_word_labels(tokenizer, eval_set, labels) if labels is not None else None

    def score(self, outputs: Mapping[str, Predicted], gold: object | None, *, seed: int = 0) -> TaskScore:
        """Each engine against the gold word tags (:meth:`gold_metrics`)."""
        if not isinstance(gold, WordGold) or not outputs:
            return TaskScore()
        per = {name: self.gold_metrics(out, gold) for name, out in outputs.items()}
        first = next(iter(per.values()))
        engines = {name: GoldResult(finite(m.token_accuracy), Range.of(m.token_accuracy_ci),
                                    m.entities.f1 if m.entities else None,
                                    m.entities.precision if m.entities else None,
                                    m.entities.recall if m.entities else None, m.words, m.unscored_words,
                                    m.gold_entities)
                   for name, m in per.items()}
        return TaskScore(gold=GoldScores(engines, first.words, first.unscored_words, first.gold_entities))


def choose_task(
    outputs: Mapping[str, int | None],
    config: Mapping[str, object] | None = None,
    kind: TaskKind | str | None = None,
) -> Task:
    """The task for a model with these outputs (name -> rank, None when unknown) and config.json.

    ``kind`` forces a task (``--task``); otherwise: a rank-3 ``logits`` is token classification; a rank-2
    ``logits`` (or a first output with as many columns as ``id2label`` names) is classification, unless
    config.json says regression (``problem_type``, or a single label): then a score head, or
    ``multi_label_classification``: independent labels; a pooled embedding
    output, or ``last_hidden_state`` mean-pooled, is an embedding model.
    """
    cfg = dict(config or {})
    from calibkit.data.modeldir import parse_id2label

    id2label = parse_id2label(cfg.get("id2label"), "config.json")
    labels = tuple(id2label[i] for i in sorted(id2label))
    archs = " ".join(str(a) for a in cfg.get("architectures") or [] if isinstance(a, str))  # type: ignore[union-attr]
    names = list(outputs)
    if not names:
        raise ModelError("the model has no outputs")
    first = names[0]
    wanted = TaskKind(kind) if kind is not None else None

    def embedding() -> EmbeddingTask:
        pooled = next((n for n in names if n in EMBEDDING_OUTPUTS and outputs[n] in (2, None)), None)
        if pooled:
            return EmbeddingTask(pooled, pooling=None)
        seq = next((n for n in names if n in SEQUENCE_OUTPUTS), None)
        if seq:
            return EmbeddingTask(seq, pooling="mean")
        if "pooler_output" in names:
            return EmbeddingTask("pooler_output", pooling=None)
        return EmbeddingTask(first, pooling="mean" if outputs[first] == 3 else None)

    logits = "logits" if "logits" in names else None
    if wanted is TaskKind.EMBEDDING:
        return embedding()
    if wanted is TaskKind.TOKEN_CLASSIFICATION:
        return TokenClassificationTask(logits or first, labels)
    if wanted is TaskKind.CLASSIFICATION:
        return ClassificationTask(logits or first, labels)
    if wanted is TaskKind.REGRESSION or (wanted is None and is_regression(cfg) and outputs.get(logits or first) != 3):
        return RegressionTask(logits or first, labels)
    if wanted is TaskKind.MULTI_LABEL or (wanted is None and is_multi_label(cfg) and outputs.get(logits or first) != 3):
        return MultiLabelTask(logits or first, labels)
    if logits is not None:
        if outputs[logits] == 3 or "TokenClassification" in archs:
            return TokenClassificationTask(logits, labels)
        return ClassificationTask(logits, labels)
    if any(n in EMBEDDING_OUTPUTS or n in SEQUENCE_OUTPUTS or n == "pooler_output" for n in names):
        return embedding()
    if outputs[first] == 3:
        return TokenClassificationTask(first, labels) if "TokenClassification" in archs else embedding()
    if id2label or "SequenceClassification" in archs:
        return ClassificationTask(first, labels)
    return embedding()


def model_outputs(model: object) -> dict[str, int | None]:
    """name -> rank of an ONNX model's graph outputs (None where the file does not say)."""
    out: dict[str, int | None] = {}
    for o in model.graph.output:  # type: ignore[attr-defined]
        tt = o.type.tensor_type
        out[o.name] = len(tt.shape.dim) if tt.HasField("shape") else None
    return out


def numeric_labels(eval_set: EvalSet) -> np.ndarray:
    """The labels as target scores; a label that is not a finite number is refused, naming the example."""
    y = np.empty(len(eval_set), dtype=np.float64)
    for i, lab in enumerate(eval_set.labels):
        try:
            y[i] = float(lab)
        except ValueError:
            raise DataError(f"eval set {eval_set.path.name}: example {i + 1}'s label {lab!r} is not a number",
                            hint="a regression model's labels are its target scores") from None
    bad = np.flatnonzero(~np.isfinite(y))
    if len(bad):
        raise DataError(f"eval set {eval_set.path.name}: example {bad[0] + 1}'s label is not a finite number",
                        hint="a regression model's labels are its target scores")
    return y


def multi_hot(eval_set: EvalSet, id2label: Mapping[int, str]) -> np.ndarray:
    """[examples, labels] bool from label sets (names or ids, joined by SET_SEPARATOR); unknown names refused."""
    by_name = {v: k for k, v in id2label.items()} | {str(k): k for k in id2label}
    y = np.zeros((len(eval_set), len(id2label)), dtype=bool)
    for i, lab in enumerate(eval_set.labels):
        for name in filter(None, lab.split(SET_SEPARATOR)):
            if name not in by_name:
                raise DataError(f"eval set {eval_set.path.name}: example {i + 1} has the label {name!r}, which the "
                                "model does not know",
                                hint=f"the model's labels (config.json id2label) are: {describe_labels(id2label)}")
            y[i, by_name[name]] = True
    return y
