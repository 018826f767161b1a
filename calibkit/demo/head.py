"""The fast demo variant's head: scikit-learn logistic regression on frozen mean-pooled embeddings."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from calibkit.demo.model import LinearHead
from calibkit.errors import DataError


def fit_logreg_head(embeddings: np.ndarray, labels: Sequence[int], *, seed: int = 0, c: float = 0.01) -> LinearHead:
    """Fit a binary logistic regression and return it as a two-logit linear head.

    The logits are ``[-z/2, z/2]`` with ``z`` the decision function, so softmax gives the logistic
    probability and argmax gives the logistic-regression prediction (class 1 = positive).
    """
    from sklearn.linear_model import LogisticRegression

    y = np.asarray(labels, dtype=np.int64)
    if embeddings.ndim != 2 or len(embeddings) != len(y):
        raise DataError(f"embeddings {embeddings.shape} do not match {len(y)} labels")
    if set(np.unique(y).tolist()) != {0, 1}:
        raise DataError("the logistic-regression head needs examples of both labels (0 and 1)")
    x = np.asarray(embeddings, dtype=np.float64)
    mu = x.mean(axis=0)
    # a floor on the scale: a few pooled dimensions are nearly constant (std ~1e-30), and dividing by that
    # folds weights of 1e31 into the head, which no 8-bit (or 16-bit) format can hold
    raw_sd = x.std(axis=0)
    sd = np.maximum(raw_sd, 1e-2 * float(np.median(raw_sd[raw_sd > 0])) if (raw_sd > 0).any() else 1.0)
    clf = LogisticRegression(C=c, max_iter=2000, random_state=seed)
    clf.fit((x - mu) / sd, y)
    # fold the standardisation into the linear layer: z = ((x - mu) / sd) @ w + b
    w = clf.coef_[0] / sd
    b = float(clf.intercept_[0] - np.dot(mu / sd, clf.coef_[0]))
    weight = np.stack([-w / 2, w / 2]).astype(np.float32)
    bias = np.array([-b / 2, b / 2], dtype=np.float32)
    return LinearHead(weight=weight, bias=bias)
