"""Run a model over texts: tokenize in length-sorted batches, infer, return one output in input order.

Outputs with a sequence axis (token logits [batch, seq, labels], ``last_hidden_state`` [batch, seq, hidden])
differ in length from batch to batch: they are either padded with zeros to the longest text of the whole set
(``pooling=None``; padded positions are zero and the real-token mask comes with them) or mean-pooled over
each text's real tokens (``pooling="mean"``, what sentence-embedding models do), so no [texts, seq, hidden]
array is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from calibkit.data.encode import BatchCost, TokenBudget, budget_groups
from calibkit.data.tokenizer import TextTokenizer, takes_mask
from calibkit.engines.base import BaseRunner
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress


def length_batches(
    lengths: np.ndarray, batch_size: int, *, budget: TokenBudget | None = None, cost: BatchCost | None = None,
    input_names: Sequence[str] = ("attention_mask",),
) -> list[np.ndarray]:
    """Indices grouped into batches of similar length (stable sort), so padding stays small; with ``budget``,
    batches of long texts are cut to fit it (see :func:`calibkit.data.encode.budget_groups`). A model whose
    ``input_names`` hold no attention mask gets batches of one length each (it would attend to padding)."""
    return list(budget_groups(np.asarray(lengths), batch_size, budget, cost,
                              equal_lengths=not takes_mask(input_names)))


@dataclass(frozen=True)
class Predicted:
    """One output for every text, in input order. ``mask`` [texts, seq] marks real tokens of sequence outputs."""

    values: np.ndarray
    mask: np.ndarray | None = None


def _is_sequence_output(value: np.ndarray, seq_len: int) -> bool:
    return value.ndim >= 3 and value.shape[1] == seq_len


def predict_outputs(
    runner: BaseRunner,
    tokenizer: TextTokenizer,
    texts: Sequence[str],
    *,
    batch_size: int = 32,
    output_name: str | None = None,
    pooling: str | None = None,
    progress: ProgressCallback | None = None,
    task: str = "inference",
    budget: TokenBudget | None = None,
) -> Predicted:
    """``output_name`` (default: the first output) for every text. ``runner`` must be active.

    ``pooling="mean"``: a sequence output is averaged over each text's real tokens (attention mask).
    ``budget``: batches are also cut to fit it (``max_batch_tokens``: batch x longest text), so a few long texts
    do not pad a whole batch of short ones to their length.
    """
    if pooling not in (None, "mean"):
        raise ValueError(f"unknown pooling {pooling!r}")
    cb = progress or no_progress
    lengths = np.minimum(tokenizer.token_lengths(texts), tokenizer.max_length)
    names = [s.name for s in runner.input_specs]
    batches = length_batches(lengths, batch_size, budget=budget, input_names=names)
    width = int(lengths.max()) if len(lengths) else 0
    out_name = output_name or runner.output_names[0]
    result: np.ndarray | None = None
    mask: np.ndarray | None = None
    cb(ProgressEvent(task, 0, len(texts)))
    done = 0
    for idx in batches:
        enc = tokenizer.encode([texts[i] for i in idx])
        value = np.asarray(runner.infer(enc.feeds(names))[out_name], dtype=np.float32)
        seq = enc.input_ids.shape[1]
        if _is_sequence_output(value, seq):
            m = enc.attention_mask.astype(bool)
            if pooling == "mean":
                w = m.astype(np.float32)[(...,) + (None,) * (value.ndim - 2)]
                value = (value * w).sum(axis=1) / np.maximum(w.sum(axis=1), 1.0)
            else:
                if result is None:
                    result = np.zeros((len(texts), width, *value.shape[2:]), dtype=np.float32)
                    mask = np.zeros((len(texts), width), dtype=bool)
                assert mask is not None
                # padded positions are zeroed so the result does not depend on how texts were batched
                result[idx, :seq] = np.where(m[(...,) + (None,) * (value.ndim - 2)], value, 0.0)
                mask[idx, :seq] = m
                done += len(idx)
                cb(ProgressEvent(task, done, len(texts)))
                continue
        if result is None:
            result = np.zeros((len(texts), *value.shape[1:]), dtype=np.float32)
        result[idx] = value
        done += len(idx)
        cb(ProgressEvent(task, done, len(texts)))
    return Predicted(result if result is not None else np.zeros((0, 0), dtype=np.float32), mask)


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
    """Logits [len(texts), classes] as float32, in the order of ``texts`` (sequence outputs padded to the longest
    text, see :func:`predict_outputs`). ``runner`` must be active."""
    return predict_outputs(runner, tokenizer, texts, batch_size=batch_size, output_name=output_name,
                           progress=progress, task=task).values
