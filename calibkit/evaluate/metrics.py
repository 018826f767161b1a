"""Metrics of one classifier (accuracy, macro-F1, confusion matrix, latency) and between two (agreement,
logit cosine and absolute error, output error against a reference, flips by the reference's confidence)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ClassificationMetrics:
    accuracy: float
    macro_f1: float
    confusion_matrix: tuple[tuple[int, ...], ...]  # rows: true class, columns: predicted class
    labels: tuple[str, ...]


@dataclass(frozen=True)
class LatencyStats:
    """Per-batch inference time (ms) and throughput over the whole eval set."""

    mean_ms: float
    p50_ms: float
    p95_ms: float
    throughput_per_s: float
    batch_size: int
    batches: int


@dataclass(frozen=True)
class OutputAgreement:
    agreement: float  # fraction of examples with the same argmax
    cosine_mean: float
    cosine_min: float
    max_abs_error: float
    mean_abs_error: float


@dataclass(frozen=True)
class OutputError:
    """How far logits are from reference logits: mean KL(softmax(ref) || softmax(x)) and mean squared error."""

    mean_kl: float
    logit_mse: float


def classification_metrics(y_true: np.ndarray, y_pred: np.ndarray, labels: Sequence[str]) -> ClassificationMetrics:
    from sklearn.metrics import accuracy_score, confusion_matrix, f1_score

    ids = list(range(len(labels)))
    cm = confusion_matrix(y_true, y_pred, labels=ids)
    return ClassificationMetrics(
        accuracy=float(accuracy_score(y_true, y_pred)),
        macro_f1=float(f1_score(y_true, y_pred, labels=ids, average="macro", zero_division=0)),
        confusion_matrix=tuple(tuple(int(v) for v in row) for row in cm),
        labels=tuple(labels),
    )


def latency_stats(batch_seconds: Sequence[float], items: int, batch_size: int) -> LatencyStats:
    ms = np.asarray(batch_seconds, dtype=np.float64) * 1000.0
    if ms.size == 0:
        return LatencyStats(0.0, 0.0, 0.0, 0.0, batch_size, 0)
    total_s = float(ms.sum()) / 1000.0
    return LatencyStats(
        mean_ms=float(ms.mean()),
        p50_ms=float(np.percentile(ms, 50)),
        p95_ms=float(np.percentile(ms, 95)),
        throughput_per_s=float(items / total_s) if total_s > 0 else 0.0,
        batch_size=batch_size,
        batches=int(ms.size),
    )


def output_agreement(logits_a: np.ndarray, logits_b: np.ndarray) -> OutputAgreement:
    a = np.asarray(logits_a, dtype=np.float64).reshape(len(logits_a), -1)
    b = np.asarray(logits_b, dtype=np.float64).reshape(len(logits_b), -1)
    if a.shape != b.shape:
        raise ValueError(f"logit shapes differ: {a.shape} vs {b.shape}")
    if len(a) == 0:
        return OutputAgreement(0.0, 0.0, 0.0, 0.0, 0.0)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    denom = na * nb
    dots = np.einsum("ij,ij->i", a, b)
    # two zero vectors are identical; one zero vector against a non-zero one has no direction in common
    cos = np.where(denom > 0, dots / np.where(denom > 0, denom, 1.0), np.where((na == 0) & (nb == 0), 1.0, 0.0))
    err = np.abs(a - b)
    return OutputAgreement(
        agreement=float(np.mean(a.argmax(axis=1) == b.argmax(axis=1))),
        cosine_mean=float(cos.mean()),
        cosine_min=float(cos.min()),
        max_abs_error=float(err.max()),
        mean_abs_error=float(err.mean()),
    )


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def output_error(reference: np.ndarray, logits: np.ndarray) -> OutputError:
    ref = np.asarray(reference, dtype=np.float64)
    x = np.asarray(logits, dtype=np.float64)
    if len(ref) == 0:
        return OutputError(0.0, 0.0)
    lp, lq = log_softmax(ref), log_softmax(x)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    return OutputError(mean_kl=float(kl.mean()), logit_mse=float(np.mean((ref - x) ** 2)))


# A's top-2 probability gap: under 0.1 A itself is nearly undecided, from 0.5 on it is confident
CONFIDENCE_EDGES: tuple[float, ...] = (0.1, 0.5)


@dataclass(frozen=True)
class ConfidenceBucket:
    """Texts whose reference top-2 probability gap lies in [low, high), and how many of them flipped."""

    low: float
    high: float
    texts: int
    flips: int

    def to_dict(self) -> dict[str, float | int]:
        return {"low": self.low, "high": self.high, "texts": self.texts, "flips": self.flips}


def top2_gap(logits: np.ndarray) -> np.ndarray:
    """Per row: softmax probability of the top class minus that of the runner-up (1.0 with a single class)."""
    x = np.asarray(logits, dtype=np.float64).reshape(len(logits), -1)
    if x.shape[1] < 2:
        return np.ones(len(x))
    p = np.exp(log_softmax(x))
    top = np.partition(p, -2, axis=1)[:, -2:]
    return top[:, 1] - top[:, 0]


def flips_by_confidence(reference: np.ndarray, candidate: np.ndarray,
                        edges: Sequence[float] = CONFIDENCE_EDGES) -> tuple[ConfidenceBucket, ...]:
    """How many texts fall in each band of the reference's top-2 probability gap and how many of them the
    candidate's argmax moves: flips among texts the reference is unsure of matter less than among confident ones."""
    ref = np.asarray(reference, dtype=np.float64).reshape(len(reference), -1)
    cand = np.asarray(candidate, dtype=np.float64).reshape(len(candidate), -1)
    if ref.shape != cand.shape:
        raise ValueError(f"logit shapes differ: {ref.shape} vs {cand.shape}")
    gap = top2_gap(ref)
    flipped = ref.argmax(axis=1) != cand.argmax(axis=1) if len(ref) else np.zeros(0, dtype=bool)
    bounds = [0.0, *edges, 1.0]
    out = []
    for i, (low, high) in enumerate(zip(bounds[:-1], bounds[1:])):
        inside = (gap >= low) & ((gap < high) if i < len(bounds) - 2 else (gap <= high))
        out.append(ConfidenceBucket(low, high, int(inside.sum()), int((inside & flipped).sum())))
    return tuple(out)
