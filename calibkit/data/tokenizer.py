"""Tokenizing for calibration, sampling and evaluation.

Uses the fast ``tokenizers`` library directly on ``tokenizer.json`` (light and quick); falls back to
``transformers.AutoTokenizer`` for model folders that only carry slow-tokenizer files.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calibkit.errors import ModelError


@dataclass(frozen=True)
class Encoding:
    """A batch of token ids padded to the longest member. ``lengths`` are the unpadded lengths."""

    input_ids: np.ndarray  # int64 [batch, seq]
    attention_mask: np.ndarray  # int64 [batch, seq]
    token_type_ids: np.ndarray  # int64 [batch, seq]
    lengths: np.ndarray  # int64 [batch]
    truncated: np.ndarray  # bool [batch]: text was longer than max_length

    def feeds(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """The subset of arrays a model with these input names takes."""
        table = {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "token_type_ids": self.token_type_ids,
        }
        missing = [n for n in names if n not in table]
        if missing:
            raise ModelError(
                f"model inputs {missing} are not produced by the tokenizer "
                "(calibkit feeds input_ids, attention_mask and token_type_ids)"
            )
        return {n: table[n] for n in names}


class TextTokenizer:
    """Wraps a tokenizer so every caller gets the same ids, padding and truncation."""

    def __init__(self, path: str | Path, max_length: int | None = None) -> None:
        self.path = Path(path)
        self._fast = None
        self._slow = None
        tj = self.path / "tokenizer.json" if self.path.is_dir() else self.path
        if tj.is_file() and tj.name.endswith(".json"):
            from tokenizers import Tokenizer

            try:
                self._fast = Tokenizer.from_file(str(tj))
            except Exception as exc:
                raise ModelError(f"cannot read tokenizer {tj}: {exc}") from exc
            self._fast.no_padding()
            self._fast.no_truncation()
        elif self.path.is_dir():
            try:
                from transformers import AutoTokenizer

                self._slow = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
            except Exception as exc:
                raise ModelError(
                    f"no usable tokenizer in {self.path}: {exc}",
                    hint="pass --tokenizer with a folder holding tokenizer.json (a Hugging Face model folder)",
                ) from exc
        else:
            raise ModelError(
                f"tokenizer not found at {self.path}",
                hint="pass --tokenizer with a Hugging Face model folder (tokenizer.json, tokenizer_config.json)",
            )
        self.max_length = max_length or _model_max_length(self.path)
        self.pad_id = self._pad_id()

    def _pad_id(self) -> int:
        if self._fast is not None:
            pid = self._fast.token_to_id("[PAD]")
            if pid is None:
                pid = self._fast.token_to_id("<pad>")
            return int(pid or 0)
        return int(self._slow.pad_token_id or 0)

    def token_lengths(self, texts: Sequence[str]) -> np.ndarray:
        """Untruncated token counts (special tokens included)."""
        if self._fast is not None:
            encs = self._fast.encode_batch(list(texts))
            return np.array([len(e.ids) for e in encs], dtype=np.int64)
        return np.array([len(x) for x in self._slow(list(texts))["input_ids"]], dtype=np.int64)

    def encode(self, texts: Sequence[str], max_length: int | None = None) -> Encoding:
        """Encode and pad to the longest text of the batch (no padding to a fixed maximum)."""
        limit = max_length or self.max_length
        if self._fast is not None:
            encs = self._fast.encode_batch(list(texts))
            ids = [e.ids for e in encs]
            types = [e.type_ids for e in encs]
        else:
            enc = self._slow(list(texts), return_token_type_ids=True)
            ids = enc["input_ids"]
            types = enc.get("token_type_ids") or [[0] * len(x) for x in ids]
        truncated = np.array([len(x) > limit for x in ids], dtype=bool)
        # keep the final [SEP] when truncating so the model sees a well-formed sequence
        ids = [x if len(x) <= limit else x[: limit - 1] + x[-1:] for x in ids]
        types = [t[: len(x)] for t, x in zip(types, ids)]
        lengths = np.array([len(x) for x in ids], dtype=np.int64)
        width = int(lengths.max()) if len(lengths) else 0
        n = len(ids)
        input_ids = np.full((n, width), self.pad_id, dtype=np.int64)
        mask = np.zeros((n, width), dtype=np.int64)
        type_ids = np.zeros((n, width), dtype=np.int64)
        for i, (x, t) in enumerate(zip(ids, types)):
            input_ids[i, : len(x)] = x
            mask[i, : len(x)] = 1
            type_ids[i, : len(t)] = t
        return Encoding(input_ids, mask, type_ids, lengths, truncated)


def _model_max_length(path: Path) -> int:
    folder = path if path.is_dir() else path.parent
    limit = 512
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        try:
            v = json.loads(cfg.read_text(encoding="utf-8")).get("model_max_length")
            if isinstance(v, int) and 0 < v < 100_000:
                limit = v
        except (OSError, ValueError, AttributeError, RecursionError):  # unreadable: the default limit
            pass
    mc = folder / "config.json"
    if mc.is_file():
        try:
            v = json.loads(mc.read_text(encoding="utf-8")).get("max_position_embeddings")
            if isinstance(v, int) and v > 0:
                limit = min(limit, v)
        except (OSError, ValueError, AttributeError, RecursionError):  # unreadable: the default limit
            pass
    return limit
