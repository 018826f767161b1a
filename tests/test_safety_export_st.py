"""`calibkit export` reads a sentence-transformers folder as sentence-transformers does: max_seq_length and
do_lower_case from sentence_bert_config.json (at the root, or in the Transformer module's own folder), and the
pooling mode (last-token included), so the exported model embeds what the source embeds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")
transformers = pytest.importorskip("transformers")

import zoo  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning",
                                        "ignore::UserWarning")

MAX_SEQ = 8


def _old_st_folder(root: Path, layout: str, pooling: str) -> Path:
    """A sentence-transformers folder as versions before 6 wrote it: a cased tokenizer whose model_max_length
    says 512, the Transformer's max_seq_length 8 and do_lower_case in sentence_bert_config.json."""
    ckpt = root / ("" if layout == "root" else "0_Transformer")
    ckpt.mkdir(parents=True, exist_ok=True)
    special = zoo._train_tokenizer(ckpt, zoo.zoo_texts(100, seed=1), "bert")
    config = zoo._config("bert", "embedding", special)
    torch.manual_seed(0)
    transformers.BertModel(config).eval().save_pretrained(str(ckpt))
    tok = json.loads((ckpt / "tokenizer.json").read_text())
    tok["normalizer"] = {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                         "strip_accents": None, "lowercase": False}  # cased: only do_lower_case lowercases
    (ckpt / "tokenizer.json").write_text(json.dumps(tok))
    tc = json.loads((ckpt / "tokenizer_config.json").read_text()) if (ckpt / "tokenizer_config.json").is_file() else {}
    tc.update(model_max_length=512, do_lower_case=False)
    (ckpt / "tokenizer_config.json").write_text(json.dumps(tc))
    (ckpt / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_SEQ, "do_lower_case": True}))
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": zoo.HIDDEN,
                                                                f"pooling_mode_{pooling}": True}))
    (root / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "" if layout == "root" else "0_Transformer",
         "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    return ckpt


def _reference(ckpt: Path, texts: list[str], pooling: str) -> np.ndarray:
    """What sentence-transformers computes: each text lowercased, tokenized and truncated at MAX_SEQ tokens
    (special tokens kept), the encoder, then the pooling."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    model = transformers.BertModel.from_pretrained(str(ckpt)).eval()
    out = []
    for t in texts:
        ids = tok.encode(t.lower()).ids
        ids = ids if len(ids) <= MAX_SEQ else ids[: MAX_SEQ - 1] + ids[-1:]
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                           token_type_ids=torch.zeros(1, len(ids), dtype=torch.long)).last_hidden_state[0]
        out.append((hidden.mean(0) if pooling == "mean_tokens" else hidden[-1]).numpy())
    return np.stack(out)


@pytest.mark.parametrize(("layout", "pooling"), [("root", "mean_tokens"), ("module folder", "lasttoken")])
def test_sentence_bert_config_and_pooling_are_honoured(tmp_path: Path, layout: str, pooling: str) -> None:
    import calibkit as ck
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.enginefiles.registry import model_runner

    ckpt = _old_st_folder(tmp_path / "st", layout, pooling)
    result = ck.export(tmp_path / "st", tmp_path / "model")
    assert (result.source.max_seq_length, result.source.lowercase) == (MAX_SEQ, True)
    texts = [t.upper() + " " + t for t in zoo.zoo_texts(6, seed=7)]  # longer than 8 tokens, upper case
    tok = TextTokenizer(tmp_path / "model")
    assert tok.max_length == MAX_SEQ
    feeds = tok.encode(texts).feeds(list(result.inputs))
    with model_runner(result.model_path, output_names=[result.output]) as runner:
        got = runner.infer(feeds)[result.output]
    assert np.abs(got - _reference(ckpt, texts, pooling)).max() < 1e-4
    shutil.rmtree(tmp_path / "model")


def test_a_max_seq_length_that_is_no_number_of_tokens_is_refused(tmp_path: Path) -> None:
    from calibkit.errors import ModelError
    from calibkit.exporter import resolve_source

    ckpt = _old_st_folder(tmp_path / "st", "root", "mean_tokens")
    (ckpt / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": "256"}))
    with pytest.raises(ModelError, match="max_seq_length '256'"):
        resolve_source(tmp_path / "st")


@pytest.mark.parametrize("what", ["hidden_size", "labels"])
def test_a_config_json_that_does_not_match_the_weights_is_named(tmp_path: Path, what: str) -> None:
    import calibkit as ck
    from calibkit.errors import ModelError

    folder = tmp_path / "hf"
    special = zoo._train_tokenizer(folder, zoo.zoo_texts(100, seed=1), "bert")
    config = zoo._config("bert", "classification", special)
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).eval().save_pretrained(str(folder))
    cfg = json.loads((folder / "config.json").read_text())
    if what == "hidden_size":
        cfg["hidden_size"] *= 2
        match = rf"hidden_size {cfg['hidden_size']} in config.json, {zoo.HIDDEN} in model.safetensors"
    else:
        n = len(cfg["id2label"]) + 2
        cfg.update(id2label={str(i): f"l{i}" for i in range(n)}, num_labels=n)
        cfg.pop("label2id", None)
        match = rf"the number of labels {n} in config.json, {n - 2} in model.safetensors \(classifier.weight\)"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match=match):
        ck.export(folder, tmp_path / "model")
    assert not (tmp_path / "model").exists()
