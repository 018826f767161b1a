"""What every task kind shares: the ``Task`` protocol compare and tune ask, the scores a task makes of labels,
the facts of a model that ``detect`` reads, and the helpers of the heads with one output row per text.

A task kind is a class (one module each in this package, listed in :mod:`calibkit.tasks.registry`): its
instances turn a model's outputs into predictions, gold labels, scores and fidelity (compare's questions); its
class attributes and class methods say what the kind means where only its name travels (tune's evidence, the
sensitivity work units, the ledger): whether it has one fidelity value per text, how that value is computed,
what the reference row of a text is, which targets apply and what tune claims.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, cast

import numpy as np

from calibkit.data.evalset import EvalSet
from calibkit.data.tokenizer import TextTokenizer
from calibkit.engines.base import BaseRunner
from calibkit.errors import ModelError
from calibkit.evaluate.metrics import ClassificationMetrics
from calibkit.evaluate.predict import Predicted, predict_outputs
from calibkit.evidence.intervals import Interval, PairedDifference
from calibkit.evidence.rowfidelity import RowFidelity
from calibkit.progress import ProgressCallback
from calibkit.results.runs import Fidelity, GoldScores

EMBEDDING_OUTPUTS = ("sentence_embedding", "sentence_embeddings", "embeddings", "text_embeds", "pooled_output")
SEQUENCE_OUTPUTS = ("last_hidden_state", "token_embeddings", "hidden_states")


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



@dataclass(frozen=True)
class ModelFacts:
    """What ``detect`` and ``for_model`` read of a model: its ONNX outputs (name -> rank, None when unknown, in
    graph order), its config.json, the labels of its ``id2label`` and its ``architectures`` joined by spaces."""

    outputs: Mapping[str, int | None]
    config: Mapping[str, object]
    labels: tuple[str, ...] = ()
    architectures: str = ""

    @property
    def first(self) -> str:
        return next(iter(self.outputs))

    @property
    def logits(self) -> str | None:
        return "logits" if "logits" in self.outputs else None

    @property
    def head(self) -> str:
        """The output a head reads: ``logits`` where there is one, else the first."""
        return self.logits or self.first

    def rank(self, name: str | None) -> int | None:
        return self.outputs.get(name) if name is not None else None

    @property
    def is_regression(self) -> bool:
        """config.json says the head scores rather than classifies (``problem_type``, or a single label)."""
        return is_regression(self.config)

    @property
    def is_multi_label(self) -> bool:
        return is_multi_label(self.config)

    @property
    def scores(self) -> bool:
        """config.json says the head scores or takes independent labels, and its output has no sequence axis:
        then it has no argmax to read, whatever its outputs are named."""
        return (self.is_regression or self.is_multi_label) and self.rank(self.head) != 3

    @property
    def has_encoder_outputs(self) -> bool:
        """An output named as an encoder's (pooled, per token, or the pooler's)."""
        return any(n in EMBEDDING_OUTPUTS or n in SEQUENCE_OUTPUTS or n == "pooler_output" for n in self.outputs)


def is_multi_label(config: Mapping[str, object] | None) -> bool:
    return dict(config or {}).get("problem_type") == "multi_label_classification"


def is_regression(config: Mapping[str, object] | None) -> bool:
    """config.json says the head scores rather than classifies (problem_type, or a single label)."""
    cfg = dict(config or {})
    raw = cfg.get("id2label")
    return cfg.get("problem_type") == "regression" or (isinstance(raw, Mapping) and len(raw) == 1)


def share(v: float | None) -> str:
    """A share as the terminal prints it: percent with two decimals, "n/a" for none."""
    return "n/a" if v is None else f"{v * 100:.2f}"


def number(v: float | None, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)


class KindTraits:
    """What a task kind means where only its name travels (class attributes and class methods; the defaults
    are those of a kind without per-text fidelity, which compare measures and tune refuses)."""

    kind: ClassVar[str]
    # one fidelity value per text (evidence.rowfidelity): what tune, sensitivity and the served check rest on
    per_text: ClassVar[bool] = False
    # one class per text, scored against labels as class ids (accuracy, flips, macro-F1)
    classifies: ClassVar[bool] = False
    # the work units pass the task's pooling to the runner (sequence outputs pooled per text)
    pools: ClassVar[bool] = False
    # per-text fidelity looks each text's neighbours up in an index of FP32's reference rows
    neighbour_index: ClassVar[bool] = False
    # a text's agreement is 0 or 1 (a share of its tokens where False)
    binary_agreement: ClassVar[bool] = True
    # --min-cosine applies (the fidelity has a cosine per text)
    cosine_target: ClassVar[bool] = False
    # what per-layer sensitivity is judged by, in words
    fidelity_name: ClassVar[str] = "agreement"
    # config.json's problem_type for this kind (transformers reads it too); ``problem_type_stated``: the kind is
    # read only where config.json states it (export writes it into the folder), else it is what a head without one
    # is read as, and export writes it only over another kind's
    problem_type: ClassVar[str | None] = None
    problem_type_stated: ClassVar[bool] = False
    # an argmax per text that INT8 can flip (compare's terminal prints agreement and flips; else the output error)
    flips: ClassVar[bool] = True
    # tune's strata by flip risk: "absolute" margins (probabilities the risk design's fixed thresholds apply
    # to), "quantile" ones (strata cut at their quantiles), or None (no margin: every text is evaluated)
    margin_scale: ClassVar[str | None] = None
    # the eval set's labels are label sets / its gold word tags are this kind's labels
    label_sets: ClassVar[bool] = False
    word_tags: ClassVar[bool] = False

    @classmethod
    def detect(cls, model: ModelFacts) -> bool:
        """Whether a model with these outputs and config.json is of this kind (tried in registry order; the
        built-in kinds' rules exclude each other, so a kind registered later is tried where none of them
        applies)."""
        return False

    @classmethod
    def for_model(cls, model: ModelFacts) -> Task:
        """The task of this kind for the model (its output chosen), whether detected or asked for."""
        return cast(Task, cls(model.head, model.labels))  # type: ignore[call-arg]

    @classmethod
    def row_fidelity(cls, reference: np.ndarray, candidate: np.ndarray, *, index: np.ndarray | None = None,
                     index_rows: np.ndarray | None = None) -> RowFidelity:
        """Per-text fidelity of ``candidate`` (a variant's outputs) to ``reference`` (:meth:`row_reference`)."""
        raise ValueError(f"no per-text fidelity for task {cls.kind!r}")

    @classmethod
    def row_reference(cls, values: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        """FP32's reference row per text for :meth:`row_fidelity`, from its predicted outputs."""
        return values

    @classmethod
    def flip_margins(cls, reference: np.ndarray) -> np.ndarray | None:
        """FP32's margin per row of its reference (float64; larger: further from changing), None without one."""
        return None

    @classmethod
    def variant_error(cls, reference: np.ndarray, outputs: np.ndarray) -> tuple[float, float]:
        """(mean squared error, mean KL divergence) of a variant's outputs to the reference; NaN where the kind
        has none."""
        return float("nan"), float("nan")

    @classmethod
    def fidelity_basis(cls, labelled: bool) -> str:
        """What sensitivity judges layers by, in words."""
        return cls.fidelity_name

    @classmethod
    def terminal_fidelity(cls, fidelity: Fidelity, texts: int, interval: str = "") -> str:
        """compare's terminal words for B's fidelity to A in the kind's terms, measured on ``texts`` eval texts
        (``interval``: the agreement's interval as printed, or why it has none; "" where the kind has no words)."""
        return ""

    @classmethod
    def terminal_traffic(cls, fidelity: Fidelity, texts: int, interval: str = "") -> str | None:
        """compare's terminal words for B's fidelity to A on ``texts`` traffic texts (None: the agreement and
        flips)."""
        return None

    @classmethod
    def default_targets(cls) -> tuple[float, float | None]:
        """tune's fidelity targets (min agreement %, min mean cosine) when the request names none."""
        from calibkit.evaluate.tune_config import DEFAULT_UNLABELED_AGREEMENT

        return DEFAULT_UNLABELED_AGREEMENT, None

    @classmethod
    def labels_used(cls, fidelity_only: bool) -> str:
        """What served as labels, as tune's result says it."""
        return f"none used: a {cls.kind} model is judged on fidelity to FP32"

    @classmethod
    def unlabelled_why(cls) -> str:
        """Why tune judges on fidelity alone, as its warning says it."""
        return f"is not scored against labels for a {cls.kind} model"


class Task(Protocol):
    """What a model's outputs mean. compare and tune only ever ask these questions:

    - ``predict``: the task's output per text (pooled, with the real-token mask of sequence outputs);
    - ``gold``: the eval set's labels in the task's terms, validated (DataError names a label the model does
      not know) — None when the eval set has nothing this task scores; ``width`` (the output's last axis,
      once known) completes the labels of a model without ``id2label``;
    - ``fidelity``: the candidate against the reference in the task's terms;
    - ``predictions``: a class per text where the task has one (None otherwise);
    - ``score``: every engine's outputs against ``gold`` (metrics, paired differences, label scores);
    - ``tunable``: None when tune can search plans for this task, else why not (the message of a UsageError);

    and what its kind means where only its name travels (:class:`KindTraits`, whose class attributes and
    class methods every task has).
    """

    kind: ClassVar[str]
    per_text: ClassVar[bool]
    classifies: ClassVar[bool]
    pools: ClassVar[bool]
    neighbour_index: ClassVar[bool]
    binary_agreement: ClassVar[bool]
    cosine_target: ClassVar[bool]
    margin_scale: ClassVar[str | None]
    label_sets: ClassVar[bool]
    word_tags: ClassVar[bool]
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

    def row_fidelity(self, reference: np.ndarray, candidate: np.ndarray, *, index: np.ndarray | None = None,
                     index_rows: np.ndarray | None = None) -> RowFidelity: ...

    def row_reference(self, values: np.ndarray, mask: np.ndarray | None) -> np.ndarray: ...

    def flip_margins(self, reference: np.ndarray) -> np.ndarray | None: ...

    def default_targets(self) -> tuple[float, float | None]: ...

    def unlabelled_why(self) -> str: ...



def not_tunable(kind: str) -> str:
    return (f"tune searches plans for classifiers, embedders and token classifiers (on fidelity to FP32); this "
            f"model's outputs make it a {kind} model, whose per-text fidelity tune does not measure yet")


def _no_labels(kind: str, word_tags: bool, eval_set: EvalSet) -> tuple[str, ...]:
    if eval_set.has_word_labels and not word_tags:
        return (f"the eval set's word tags are used for token-classification models, not {kind}: "
                "fidelity to A is reported, accuracy is not",)
    if not eval_set.has_labels:
        return ("the eval set has no labels: fidelity to A is reported, accuracy is not",)
    return (f"labels are not used for {kind} models yet: fidelity to A is reported, accuracy is not",)


def unscored_warnings(task: Task, eval_set: EvalSet) -> tuple[str, ...]:
    """Why a task scored no labels on this eval set (for the report's warnings)."""
    return _no_labels(task.kind, task.word_tags, eval_set)


def row_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64).reshape(len(a), -1)
    b = np.asarray(b, dtype=np.float64).reshape(len(b), -1)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    denom = na * nb
    dots = np.einsum("ij,ij->i", a, b)
    # two zero vectors are identical; a zero vector against a non-zero one shares no direction
    return np.where(denom > 0, dots / np.where(denom > 0, denom, 1.0), np.where((na == 0) & (nb == 0), 1.0, 0.0))


def check_same(reference: Predicted, candidate: Predicted) -> None:
    if reference.values.shape != candidate.values.shape:
        raise ModelError(f"the engines' outputs differ in shape: {reference.values.shape} vs "
                         f"{candidate.values.shape}", hint="compare engines built from the same model")


def per_text_outputs(output: str, what: str, runner: BaseRunner, tokenizer: TextTokenizer, texts: Sequence[str],
              batch_size: int, progress: ProgressCallback | None, task: str) -> Predicted:
    """One row of ``what`` per text from ``output`` (refused when the output has a sequence axis)."""
    out = predict_outputs(runner, tokenizer, texts, batch_size=batch_size, output_name=output, progress=progress,
                          task=task)
    if out.values.ndim != 2 and len(texts):
        raise ModelError(f"output {output!r} has shape {out.values.shape[1:]} per text, not [{what}]",
                         hint="pass --task embedding or token-classification for this model")
    return out


def decision_fidelity(reference: Predicted, candidate: Predicted, decide: Callable[[np.ndarray], np.ndarray],
                       extra: Callable[[np.ndarray, np.ndarray], dict[str, float | None]] | None = None
                       ) -> Fidelity:
    """Agreement: the share of texts whose decision (``decide`` of its output row: a class, a label set) the
    candidate keeps; the cosines of the rows; ``extra`` of the two decisions ([texts, ...] each)."""
    check_same(reference, candidate)
    if not len(reference.values):
        return Fidelity(0.0, 0.0, 0.0)
    a, b = decide(reference.values), decide(candidate.values)
    same = (a == b).reshape(len(a), -1).all(axis=1)
    cos = row_cosine(reference.values, candidate.values)
    return Fidelity(float(same.mean()), float(cos.mean()), float(cos.min()), extra(a, b) if extra else {})


@dataclass(frozen=True)
class PerTextHead(KindTraits):
    """What the heads with one output row per text share (classification, regression, multi-label): the row
    read from ``output_name`` (refused where the output has a sequence axis; ``row`` names what it holds)."""

    output_name: str
    labels: tuple[str, ...] = ()
    logits_distribution: bool = True  # outputs are logits of a class distribution (KL divergence applies)
    row: ClassVar[str] = "outputs"

    def predict(self, runner: BaseRunner, tokenizer: TextTokenizer, texts: Sequence[str], *, batch_size: int,
                progress: ProgressCallback | None = None, task: str = "inference") -> Predicted:
        return per_text_outputs(self.output_name, self.row, runner, tokenizer, texts, batch_size, progress, task)

    def gold(self, eval_set: EvalSet, tokenizer: TextTokenizer | None = None, width: int | None = None
             ) -> np.ndarray | None:
        """The eval set's labels as this head's targets (None without labels; see :meth:`_gold`)."""
        return self._gold(eval_set, width) if eval_set.has_labels else None

    def _gold(self, eval_set: EvalSet, width: int | None) -> np.ndarray | None:
        raise NotImplementedError

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.labels))


