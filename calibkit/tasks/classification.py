"""The ``classification`` kind: one class per text from a ``[batch, classes]`` logits output."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from calibkit.data.evalset import EvalSet, label_ids
from calibkit.evaluate.metrics import ClassificationMetrics, classification_metrics, output_error
from calibkit.evaluate.predict import Predicted
from calibkit.evidence.intervals import evidence_warnings, macro_f1_intervals, paired_difference, proportion
from calibkit.evidence.rowfidelity import CLASSIFICATION, RowFidelity, classification_rows
from calibkit.results.runs import Fidelity
from calibkit.tasks.base import EngineScore, ModelFacts, PerTextHead, TaskScore, decision_fidelity


@dataclass(frozen=True)
class ClassificationTask(PerTextHead):
    """One class per text (a ``[batch, classes]`` logits output): agreement = same argmax; accuracy and
    macro-F1 against the eval set's labels."""

    kind: ClassVar[str] = CLASSIFICATION
    row: ClassVar[str] = "classes"
    per_text: ClassVar[bool] = True
    classifies: ClassVar[bool] = True
    margin_scale: ClassVar[str | None] = "absolute"
    problem_type: ClassVar[str | None] = "single_label_classification"

    @classmethod
    def detect(cls, model: ModelFacts) -> bool:
        """A ``logits`` output without a sequence axis of a model that is no token classifier, or (without
        ``logits`` and encoder-named outputs) a first output without one of a model whose config.json names
        its labels or a sequence classifier; never a head that config.json says scores."""
        if model.scores:
            return False
        if model.logits is not None:
            return model.rank(model.logits) != 3 and "TokenClassification" not in model.architectures
        if model.has_encoder_outputs or model.rank(model.first) == 3:
            return False
        return bool(model.labels) or "SequenceClassification" in model.architectures

    @classmethod
    def row_fidelity(cls, reference: np.ndarray, candidate: np.ndarray, *, index: np.ndarray | None = None,
                     index_rows: np.ndarray | None = None) -> RowFidelity:
        return classification_rows(reference, candidate)

    @classmethod
    def flip_margins(cls, reference: np.ndarray) -> np.ndarray | None:
        """The gap between the two most probable classes' softmax probabilities."""
        if reference.ndim != 2 or reference.shape[1] < 2:
            return None
        z = reference - reference.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        top = np.sort(p, axis=1)
        return top[:, -1] - top[:, -2]

    @classmethod
    def variant_error(cls, reference: np.ndarray, outputs: np.ndarray) -> tuple[float, float]:
        oe = output_error(reference, outputs)
        return oe.logit_mse, oe.mean_kl

    @classmethod
    def fidelity_basis(cls, labelled: bool) -> str:
        return "accuracy (labels) and flips" if labelled else f"{cls.fidelity_name} with the reference (flips)"

    @classmethod
    def labels_used(cls, fidelity_only: bool) -> str:
        return "given" if not fidelity_only else "FP32 predictions (the eval set has none)"

    @classmethod
    def unlabelled_why(cls) -> str:
        return "has no labels"

    def fidelity(self, reference: Predicted, candidate: Predicted) -> Fidelity:
        return decision_fidelity(reference, candidate, lambda v: v.argmax(axis=1))

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

