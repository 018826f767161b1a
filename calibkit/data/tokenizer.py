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

from calibkit._io import native_path
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
        """The arrays a model with these input names takes: Hugging Face names, the TensorFlow / TF Hub BERT
        names for the same tensors (input_mask, segment_ids, input_word_ids, input_type_ids), and position_ids
        (0, 1, 2, ... per text) for exports that take them as an input."""
        table = {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "token_type_ids": self.token_type_ids,
        }
        for name, alias in INPUT_ALIASES.items():
            table[name] = table[alias]
        if "position_ids" in names:
            width = self.input_ids.shape[1] if self.input_ids.ndim == 2 else 0
            table["position_ids"] = np.broadcast_to(np.arange(width, dtype=np.int64), self.input_ids.shape).copy()
        missing = [n for n in names if n not in table]
        if missing:
            raise ModelError(
                f"model inputs {missing} are not produced by the tokenizer (calibkit feeds input_ids, "
                f"attention_mask, token_type_ids and position_ids, also under the names {sorted(INPUT_ALIASES)})",
                hint="re-export the model with those input names (torch.onnx.export(..., input_names=[...])), or "
                     "rename the graph inputs with onnx.compose / onnx.utils",
            )
        return {n: table[n] for n in names}


def takes_mask(input_names: Sequence[str]) -> bool:
    """Whether a model with these inputs is told which positions are padding (else it attends to them)."""
    return any(n == "attention_mask" or INPUT_ALIASES.get(n) == "attention_mask" for n in input_names)


# other exporters' names for the tokenizer's arrays (TensorFlow BERT, TF Hub, older ONNX exports)
INPUT_ALIASES = {
    "input_mask": "attention_mask", "mask": "attention_mask", "segment_ids": "token_type_ids",
    "input_word_ids": "input_ids", "input_type_ids": "token_type_ids", "token_type": "token_type_ids",
}


class TextTokenizer:
    """Wraps a tokenizer so every caller gets the same ids, padding and truncation."""

    def __init__(self, path: str | Path, max_length: int | None = None) -> None:
        """``max_length`` overrides the limit read from the folder (:func:`sequence_limit`)."""
        self.path = Path(path)
        self._fast = None
        self._slow = None
        tj = self.path / "tokenizer.json" if self.path.is_dir() else self.path
        if tj.is_file() and tj.name.endswith(".json"):
            from tokenizers import Tokenizer

            try:
                # read here: Tokenizer.from_file takes UTF-8 names only
                self._fast = Tokenizer.from_str(tj.read_text(encoding="utf-8"))
            except Exception as exc:
                raise ModelError(f"cannot read tokenizer {tj}: {exc}") from exc
            self._fast.no_padding()
            self._fast.no_truncation()
        elif self.path.is_dir():
            try:
                from transformers import AutoTokenizer

                self._slow = AutoTokenizer.from_pretrained(native_path(self.path), local_files_only=True)
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
        assert self._slow is not None  # __init__ sets _slow where it leaves _fast None
        return int(self._slow.pad_token_id or 0)

    def cut(self, texts: Sequence[str], max_length: int | None = None) -> list[str]:
        """The texts as the tokenizer needs to see them for ``max_length`` tokens: a text of more than
        ``CHARS_PER_TOKEN`` characters per token is cut to that many characters before tokenizing (one 10 MB
        text used to be tokenized in full to keep its first 512 tokens). The cut is widened, doubling, until it
        yields ``CUT_SLACK`` tokens more than ``max_length`` (or the whole text), so the tokens kept are those of
        the whole text: only texts of whitespace or characters the tokenizer drops cost more."""
        limit = max_length or self.max_length
        chars = CHARS_PER_TOKEN * limit
        return [t if len(t) <= chars else self._prefix(t, chars, limit) for t in texts]

    def _prefix(self, text: str, chars: int, limit: int) -> str:
        while chars < len(text):
            head = text[:chars]
            if self._count(head) > limit + CUT_SLACK:
                return head
            chars *= 2
        return text

    def _count(self, text: str) -> int:
        if self._fast is not None:
            return len(self._fast.encode(text).ids)
        assert self._slow is not None  # __init__ sets _slow where it leaves _fast None
        return len(self._slow(text)["input_ids"])

    def token_lengths(self, texts: Sequence[str], max_length: int | None = None) -> np.ndarray:
        """Token counts before truncation (special tokens included), exact up to ``CUT_SLACK`` tokens past
        ``max_length`` (default: the tokenizer's); a longer text is counted on its :meth:`cut`."""
        texts = self.cut(texts, max_length)
        if self._fast is not None:
            encs = self._fast.encode_batch(list(texts))
            return np.array([len(e.ids) for e in encs], dtype=np.int64)
        assert self._slow is not None  # __init__ sets _slow where it leaves _fast None
        return np.array([len(x) for x in self._slow(list(texts))["input_ids"]], dtype=np.int64)

    def token_offsets(self, texts: Sequence[str], max_length: int | None = None) -> list[list[tuple[int, int]]]:
        """Per text, the (start, end) character span of each token position that :meth:`encode` feeds, truncated
        the same way; special tokens are ``(0, 0)``. Needs a fast tokenizer (tokenizer.json)."""
        limit = max_length or self.max_length
        texts = self.cut(texts, limit)  # offsets into a text's start are offsets into the text
        if self._fast is not None:
            encs = self._fast.encode_batch(list(texts))
            offs = [[(0, 0) if sp else (int(a), int(b)) for (a, b), sp in zip(e.offsets, e.special_tokens_mask)]
                    for e in encs]
        else:
            assert self._slow is not None  # __init__ sets _slow where it leaves _fast None
            try:
                enc = self._slow(list(texts), return_offsets_mapping=True, return_special_tokens_mask=True)
            except NotImplementedError as exc:
                raise ModelError(f"the tokenizer in {self.path} cannot map tokens to characters",
                                 hint="word-level labels need a fast tokenizer: a folder with tokenizer.json") from exc
            offs = [[(0, 0) if sp else (int(a), int(b)) for (a, b), sp in zip(o, m)]
                    for o, m in zip(enc["offset_mapping"], enc["special_tokens_mask"])]
        return [x if len(x) <= limit else x[: limit - 1] + x[-1:] for x in offs]

    def encode(self, texts: Sequence[str], max_length: int | None = None) -> Encoding:
        """Encode and pad to the longest text of the batch (no padding to a fixed maximum)."""
        limit = max_length or self.max_length
        texts = self.cut(texts, limit)
        if self._fast is not None:
            encs = self._fast.encode_batch(list(texts))
            ids = [e.ids for e in encs]
            types = [e.type_ids for e in encs]
        else:
            assert self._slow is not None  # __init__ sets _slow where it leaves _fast None
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


