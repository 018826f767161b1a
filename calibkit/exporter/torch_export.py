"""The PyTorch half of ``calibkit export``: load a Hugging Face checkpoint (safetensors or PyTorch weights) with
its task head, or a sentence-transformers model with its pooling, export it with ``torch.onnx.export`` and run
it on the parity texts.

This module and :mod:`calibkit.demo.model` are the only modules of calibkit that import torch (through
``calibkit._deps.require``); it also imports transformers, to load the checkpoint. Everything else of the export
(what the source is, which task, the parity verdict, the folder) lives in :mod:`calibkit.exporter` without torch.
"""

from __future__ import annotations

import inspect
import logging
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from calibkit._deps import require
from calibkit.errors import ModelError

OPSET = 20  # what the dynamo exporter writes for the model zoo the tests run (tests/zoo.py)
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _torch() -> Any:
    return require("torch")


def versions() -> dict[str, str]:
    """The exporter's versions, recorded in the exported model."""
    import transformers

    return {"torch": str(_torch().__version__), "transformers": str(transformers.__version__)}


def _quiet() -> Any:
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    return level


def load_module(folder: Path, head: str, pooling: str | None = None, normalize: bool = False) -> Any:
    """The checkpoint in ``folder`` as a torch module in eval mode whose forward takes the token inputs by
    keyword and returns one tensor: ``head`` is "sequence-classification", "token-classification" (logits),
    "encoder" (last_hidden_state) or "sentence-embedding" (the encoder pooled by ``pooling``: mean, cls or max
    over real tokens, L2-normalised when ``normalize``)."""
    torch = _torch()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers as tf

    classes = {"sequence-classification": tf.AutoModelForSequenceClassification,
               "token-classification": tf.AutoModelForTokenClassification}
    level = _quiet()
    try:
        # eager attention: plain MatMul/Softmax/MatMul nodes, the attention INT8 placement quantizes and the
        # pattern ONNX Runtime's optimizer fuses (an SDPA export hides them)
        inner = classes.get(head, tf.AutoModel).from_pretrained(
            str(folder), attn_implementation="eager", dtype=torch.float32, local_files_only=True)
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as exc:
        _check_config_against_weights(folder)
        raise ModelError(f"cannot load the model in {folder}: {type(exc).__name__}: {exc}",
                         hint="the folder must be what save_pretrained writes: config.json and model.safetensors "
                              "or pytorch_model.bin") from None
    finally:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity(level)
    inner.eval()
    if head in classes:
        # the Hugging Face head itself, exported as users get it (its module paths name the ONNX nodes);
        # tuple outputs, the first being the logits
        inner.config.return_dict = False
        return inner
    return _Encoder.build(torch, inner, pooling, normalize)


