"""Run a text classifier over texts: tokenize in length-sorted batches, infer, return logits in input order."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from calibkit.data.encode import BatchCost, TokenBudget, budget_groups
from calibkit.data.tokenizer import TextTokenizer
from calibkit.engines.base import BaseRunner
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress


def length_batches(
    lengths: np.ndarray, batch_size: int, *, budget: TokenBudget | None = None, cost: BatchCost | None = None
) -> list[np.ndarray]:
    """Indices grouped into batches of similar length (stable sort), so padding stays small; with ``budget``,
    batches of long texts are cut to fit it (see :func:`calibkit.data.encode.budget_groups`)."""
    return list(budget_groups(np.asarray(lengths), batch_size, budget, cost))


def predict_logits(
    runner: BaseRunner,
    tokenizer: TextTokenizer,
    texts: Sequence[str],
    *,
    batch_size: int = 32,
    output_name: str | None = None,
    progress: ProgressCallback | None = None,
    task: str = "inference",
) -> np.ndarray:
    """Logits [len(texts), classes] as float32, in the order of ``texts``. ``runner`` must be active."""
    cb = progress or no_progress
    lengths = tokenizer.token_lengths(texts)
    batches = length_batches(np.minimum(lengths, tokenizer.max_length), batch_size)
    out_name = output_name or runner.output_names[0]
    names = [s.name for s in runner.input_specs]
    result: np.ndarray | None = None
    cb(ProgressEvent(task, 0, len(texts)))
    done = 0
    for idx in batches:
        enc = tokenizer.encode([texts[i] for i in idx])
        logits = np.asarray(runner.infer(enc.feeds(names))[out_name], dtype=np.float32)
        if result is None:
            result = np.zeros((len(texts), *logits.shape[1:]), dtype=np.float32)
        result[idx] = logits
        done += len(idx)
        cb(ProgressEvent(task, done, len(texts)))
    return result if result is not None else np.zeros((0, 0), dtype=np.float32)
