"""The fidelity targets a tune run uses when its request names none (the request itself, every option of tune,
is :class:`calibkit.requests.tune.TuneRequest`)."""

from __future__ import annotations

DEFAULT_UNLABELED_AGREEMENT = 99.0  # percent of FP32's predictions kept, when the eval set has no labels
DEFAULT_EMBEDDING_AGREEMENT = 95.0  # percent of texts whose nearest neighbour in the FP32 index stays
DEFAULT_EMBEDDING_COSINE = 0.995  # mean cosine of the INT8 vectors to FP32's
