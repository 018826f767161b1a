"""Tiny text-classifier model folders for the calibration tests (onnx.helper + a word-level tokenizer)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from calibkit.results.files import ManifestSource, SampleRecord

WORDS = ["good", "bad", "movie", "film", "great", "awful", "plot", "actors", "fun", "dull", "very", "not"]


def write_tokenizer(folder: Path, max_positions: int = 16) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{w: i + 4 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tok.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(
        json.dumps({"max_position_embeddings": max_positions, "id2label": {"0": "negative", "1": "positive"}})
    )


def tiny_model(vocab: int = len(WORDS) + 4, dim: int = 8, seed: int = 0, zero_branch: bool = False) -> onnx.ModelProto:
    """ids -> Gather -> MatMul -> self-attention with a -inf key mask (Where) -> MatMul -> mean -> Gemm."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.normal(size=(vocab, dim)).astype(np.float32), "emb"),
        numpy_helper.from_array(rng.normal(size=(dim, dim)).astype(np.float32) / 3, "W1"),
        numpy_helper.from_array(rng.normal(size=(dim, dim)).astype(np.float32) / 3, "W2"),
        numpy_helper.from_array(rng.normal(size=(dim, 2)).astype(np.float32), "Wc"),
        numpy_helper.from_array(np.zeros(2, np.float32), "bc"),
        numpy_helper.from_array(np.array(-np.inf, np.float32), "neg_inf"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        numpy_helper.from_array(np.zeros((dim, dim), np.float32), "Wzero"),
    ]
    nodes = [
        helper.make_node("Gather", ["emb", "input_ids"], ["E"], name="embed"),
        helper.make_node("MatMul", ["E", "W1"], ["H"], name="proj"),
        helper.make_node("Transpose", ["H"], ["Ht"], perm=[0, 2, 1], name="transpose"),
        helper.make_node("MatMul", ["H", "Ht"], ["S"], name="scores"),
        helper.make_node("Cast", ["attention_mask"], ["mb"], to=TensorProto.BOOL, name="cast"),
        helper.make_node("Unsqueeze", ["mb", "axis1"], ["mb3"], name="unsq"),
        helper.make_node("Where", ["mb3", "S", "neg_inf"], ["S2"], name="mask"),
        helper.make_node("Softmax", ["S2"], ["P"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["P", "H"], ["C"], name="context"),
        helper.make_node("MatMul", ["C", "W2"], ["O"], name="out_proj"),
        helper.make_node("ReduceMean", ["O"], ["pooled"], axes=[1], keepdims=0, name="pool"),
        helper.make_node("Gemm", ["pooled", "Wc", "bc"], ["logits"], name="classifier"),
    ]
    if zero_branch:
        nodes += [
            helper.make_node("MatMul", ["E", "Wzero"], ["Z"], name="zero_proj"),
            helper.make_node("MatMul", ["Z", "W2"], ["Z2"], name="zero_use"),
            helper.make_node("ReduceSum", ["Z2"], ["z_sum"], keepdims=0, name="zero_sum"),
        ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])]
    if zero_branch:
        outputs.append(helper.make_tensor_value_info("z_sum", TensorProto.FLOAT, []))
    graph = helper.make_graph(
        nodes,
        "tiny",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        outputs,
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_model_dir(folder: Path, max_positions: int = 16, **kw: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(tiny_model(**kw), str(folder / "model.onnx"))  # type: ignore[arg-type]
    write_tokenizer(folder, max_positions)
    return folder


def texts(n: int, seed: int = 0, max_words: int = 10) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, max_words + 1)))) for _ in range(n)]


def sample_record(folder: Path, source: str | Path | ManifestSource | None = None, **fields: object) -> SampleRecord:
    """What ``calibkit sample`` records in a manifest (a real draw of a few texts from a log written in
    ``folder``), with ``source`` (the log it names: a path, or a ManifestSource) and the record's other
    ``fields`` replaced where given: for sets whose texts came from elsewhere but whose manifest names a log."""
    from dataclasses import replace

    from calibkit.data.sample_pipeline import draw_sample
    from calibkit.requests.sample import SampleRequest

    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "drawn-from.jsonl"
    log.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(40, seed=11)), encoding="utf-8")
    record = draw_sample(SampleRequest(logs=log, size=8, clusters=2)).record
    if isinstance(source, (str, Path)):
        size = Path(source).stat().st_size if Path(source).is_file() else None
        source = ManifestSource(path=str(source), size_bytes=size, sha256="", gzip=False)
    return replace(record, **({"source": source} if source is not None else {}), **fields)