class NoClasses(KindTraits):
    """A task without one class per text (embedding, regression, multi-label): no class predictions or metrics."""

    def predictions(self, out: Predicted) -> np.ndarray | None:
        return None

    def metrics(self, out: Predicted, y_true: np.ndarray | None) -> ClassificationMetrics | None:
        return None


@dataclass(frozen=True)
class ClasslessHead(NoClasses, PerTextHead):
    """A per-text head without one class per text (regression, multi-label), not tunable yet."""

    @property
    def tunable(self) -> str | None:
        return not_tunable(self.kind)

    def score(self, outputs: Mapping[str, Predicted], gold: object | None, *, seed: int = 0) -> TaskScore:
        """A's and B's outputs against the gold targets (:meth:`_against_gold`), each measure named
        ``<engine>_<measure>``."""
        if gold is None:
            return TaskScore()
        y: np.ndarray = np.asarray(gold, dtype=self.gold_dtype)
        extra: dict[str, float | None] = {}
        for name in ("A", "B"):
            if name in outputs:
                extra.update({f"{name}_{k}": v for k, v in self._against_gold(outputs[name].values, y).items()})
        return TaskScore(extra=extra)

    gold_dtype: ClassVar[type] = np.float64

    def _against_gold(self, values: np.ndarray, y: np.ndarray) -> dict[str, float | None]:
        raise NotImplementedError


