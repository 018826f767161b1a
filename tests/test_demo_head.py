"""The fast variant's head: a logistic regression folded into a two-logit linear layer."""

from __future__ import annotations

import numpy as np
import pytest

from calibkit.demo.head import fit_logreg_head
from calibkit.errors import DataError


def test_head_reproduces_sklearn_pipeline() -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 16)) * rng.uniform(0.1, 5.0, size=16) + rng.normal(size=16)
    y = (x[:, 0] - 0.5 * x[:, 3] + rng.normal(scale=0.5, size=300) > x[:, 0].mean()).astype(int)
    head = fit_logreg_head(x.astype(np.float32), y.tolist(), c=0.5)
    ref = make_pipeline(StandardScaler(), LogisticRegression(C=0.5, max_iter=2000)).fit(x, y)

    logits = x @ head.weight.T.astype(np.float64) + head.bias
    assert head.weight.shape == (2, 16) and head.bias.shape == (2,)
    np.testing.assert_array_equal(logits.argmax(axis=1), ref.predict(x))
    prob = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(prob[:, 1], ref.predict_proba(x)[:, 1], atol=1e-4)


def test_head_needs_both_labels() -> None:
    with pytest.raises(DataError, match="both labels"):
        fit_logreg_head(np.zeros((4, 3), dtype=np.float32), [1, 1, 1, 1])
    with pytest.raises(DataError, match="do not match"):
        fit_logreg_head(np.zeros((4, 3), dtype=np.float32), [0, 1])


def test_nearly_constant_features_do_not_blow_up_the_weights() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(400, 8))
    x[:, 5] = 0.7 + rng.normal(scale=1e-30, size=400)  # a pooled dimension that hardly varies
    y = (x[:, 0] > 0).astype(int)
    head = fit_logreg_head(x.astype(np.float32), y.tolist(), c=0.5)
    assert np.abs(head.weight).max() < 1e4
    logits = x @ head.weight.T.astype(np.float64) + head.bias
    assert (logits.argmax(axis=1) == y).mean() > 0.95
