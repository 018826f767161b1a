"""The calibration data reader the ONNX Runtime quantize_static baselines of the benchmarks share: one text per
batch, truncated and padded to a fixed length (ORT's histogram calibrators need equal shapes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def padded_reader(tok: Any, texts: Sequence[str], length: int) -> Any:
    """A ``CalibrationDataReader`` over ``texts`` encoded by ``tok`` (calibkit.data.tokenizer.TextTokenizer)."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.i = 0

        def get_next(self):  # noqa: ANN201
            if self.i >= len(texts):
                return None
            enc = tok.encode([texts[self.i]], max_length=length)
            self.i += 1
            pad = length - enc.input_ids.shape[1]
            f = {k: np.pad(v, ((0, 0), (0, pad))) for k, v in
                 {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask,
                  "token_type_ids": enc.token_type_ids}.items()}
            if pad:
                f["input_ids"][:, -pad:] = tok.pad_id
            return f

    return Reader()
