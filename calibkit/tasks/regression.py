"""The ``regression`` kind: a score head (``problem_type`` regression, or a single label), no argmax."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from calibkit.data.evalset import EvalSet
from calibkit.errors import DataError
from calibkit.evaluate.predict import Predicted
from calibkit.results.runs import Fidelity, finite
from calibkit.tasks.base import ClasslessHead, ModelFacts, check_same, number, share

REGRESSION = "regression"
# a regression output counts as unchanged within this share of the reference's spread across the eval texts
REGRESSION_TOLERANCE = 0.01


@dataclass(frozen=True)
class RegressionTask(ClasslessHead):
    """A score head (``problem_type`` regression, or a single output): no argmax, no classes. Fidelity is the
    share of texts whose every output moved by at most :data:`REGRESSION_TOLERANCE` of the reference's spread
    over the eval texts, with the error and the rank correlation to the reference."""

    kind: ClassVar[str] = REGRESSION
    logits_distribution: bool = False
    flips: ClassVar[bool] = False
    problem_type: ClassVar[str | None] = "regression"
    problem_type_stated: ClassVar[bool] = True
    row: ClassVar[str] = "scores"

    @classmethod
    def terminal_fidelity(cls, fidelity: Fidelity, texts: int, interval: str = "") -> str:
        return (f"scores within {number(fidelity.extra.get('tolerance'), '.3g')} of A's on "
                f"{share(fidelity.agreement)} % of texts")

    @classmethod
    def detect(cls, model: ModelFacts) -> bool:
        """config.json says the head scores (``problem_type`` regression, or a single label), and the head's
        output has no sequence axis."""
        return model.is_regression and model.rank(model.head) != 3

    def fidelity(self, reference: Predicted, candidate: Predicted) -> Fidelity:
        check_same(reference, candidate)
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



def _column_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine between two engines' scores over the eval texts, centred (Pearson correlation)."""
    a, b = a - a.mean(), b - b.mean()
    d = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / d) if d > 0 else float(np.allclose(a, b))


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra = np.argsort(np.argsort(a, kind="stable"), kind="stable").astype(np.float64)
    rb = np.argsort(np.argsort(b, kind="stable"), kind="stable").astype(np.float64)
    return _column_cosine(ra, rb)


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
