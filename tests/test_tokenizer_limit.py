"""Truncation length from the tokenizer and the model's position table (RoBERTa-family offset included)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibkit.data.tokenizer import sequence_limit


def _folder(tmp_path: Path, tokenizer_config: dict | None, config: dict | None) -> Path:
    if tokenizer_config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_roberta_uses_model_max_length_not_the_position_table(tmp_path: Path) -> None:
    f = _folder(tmp_path, {"model_max_length": 512},
                {"model_type": "roberta", "max_position_embeddings": 514, "pad_token_id": 1})
    lim = sequence_limit(f)
    assert lim.tokens == 512
    assert "model_max_length" in lim.source


@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta", "camembert"])
def test_position_offset_without_model_max_length(tmp_path: Path, model_type: str) -> None:
    # transformers writes model_max_length=int(1e30) when it does not know the limit
    f = _folder(tmp_path, {"model_max_length": int(1e30)},
                {"model_type": model_type, "max_position_embeddings": 514, "pad_token_id": 1})
    lim = sequence_limit(f)
    assert lim.tokens == 512
    assert "offset" in lim.source and "514" in lim.source


def test_bert_position_table_and_smaller_limit_wins(tmp_path: Path) -> None:
    assert sequence_limit(_folder(tmp_path, None, {"model_type": "bert", "max_position_embeddings": 128})).tokens == 128
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 1024}))
    lim = sequence_limit(tmp_path)
    assert (lim.tokens, lim.source) == (128, "config.json max_position_embeddings")


def test_relative_positions_have_no_table_limit(tmp_path: Path) -> None:
    f = _folder(tmp_path, {"model_max_length": 256},
                {"model_type": "deberta-v2", "max_position_embeddings": 512, "position_biased_input": False})
    assert sequence_limit(f).tokens == 256


def test_default_when_nothing_is_known(tmp_path: Path) -> None:
    lim = sequence_limit(tmp_path)
    assert lim.tokens == 512 and lim.source.startswith("default")
    assert "512 tokens (default" in lim.describe()


def test_model_dir_carries_the_limit_and_its_source(tmp_path: Path) -> None:
    from calibkit.data.modeldir import ModelDir

    f = _folder(tmp_path, {}, {"model_type": "roberta", "max_position_embeddings": 66, "pad_token_id": 1})
    (f / "model.onnx").write_bytes(b"")
    (f / "tokenizer.json").write_text("{}")
    md = ModelDir.resolve(f)
    assert md.max_length == 64
    assert "roberta position offset" in md.max_length_source
