"""The ``multi-label`` kind: independent yes/no per label (``problem_type`` multi_label_classification)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from calibkit.data.evalset import SET_SEPARATOR, EvalSet, describe_labels
from calibkit.errors import DataError
from calibkit.evaluate.predict import Predicted
from calibkit.results.runs import Fidelity, finite
from calibkit.tasks.base import ClasslessHead, ModelFacts, decision_fidelity, share

MULTI_LABEL = "multi-label"


@dataclass(frozen=True)
class MultiLabelTask(ClasslessHead):
    """Independent yes/no per label (``problem_type`` multi_label_classification): a label is on where its
    logit is above 0 (sigmoid above 0.5). Fidelity: the share of texts whose whole label set is unchanged, and
    the share of (text, label) decisions unchanged."""

    kind: ClassVar[str] = MULTI_LABEL
    label_sets: ClassVar[bool] = True  # the eval set's labels are sets (joined by SET_SEPARATOR)
    flips: ClassVar[bool] = False
    problem_type: ClassVar[str | None] = "multi_label_classification"
    problem_type_stated: ClassVar[bool] = True
    row: ClassVar[str] = "labels"

    @classmethod
    def terminal_fidelity(cls, fidelity: Fidelity, texts: int, interval: str = "") -> str:
        return (f"same label set {share(fidelity.agreement)} %, same decision per label "
                f"{share(fidelity.extra.get('label_decision_agreement'))} %")

    @classmethod
    def detect(cls, model: ModelFacts) -> bool:
        """config.json says ``multi_label_classification`` (and not regression: a single label scores), and the
        head's output has no sequence axis."""
        return model.is_multi_label and not model.is_regression and model.rank(model.head) != 3

    def fidelity(self, reference: Predicted, candidate: Predicted) -> Fidelity:
        return decision_fidelity(reference, candidate, lambda v: v > 0,
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
