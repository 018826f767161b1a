"""A zoo of tiny random-initialised transformers, built at test time the way users export theirs.

Each entry is a model folder as calibkit expects it (model.onnx, tokenizer.json + tokenizer_config.json with
``model_max_length``, config.json), built from a ``transformers`` config (2 layers, hidden 32), with a tokenizer
trained on the zoo's texts, and exported with the legacy TorchScript exporter, the dynamo exporter or the legacy
export run through ONNX Runtime's transformer optimizer (fused Attention, SkipLayerNormalization, ...).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

OPSET = 17
HIDDEN = 32
LAYERS = 2
HEADS = 2
MAX_TOKENS = 64  # model_max_length of every zoo tokenizer
NUM_LABELS = 3
INIT_RANGE = 0.2
TOKEN_LABELS = ("O", "B-ENT", "I-ENT")


@dataclass(frozen=True)
class ZooModel:
    name: str  # e.g. "bert-cls-dynamo"
    family: str  # bert | distilbert | roberta | deberta-v2 | electra
    exporter: str  # legacy | dynamo | ort-fused
    task: str  # classification | embedding | token-classification
    folder: Path

    @property
    def onnx_path(self) -> Path:
        return self.folder / "model.onnx"


# name -> (family, head, exporters)
SPECS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "bert-cls": ("bert", "classification", ("legacy", "dynamo", "ort-fused")),
    "distilbert-cls": ("distilbert", "classification", ("legacy",)),
    "roberta-cls": ("roberta", "classification", ("legacy", "dynamo")),
    "deberta-v2-cls": ("deberta-v2", "classification", ("legacy",)),
    "electra-cls": ("electra", "classification", ("legacy",)),
    "bert-encoder": ("bert", "embedding", ("legacy", "dynamo")),
    "bert-token": ("bert", "token-classification", ("legacy",)),
}

_WORDS = (
    "the a an movie film plot actor scene music story ending start great good fine bad awful boring slow fast "
    "love hate like enjoyed watched again never always maybe quite very really truly somewhat long short funny "
    "sad dark bright city river mountain paris london berlin anna bob carla david monday friday night morning "
    "price ticket seat screen sound light camera director writer cast role voice song dance fight chase"
).split()


def zoo_texts(n: int = 160, seed: int = 0) -> list[str]:
    """Seeded pseudo-sentences, 3 to 90 words (a few exceed the 64-token limit)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(3, 24)) if i % 10 else int(rng.integers(60, 90))
        out.append(" ".join(rng.choice(_WORDS, size=k)) + ".")
    return out