CHARS_PER_TOKEN = 16  # generous: English averages about 4 characters per token
CUT_SLACK = 8  # tokens past the limit a cut text must still yield, so a word split at the cut is never kept


# model types whose position ids start at pad_token_id + 1 (fairseq style): the table holds that many extra rows
POSITION_OFFSET_MODEL_TYPES = frozenset({
    "roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "longformer", "data2vec-text", "ibert", "luke",
    "markuplm", "roberta-prelayernorm", "xmod", "bart", "mbart", "mvp", "plbart", "ernie_m",
})
_SANE_MAX = 100_000  # tokenizer_config's "no limit" sentinel is int(1e30)
DEFAULT_MAX_LENGTH = 512


@dataclass(frozen=True)
class SequenceLimit:
    """The longest token sequence the model accepts, and where that number comes from (for messages)."""

    tokens: int
    source: str

    def describe(self) -> str:
        return f"{self.tokens} tokens ({self.source})"


def _read_json(p: Path) -> dict:
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # unreadable: no limit from this file
        return {}
    return data if isinstance(data, dict) else {}


def sequence_limit(path: str | Path, config_dir: str | Path | None = None) -> SequenceLimit:
    """The truncation length: the tokenizer's ``model_max_length``, then the position table minus its offset.

    Both are read when present and the smaller one wins, so a tokenizer_config that promises more positions than
    the model's table holds never makes ONNX Runtime index past it. RoBERTa-family position ids start at
    ``pad_token_id + 1``, so their table of ``max_position_embeddings`` rows (514) holds 512 usable positions.
    """
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    cfg = _read_json(Path(config_dir) / "config.json") if config_dir else {}
    if not cfg:
        cfg = _read_json(folder / "config.json")
    limits: list[SequenceLimit] = []
    mml = _read_json(folder / "tokenizer_config.json").get("model_max_length")
    if isinstance(mml, (int, float)) and 0 < mml < _SANE_MAX:
        limits.append(SequenceLimit(int(mml), "tokenizer_config.json model_max_length"))
    mpe = cfg.get("max_position_embeddings")
    if isinstance(mpe, int) and mpe > 0 and cfg.get("position_biased_input", True) is not False:
        model_type = str(cfg.get("model_type", ""))
        if model_type in POSITION_OFFSET_MODEL_TYPES:
            pad_raw = cfg.get("pad_token_id")
            pad = int(pad_raw) if isinstance(pad_raw, int) else 1
            limits.append(SequenceLimit(
                mpe - pad - 1,
                f"config.json max_position_embeddings {mpe} minus the {model_type} position offset "
                f"pad_token_id + 1 = {pad + 1}",
            ))
        else:
            limits.append(SequenceLimit(mpe, "config.json max_position_embeddings"))
    if not limits:
        return SequenceLimit(DEFAULT_MAX_LENGTH, "default: neither model_max_length nor max_position_embeddings")
    return min(limits, key=lambda lim: lim.tokens)


def _model_max_length(path: Path) -> int:
    return sequence_limit(path).tokens