def _check_config_against_weights(folder: Path) -> None:
    """A ModelError naming what config.json says against what model.safetensors holds (hidden size, number of
    labels), where they disagree: transformers' own message points to a report it does not show."""
    import json
    import struct

    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        with open(folder / "model.safetensors", "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(min(size, 100 << 20)))
    except (OSError, ValueError, struct.error):
        return
    if not isinstance(cfg, dict) or not isinstance(header, dict):
        return
    shapes = {k: v.get("shape") for k, v in header.items() if isinstance(v, dict)}
    embed = next(((k, s) for k, s in shapes.items() if k.endswith("word_embeddings.weight") and s), None)
    head = next(((k, s) for k, s in shapes.items()
                 if k.rsplit(".", 2)[-2:] in (["classifier", "weight"], ["out_proj", "weight"], ["score", "weight"])
                 and s), None)
    labels = cfg.get("id2label")
    wanted = len(labels) if isinstance(labels, dict) else cfg.get("num_labels")
    for what, said, found in (("hidden_size", cfg.get("hidden_size"), embed and (embed[0], embed[1][-1])),
                              ("the number of labels", wanted, head and (head[0], head[1][0]))):
        if found and isinstance(said, int) and said != found[1]:
            raise ModelError(f"{folder / 'config.json'} does not match its weights: {what} {said} in config.json, "
                             f"{found[1]} in model.safetensors ({found[0]})",
                             hint="restore the config.json saved with these weights (save_pretrained writes both)")


class _Encoder:
    @staticmethod
    def build(torch: Any, inner: Any, pooling: str | None, normalize: bool) -> Any:
        prefix = getattr(inner, "base_model_prefix", "") or "encoder"

        class Encoder(torch.nn.Module):
            """The encoder under its own prefix (``bert``), so node names read /bert/encoder/layer.0/..."""

            def __init__(self) -> None:
                super().__init__()
                self.add_module(prefix, inner)
                self.__dict__["wrapped"] = inner  # a plain reference, not a second registration

            def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any = None) -> Any:
                feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
                if token_type_ids is not None:
                    feeds["token_type_ids"] = token_type_ids
                hidden = getattr(self, prefix)(**feeds, return_dict=True).last_hidden_state
                if pooling is None:
                    return hidden
                mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
                if pooling == "cls":
                    pooled = hidden[:, 0]
                elif pooling == "max":
                    pooled = (hidden + (mask - 1.0) * 1e9).max(dim=1).values
                elif pooling == "lasttoken":  # the last token the mask keeps (calibkit pads on the right)
                    last = attention_mask.sum(dim=1) - 1
                    pooled = hidden[torch.arange(hidden.shape[0]), last]
                else:
                    pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                return torch.nn.functional.normalize(pooled, p=2.0, dim=1) if normalize else pooled

        return Encoder().eval()


def input_names(module: Any, config: Mapping[str, Any]) -> tuple[str, ...]:
    """The token inputs the model's forward takes (token_type_ids only where the config has token types)."""
    inner = getattr(module, "wrapped", module)
    params = inspect.signature(inner.forward).parameters
    names = [n for n in TOKEN_INPUTS if n in params]
    if "token_type_ids" in names and int(config.get("type_vocab_size", 1) or 0) < 1:
        names.remove("token_type_ids")
    if "input_ids" not in names or "attention_mask" not in names:
        raise ModelError(f"{type(inner).__name__}.forward takes neither input_ids nor attention_mask by name",
                         hint="calibkit exports text encoders that take input_ids and attention_mask")
    return tuple(names)


def _tensors(feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
    torch = _torch()
    return {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.int64)) for k, v in feeds.items()}


def export(module: Any, example: Mapping[str, np.ndarray], output: str, path: Path) -> None:
    """``torch.onnx.export`` (the dynamo exporter) with dynamic batch and sequence axes on every input, to one
    ONNX file at ``path``. ``example``: token inputs of at least two texts and three tokens (a size of 1 would
    be specialised into the graph)."""
    torch = _torch()
    names = list(example)
    batch = torch.export.Dim("batch", min=1, max=1024)
    seq = torch.export.Dim("sequence", min=2, max=4096)
    shapes = {n: {0: batch, 1: seq} for n in names}
    quiet = logging.getLogger("torch.onnx")  # "torchvision is not installed" and the like, per export
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # tracer and deprecation noise from torch/transformers
            program = torch.onnx.export(module, (), kwargs=_tensors(example), dynamo=True, opset_version=OPSET,
                                        input_names=names, output_names=[output], dynamic_shapes=shapes,
                                        verbose=False)
            program.save(str(path))
    except ModelError:
        raise
    except Exception as exc:  # the exporter raises many types; all mean the same to the user
        raise ModelError(f"torch.onnx.export failed: {type(exc).__name__}: {str(exc)[:2000]}",
                         hint="export the model to ONNX yourself (with dynamic batch and sequence axes) and pass "
                              "the .onnx file with --tokenizer") from None
    finally:
        quiet.setLevel(level)


def run(module: Any, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
    """The module's FP32 output on ``feeds`` (the reference the ONNX model is checked against)."""
    torch = _torch()
    with torch.inference_mode():
        out = module(**_tensors(feeds))
    return (out[0] if isinstance(out, (tuple, list)) else out).float().numpy()