def _train_tokenizer(folder: Path, texts: list[str], family: str) -> dict[str, int]:
    """A WordPiece tokenizer learnt from ``texts``: BERT-style specials ([PAD]=0) or RoBERTa-style ones (<s>=0,
    <pad>=1, </s>=2, which give RoBERTa its position offset). Returns the special ids and the vocabulary size.

    The vocabulary is built here, not by ``tokenizers``' trainers: those break frequency ties in hash order, so
    two builds of the zoo would differ. Characters and ``##`` continuations of every character, plus the 50
    most frequent words (ties alphabetical): rarer words split into pieces, as with a real vocabulary.
    """
    import re
    from collections import Counter

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    if family == "roberta":
        specials = ["<s>", "<pad>", "</s>", "<unk>"]
        bos, pad, eos, unk = specials
    else:
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        pad, unk, bos, eos = specials[:4]
    words = Counter(w for t in texts for w in re.findall(r"\w+|[^\w\s]", t.lower()))
    chars = sorted({c for w in words for c in w})
    frequent = [w for w, _ in sorted(words.items(), key=lambda kv: (-kv[1], kv[0]))[:50] if len(w) > 1]
    vocab: dict[str, int] = {}
    for token in [*specials, *chars, *(f"##{c}" for c in chars), *frequent]:
        vocab.setdefault(token, len(vocab))
    tok = Tokenizer(models.WordPiece(vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", special_tokens=[(bos, vocab[bos]), (eos, vocab[eos])]
    )
    config = {"model_max_length": MAX_TOKENS, "pad_token": pad, "unk_token": unk}
    special = {"pad": vocab[pad], "bos": vocab[bos], "eos": vocab[eos]}
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    special["vocab"] = tok.get_vocab_size()
    return special


def _config(family: str, head: str, special: dict[str, int]):  # type: ignore[no-untyped-def]
    import transformers as tf

    # eager attention: the pattern ONNX Runtime's optimizer fuses into Attention (SDPA exports do not fuse).
    # initializer_range 0.2, not the default 0.02: at 0.02 the pooled vectors of different texts differ by less
    # than one INT8 step of the classifier input (top principal component std 0.0008 vs step 0.0023 for BERT):
    # the model carries less text information than INT8 resolves and every text gets the same class. At 0.2 the
    # spread is 30-60 steps.
    common = {"vocab_size": special["vocab"], "pad_token_id": special["pad"], "attn_implementation": "eager",
              "initializer_range": INIT_RANGE}
    if head == "classification":
        common["id2label"] = {i: f"class_{i}" for i in range(NUM_LABELS)}
    elif head == "token-classification":
        common["id2label"] = dict(enumerate(TOKEN_LABELS))
    if family == "distilbert":
        return tf.DistilBertConfig(dim=HIDDEN, hidden_dim=4 * HIDDEN, n_layers=LAYERS, n_heads=HEADS,
                                   max_position_embeddings=MAX_TOKENS, **common)
    sizes = {"hidden_size": HIDDEN, "intermediate_size": 4 * HIDDEN, "num_hidden_layers": LAYERS,
             "num_attention_heads": HEADS}
    if family == "roberta":
        # the RoBERTa position table is offset by pad_token_id + 1: 64 usable positions need 66 rows
        return tf.RobertaConfig(**sizes, max_position_embeddings=MAX_TOKENS + special["pad"] + 1,
                                bos_token_id=special["bos"], eos_token_id=special["eos"], type_vocab_size=1,
                                **common)
    if family == "deberta-v2":
        return tf.DebertaV2Config(**sizes, max_position_embeddings=MAX_TOKENS, type_vocab_size=0,
                                  relative_attention=True, position_buckets=16, max_relative_positions=MAX_TOKENS,
                                  pos_att_type=["p2c", "c2p"], **common)
    if family == "electra":
        return tf.ElectraConfig(embedding_size=HIDDEN, **sizes, max_position_embeddings=MAX_TOKENS, **common)
    return tf.BertConfig(**sizes, max_position_embeddings=MAX_TOKENS, **common)


def _module(family: str, head: str, config):  # type: ignore[no-untyped-def]
    import transformers as tf

    if head == "embedding":
        return _encoder_class()(tf.AutoModel.from_config(config), family)
    if head == "token-classification":
        return tf.AutoModelForTokenClassification.from_config(config)
    return tf.AutoModelForSequenceClassification.from_config(config)


def _encoder_class():  # type: ignore[no-untyped-def]
    import torch

    class Encoder(torch.nn.Module):
        """A bare encoder under the attribute its family uses (``bert``): the legacy exporter cannot trace
        ``BertModel.forward``'s keyword-only cache arguments directly."""

        def __init__(self, inner, family: str) -> None:  # type: ignore[no-untyped-def]
            super().__init__()
            self.family = family
            self.add_module(family.replace("-", "_"), inner)
            self.config = inner.config

        def forward(self, input_ids, attention_mask, token_type_ids=None):  # type: ignore[no-untyped-def]
            inner = getattr(self, self.family.replace("-", "_"))
            out = inner(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                        return_dict=True)
            return out.last_hidden_state, out.pooler_output

    return Encoder


def _input_names(family: str, config) -> list[str]:  # type: ignore[no-untyped-def]
    if family == "distilbert" or getattr(config, "type_vocab_size", 1) == 0:
        return ["input_ids", "attention_mask"]
    return ["input_ids", "attention_mask", "token_type_ids"]


def _export(module, names: list[str], outputs: list[str], path: Path, dynamo: bool, pad: int,  # type: ignore[no-untyped-def]
            token_level: bool) -> None:
    import torch

    ids = torch.tensor([[2, 11, 12, 13, 14, 3], [2, 15, 16, 3, pad, pad]], dtype=torch.long)
    mask = (ids != pad).long()
    example = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    kwargs = {n: example[n] for n in names}

    # the Hugging Face module itself, keyword inputs, tuple outputs: node names / name scopes as users get them
    module.config.return_dict = False
    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    for o in outputs:
        axes[o] = {0: "batch", 1: "sequence"} if o == "last_hidden_state" or token_level else {0: "batch"}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if dynamo:
            batch, seq = torch.export.Dim("batch", min=1, max=1024), torch.export.Dim("sequence", min=2, max=4096)
            shapes = {n: {0: batch, 1: seq} for n in names}
            prog = torch.onnx.export(module, (), kwargs=kwargs, dynamo=True, opset_version=20, input_names=names,
                                     output_names=outputs, dynamic_shapes=shapes, verbose=False)
            prog.save(str(path))
        else:
            torch.onnx.export(module, (), str(path), kwargs=kwargs, dynamo=False, opset_version=OPSET,
                              input_names=names, output_names=outputs, dynamic_axes=axes, do_constant_folding=True)


def _ort_fuse(src: Path, dst: Path) -> None:
    from onnxruntime.transformers.optimizer import optimize_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = optimize_model(str(src), model_type="bert", num_heads=HEADS, hidden_size=HIDDEN, opt_level=1,
                             use_gpu=False, only_onnxruntime=False)
    opt.save_model_to_file(str(dst))


def _spread_head(module, texts: list[str], tokenizer_json: Path, pad: int, head: str, seed: int) -> None:  # type: ignore[no-untyped-def]
    """Re-draw the final Linear so predictions spread over the classes, as a trained head's do.

    A random head sees nearly the same vector for every text and predicts one class for all of them, so INT8
    "agreement" would be 100 % whatever the error. This head reads the top principal components of its input
    over the zoo texts (the directions in which texts differ most), scaled to unit variance and centred, so
    logits vary from text to text by a few units.
    """
    import torch
    from tokenizers import Tokenizer

    final = [m for m in module.modules() if isinstance(m, torch.nn.Linear)][-1]
    captured: list[torch.Tensor] = []
    hook = final.register_forward_hook(lambda _m, inputs, _o: captured.append(inputs[0].detach()))
    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.enable_truncation(MAX_TOKENS)
    tok.enable_padding(pad_id=pad)
    enc = tok.encode_batch(texts[:200])
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    with torch.no_grad():
        module(input_ids=ids, attention_mask=mask)
    hook.remove()
    x = captured[0].double()
    x = x[mask.bool()] if head == "token-classification" else x.reshape(-1, x.shape[-1])
    mu = x.mean(0)
    _u, sv, vt = torch.linalg.svd(x - mu, full_matrices=False)
    k = 4
    pcs = vt[:k] / (sv[:k, None] / len(x) ** 0.5)  # k unit-variance directions
    gen = torch.Generator().manual_seed(seed)
    w = 2.0 * torch.randn(final.out_features, k, generator=gen, dtype=torch.float64) @ pcs
    with torch.no_grad():
        final.weight.copy_(w.float())
        final.bias.copy_(-(w @ mu).float())


def build_family(root: Path, name: str, texts: list[str], seed: int = 0) -> dict[str, ZooModel]:
    """Every export of one zoo entry: {f"{name}-{exporter}": ZooModel}."""
    import torch

    family, head, exporters = SPECS[name]
    torch.manual_seed(seed)
    base = root / f"{name}-tokenizer"
    special = _train_tokenizer(base, texts, family)
    config = _config(family, head, special)
    module = _module(family, head, config).eval()
    if head != "embedding":
        _spread_head(module, texts, base / "tokenizer.json", special["pad"], head, seed)
    names = _input_names(family, config)
    if head == "embedding":
        outputs = ["last_hidden_state"] + (["pooler_output"] if family == "bert" else [])
    else:
        outputs = ["logits"]
    out: dict[str, ZooModel] = {}
    legacy: Path | None = None
    for exporter in exporters:
        folder = root / f"{name}-{exporter}"
        folder.mkdir(parents=True, exist_ok=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            (folder / f).write_bytes((base / f).read_bytes())
        config.to_json_file(str(folder / "config.json"))
        if exporter == "ort-fused":
            if legacy is None:
                raise ValueError("ort-fused needs the legacy export first")
            _ort_fuse(legacy, folder / "model.onnx")
        else:
            _export(module, names, outputs, folder / "model.onnx", exporter == "dynamo", special["pad"],
                    head == "token-classification")
            if exporter == "legacy":
                legacy = folder / "model.onnx"
        out[f"{name}-{exporter}"] = ZooModel(f"{name}-{exporter}", family, exporter, head, folder)
    return out


def build_zoo(root: Path, names: tuple[str, ...] = tuple(SPECS)) -> dict[str, ZooModel]:
    texts = zoo_texts(400, seed=1)
    zoo: dict[str, ZooModel] = {}
    for name in names:
        zoo.update(build_family(root, name, texts))
    return zoo


def write_texts(path: Path, texts: list[str], labels: list[str] | None = None) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            rec = {"text": t} if labels is None else {"text": t, "label": labels[i]}
            f.write(json.dumps(rec) + "\n")
    return path
