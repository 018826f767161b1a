"""The calibkit-compare/1 JSON document: its format tag and the keys the report renderer relies on."""

from __future__ import annotations

from typing import Any

from calibkit.errors import DataError

FORMAT = "calibkit-compare/1"

TOP_KEYS = (
    "format", "calibkit_version", "eval_set", "engines", "agreement", "outputs", "disagreements", "layers",
    "thresholds", "recommendation", "histograms",
)
ENGINE_KEYS = (
    "name", "path", "precision", "backend", "accuracy", "macro_f1", "confusion_matrix", "labels", "latency_ms",
    "throughput_per_s", "batch_size",
)
LAYER_KEYS = (
    "index", "node", "op_type", "tensor", "amax", "fp_min", "fp_max", "fp_absmax", "p99", "p9999",
    "clipped_fraction", "outlier_ratio", "nonfinite", "sqnr_db", "cosine", "sensitivity", "flag", "reasons",
)


def check_document(doc: dict[str, Any]) -> None:
    """Raise DataError when ``doc`` lacks a key of the calibkit-compare/1 contract."""
    if doc.get("format") != FORMAT:
        raise DataError(f"not a {FORMAT} document (format {doc.get('format')!r})")
    missing = [k for k in TOP_KEYS if k not in doc]
    missing += [f"engines[{i}].{k}" for i, e in enumerate(doc.get("engines", [])) for k in ENGINE_KEYS if k not in e]
    missing += [f"layers[{i}].{k}" for i, x in enumerate(doc.get("layers", [])) for k in LAYER_KEYS if k not in x]
    if missing:
        raise DataError(f"{FORMAT} document lacks keys: {missing[:10]}")
