"""From the user's own model to the model folder calibkit reads: model.onnx (FP32, dynamic batch and sequence
axes, the task recorded) + the tokenizer + config.json.

Sources: a Hugging Face folder (``save_pretrained``: config.json with safetensors or PyTorch weights, any of the
heads calibkit judges), a sentence-transformers folder (modules.json: the transformer, its pooling, an optional
Normalize), or an ONNX file with its tokenizer (copied and checked, not re-exported). A checkpoint is exported
by :mod:`calibkit.exporter.torch_export` and the ONNX model is run by ONNX Runtime on probe texts at several batch
shapes beside the PyTorch model: the largest difference is reported, and past ``tolerance`` (relative to the
source's largest output) the folder is refused and nothing is written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from calibkit.errors import ModelError, UsageError
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress
from calibkit.requests.export import TASKS, ExportRequest, ExportSource, SourceKind

if TYPE_CHECKING:  # pragma: no cover - types only
    import onnx

EXPORT_KEY = "calibkit.export"  # ModelProto.metadata_props key: the task and the export's provenance
EXPORT_FORMAT = 1
_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json",
                   "merges.txt", "spm.model", "sentencepiece.bpe.model", "added_tokens.json")
_POOLING_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
                  "pooling_mode_max_tokens": "max", "pooling_mode_lasttoken": "lasttoken"}
# texts of several lengths, in batches of several shapes (none of them the export's example shape)
PROBE_TEXTS = (
    "Great movie.",
    "The plot was slow at the start, but the ending made up for it.",
    "I would not watch it again.",
    "Tickets for the Friday night show in Paris sold out within an hour of going on sale, and the director "
    "thanked the cast and crew in a long speech before the music started.",
    "ok",
    "Anna and Bob met in Berlin on a Monday morning to talk about the price of the seats, the sound and the light.",
)
_PROBE_BATCHES = (slice(0, 6), slice(4, 5), slice(0, 3))


@dataclass(frozen=True)
class Parity:
    """The exported FP32 model against its source on the probe texts."""

    max_abs_diff: float  # largest |ONNX - PyTorch| over every output value
    relative: float  # max_abs_diff / the source's largest |output|
    tolerance: float  # the refusal threshold on ``relative``
    texts: int
    shapes: tuple[tuple[int, int], ...]  # (batch, sequence) of each probe batch


@dataclass(frozen=True)
class ExportResult:
    out_dir: Path
    model_path: Path
    source: ExportSource
    task: str  # as calibkit's commands will read the folder (one of TASKS)
    head: str  # sequence-classification | token-classification | encoder | sentence-embedding | onnx
    inputs: tuple[str, ...]
    output: str
    parity: Parity | None  # None for an ONNX source (the file is copied, not re-exported)
    exporter: str
    seconds: float


# --------------------------------------------------------------------------------------------- the source


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise ModelError(f"cannot read {path}: {type(exc).__name__}: {exc}",
                         hint="it must be the JSON file transformers or sentence-transformers writes") from None


def _has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer.json").is_file() or (folder / "vocab.txt").is_file() or (
        (folder / "tokenizer_config.json").is_file() and any((folder / n).is_file() for n in TOKENIZER_FILES))


def _sentence_transformers(folder: Path) -> ExportSource:
    modules = _read_json(folder / "modules.json")
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ModelError(f"{folder / 'modules.json'} is not a list of modules",
                         hint="save the model with SentenceTransformer.save")
    # "sentence_transformers.models.Pooling" (v2-v5) or "sentence_transformers.sentence_transformer.modules.Pooling"
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    known = ("Transformer", "Pooling", "Normalize")
    other = [k for k in kinds if k not in known]
    if other or kinds[:2] != ["Transformer", "Pooling"] or kinds[2:] not in ([], ["Normalize"]):
        raise ModelError(f"{folder}: sentence-transformers modules {kinds}; calibkit exports Transformer, Pooling "
                         "and an optional Normalize" + (f" (not {', '.join(other)})" if other else ""),
                         hint="export the model to ONNX yourself, its pooled embedding as the output named "
                              "sentence_embedding, and pass the .onnx file with --tokenizer")
    checkpoint = folder / str(modules[0].get("path", ""))
    pool = _read_json(folder / str(modules[1].get("path", "")) / "config.json")
    pool = pool if isinstance(pool, dict) else {}
    mode = pool.get("pooling_mode")  # sentence-transformers 6: "mean", or a list of modes
    if isinstance(mode, str) or isinstance(mode, list) and all(isinstance(m, str) for m in mode):
        on = [mode] if isinstance(mode, str) else list(mode)
    else:  # earlier versions: one boolean per mode
        on = sorted(_POOLING_MODES.get(k, k) for k, v in pool.items() if k.startswith("pooling_mode_") and v)
    if len(on) != 1 or on[0] not in _POOLING_MODES.values():
        raise ModelError(f"{folder}: pooling {', '.join(on) or 'none'}; calibkit exports mean, CLS, max or last-token "
                         "pooling "
                         "(one of them)", hint="export the model to ONNX yourself and pass the .onnx file")
    if not (checkpoint / "config.json").is_file() or not any((checkpoint / w).is_file() for w in _WEIGHTS):
        raise ModelError(f"no transformer checkpoint in {checkpoint} (config.json and model.safetensors or "
                         "pytorch_model.bin)", hint="save the model with SentenceTransformer.save")
    tok = checkpoint if _has_tokenizer(checkpoint) else folder
    max_seq_length, lowercase = _transformer_settings(folder, checkpoint)
    return ExportSource(SourceKind.SENTENCE_TRANSFORMERS, folder, tok, checkpoint / "config.json", checkpoint,
                        on[0], kinds[2:] == ["Normalize"], max_seq_length, lowercase)


def _transformer_settings(folder: Path, checkpoint: Path) -> tuple[int | None, bool]:
    """``max_seq_length`` and ``do_lower_case`` of the Transformer module: its sentence_bert_config.json, in the
    module's own folder (``0_Transformer/``) or, where the module is the folder itself, at the root. Versions
    before 6 keep them only there (the tokenizer's model_max_length says 512 where the model reads 256)."""
    path = next((d / "sentence_bert_config.json" for d in (checkpoint, folder)
                 if (d / "sentence_bert_config.json").is_file()), None)
    if path is None:
        return None, False
    cfg = _read_json(path)
    cfg = cfg if isinstance(cfg, dict) else {}
    length, lower = cfg.get("max_seq_length"), cfg.get("do_lower_case", False)
    if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length < 1):
        raise ModelError(f"{path}: max_seq_length {length!r} is not a positive whole number of tokens",
                         hint="fix it (sentence-transformers writes e.g. 256), or remove it")
    if not isinstance(lower, bool):
        raise ModelError(f"{path}: do_lower_case {lower!r} is neither true nor false", hint="fix it, or remove it")
    return length, lower


def _apply_transformer_settings(src: ExportSource, folder: Path) -> None:
    """The exported tokenizer reads texts as the sentence-transformers model does: truncated at its
    max_seq_length (tokenizer_config.json's model_max_length) and, with do_lower_case, lowercased first (a
    Lowercase normalizer ahead of tokenizer.json's own, as sentence-transformers 6 saves it)."""
    if src.max_seq_length is None and not src.lowercase:
        return
    from calibkit._io import write_json

    cfg_path = folder / "tokenizer_config.json"
    cfg = _read_json(cfg_path) if cfg_path.is_file() else {}
    cfg = cfg if isinstance(cfg, dict) else {}
    if src.max_seq_length is not None:
        cfg["model_max_length"] = src.max_seq_length
    if src.lowercase:
        cfg["do_lower_case"] = True  # what a tokenizer without tokenizer.json reads
        if (folder / "tokenizer.json").is_file():
            from tokenizers import Tokenizer, normalizers

            tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
            inner = tok.normalizer
            tok.normalizer = normalizers.Sequence([normalizers.Lowercase(), inner]) if inner is not None else \
                normalizers.Lowercase()
            tok.save(str(folder / "tokenizer.json"))
    write_json(cfg_path, cfg)


def resolve_source(source: str | os.PathLike[str], tokenizer: str | os.PathLike[str] | None = None) -> ExportSource:
    """What ``source`` is: a sentence-transformers folder (modules.json), a Hugging Face checkpoint folder
    (config.json + weights) or an ONNX file (its tokenizer beside it or in ``tokenizer``)."""
    p = Path(source)
    tok = Path(tokenizer) if tokenizer is not None else None
    if p.is_dir() and (p / "modules.json").is_file():
        found = _sentence_transformers(p)
    elif p.is_dir() and (p / "config.json").is_file() and any((p / w).is_file() for w in _WEIGHTS):
        found = ExportSource(SourceKind.HUGGING_FACE, p, p, p / "config.json", p)
    elif p.is_file() and p.suffix == ".onnx" or p.is_dir() and (p / "model.onnx").is_file():
        onnx_path = p / "model.onnx" if p.is_dir() else p
        folder = onnx_path.parent
        cfg = next((c / "config.json" for c in (folder, tok) if c is not None and (c / "config.json").is_file()),
                   None)
        found = ExportSource(SourceKind.ONNX, onnx_path, tok or folder, cfg)
    elif p.is_dir():
        raise ModelError(f"{p} holds neither a Hugging Face checkpoint (config.json with model.safetensors or "
                         "pytorch_model.bin), a sentence-transformers model (modules.json) nor model.onnx",
                         hint="pass the folder save_pretrained wrote, or an .onnx file with --tokenizer")
    else:
        raise ModelError(f"model not found: {p}",
                         hint="pass a Hugging Face model folder, a sentence-transformers folder or an .onnx file")
    if tok is not None and found.kind is not SourceKind.ONNX:
        found = dataclasses.replace(found, tokenizer=tok)
    if not _has_tokenizer(found.tokenizer):
        raise ModelError(f"no tokenizer in {found.tokenizer} (tokenizer.json, or vocab.txt / the files "
                         "tokenizer_config.json names)",
                         hint="pass --tokenizer with the folder the model's tokenizer was saved to")
    return found


# --------------------------------------------------------------------------------------------- the task


def _labels(config: Mapping[str, Any]) -> int:
    raw = config.get("id2label")
    return len(raw) if isinstance(raw, Mapping) else int(config.get("num_labels", 2) or 2)


def plan_head(source: ExportSource, config: Mapping[str, Any], task: str | None) -> tuple[str, str, str]:
    """(head to load, task calibkit will read, output name) for a checkpoint; ``task`` forces one."""
    if task is not None and task not in TASKS:
        raise UsageError(f"unknown --task {task!r}", hint=f"choose {', '.join(TASKS)}")
    if source.kind is SourceKind.SENTENCE_TRANSFORMERS:
        if task not in (None, "embedding"):
            raise UsageError(f"a sentence-transformers model is an embedding model, not {task}",
                             hint="leave --task out")
        return "sentence-embedding", "embedding", "sentence_embedding"
    archs = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    arch = archs[0] if archs else ""
    problem = config.get("problem_type")
    if arch.endswith("ForSequenceClassification"):
        found = ("regression" if problem == "regression" or _labels(config) == 1 else
                 "multi-label" if problem == "multi_label_classification" else "classification")
        head = "sequence-classification"
    elif arch.endswith("ForTokenClassification"):
        found, head = "token-classification", "token-classification"
    elif not arch or ("For" not in arch and arch.endswith("Model")):
        found, head = "embedding", "encoder"
    else:
        found, head = "", ""
    if task == "embedding" and found != "embedding":
        return "encoder", "embedding", "last_hidden_state"  # the encoder of any head, its head left out
    if not found:
        raise ModelError(f"config.json names {arch}, a head calibkit does not judge (it judges classification, "
                         "regression, multi-label, token-classification and embedding models)",
                         hint="pass --task embedding to export its encoder (mean-pooled last hidden state)")
    if task is not None and task != found:
        tied = {"classification", "regression", "multi-label"}
        if not (task in tied and found in tied):
            raise UsageError(f"config.json names {arch or 'a bare encoder'}, a {found} model, not {task}",
                             hint="leave --task out, or pass --task embedding to export the encoder alone")
        found = task
    return head, found, "last_hidden_state" if head == "encoder" else "logits"


def _recorded_config(config: Mapping[str, Any], task: str) -> dict[str, Any]:
    """config.json as written into the folder: the source's, with problem_type saying a forced
    regression or multi-label reading (the key calibkit's task choice and transformers both read)."""
    from calibkit.tasks import TASKS, task_class

    out = dict(config)
    kind = task_class(task)
    others = {cls.problem_type for cls in TASKS.values()} - {None, kind.problem_type}
    if kind.problem_type is not None and (kind.problem_type_stated or out.get("problem_type") in others):
        out["problem_type"] = kind.problem_type
    return out


def _task_read(model_path: Path, config: Mapping[str, Any]) -> str:
    """The task calibkit's commands will read from the written folder (its outputs and config.json)."""
    from calibkit.graph import load_model
    from calibkit.tasks import choose_task, model_outputs

    return str(choose_task(model_outputs(load_model(model_path, load_external_data=False)), config).kind)


# --------------------------------------------------------------------------------------------- the folder


def _dynamic_axes(proto: onnx.ModelProto, where: Path) -> tuple[str, ...]:
    """The graph's inputs, each refused unless its batch and sequence axes are dynamic."""
    names = []
    for inp in proto.graph.input:
        dims = inp.type.tensor_type.shape.dim
        fixed = [f"{axis} {d.dim_value}" for axis, d in zip(("batch", "sequence"), dims) if d.HasField("dim_value")]
        if len(dims) != 2 or fixed:
            raise ModelError(f"{where}: input {inp.name} has " + (f"a fixed {' and '.join(fixed)}" if fixed else
                                                                   f"{len(dims)} axes, not [batch, sequence]"),
                             hint="calibkit forms batches of any size and length: export with dynamic batch and "
                                  "sequence axes, or pass the Hugging Face folder to calibkit export")
        names.append(inp.name)
    return tuple(names)


def _record(model_path: Path, meta: Mapping[str, Any]) -> None:
    """Write the export's record into the model's metadata_props (replacing an earlier one)."""
    import onnx

    proto = onnx.load(str(model_path), load_external_data=False)
    kept = [p for p in proto.metadata_props if p.key != EXPORT_KEY]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    proto.metadata_props.append(onnx.StringStringEntryProto(key=EXPORT_KEY, value=json.dumps(meta, sort_keys=True)))
    onnx.save(proto, str(model_path))


def _copy_onnx(src: Path, dest: Path) -> None:
    """The model file, and the external-data files it names (beside it, as onnx writes them)."""
    import onnx

    shutil.copyfile(src, dest)
    proto = onnx.load(str(src), load_external_data=False)
    tensors = [*proto.graph.initializer, *(t for n in proto.graph.node for a in n.attribute for t in [a.t] if a.t)]
    for t in tensors:
        for e in t.external_data:
            if e.key == "location" and not (dest.parent / e.value).exists():
                target = (dest.parent / e.value).resolve()
                if dest.parent.resolve() not in target.parents:
                    raise ModelError(f"{src}: external data {e.value!r} lies outside the model's folder",
                                     hint="save the model with its external data beside it")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src.parent / e.value, target)


def _probe(tokenizer: Path, config_dir: Path, inputs: tuple[str, ...]) -> list[dict[str, np.ndarray]]:
    from calibkit.data.tokenizer import TextTokenizer, sequence_limit

    tok = TextTokenizer(tokenizer, max_length=sequence_limit(tokenizer, config_dir).tokens)
    return [tok.encode(list(PROBE_TEXTS[s])).feeds(inputs) for s in _PROBE_BATCHES]


def _onnx_outputs(model_path: Path, output: str, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    from calibkit.enginefiles.registry import model_runner

    with model_runner(model_path, output_names=[output], name="exported") as runner:
        return [np.asarray(runner.infer(f)[output]) for f in feeds]


def _parity(reference: list[np.ndarray], exported: list[np.ndarray], feeds: list[dict[str, np.ndarray]],
            tolerance: float) -> Parity:
    worst, scale = 0.0, 0.0
    for ref, got in zip(reference, exported, strict=True):
        if ref.shape != got.shape:
            raise ModelError(f"the exported model's output has shape {got.shape}, the source's {ref.shape}",
                             hint="report the model to calibkit; export it to ONNX yourself meanwhile")
        a, b = ref.astype(np.float64), got.astype(np.float64)
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
            raise ModelError("the source or the exported model gives non-finite outputs on the probe texts",
                             hint="check the checkpoint's weights (NaN or inf)")
        worst = max(worst, float(np.max(np.abs(a - b), initial=0.0)))
        scale = max(scale, float(np.max(np.abs(a), initial=0.0)))
    shapes = tuple((int(f["input_ids"].shape[0]), int(f["input_ids"].shape[1])) for f in feeds)
    return Parity(worst, worst / (scale or 1.0), tolerance, sum(s[0] for s in shapes), shapes)


def export_model(request: ExportRequest, progress: ProgressCallback = no_progress) -> ExportResult:
    """Write the model folder ``request.out`` for ``request.source`` (atomically: a refused export leaves
    nothing)."""
    from calibkit._io import atomic_dir, write_json
    from calibkit._version import __version__

    task, tolerance, cb = request.task, request.tolerance, progress
    t0 = time.perf_counter()
    source = request.source
    src = source if isinstance(source, ExportSource) else resolve_source(source, request.tokenizer)
    config = _source_config(src)
    meta: dict[str, Any] = {"format": EXPORT_FORMAT, "calibkit": __version__, "source": str(src.path),
                            "source_kind": src.kind.value}
    out_dir = Path(request.out)
    with atomic_dir(out_dir, what="export") as tmp:
        model_path = tmp / "model.onnx"
        made = _write_model(src, config, task, model_path, meta, cb)
        inputs, output = _checked_graph(model_path, src.path, made.output)
        write_json(tmp / "config.json", made.recorded)
        for name in TOKENIZER_FILES:
            if (src.tokenizer / name).is_file():
                shutil.copyfile(src.tokenizer / name, tmp / name)
        _apply_transformer_settings(src, tmp)
        cb(ProgressEvent("export", 2, 3, message="parity"))
        parity = _checked_outputs(src, made.module, tmp, model_path, inputs, output, tolerance)
        if parity is not None:
            meta["parity"] = {"max_abs_diff": parity.max_abs_diff, "relative": parity.relative,
                              "tolerance": tolerance, "shapes": [list(s) for s in parity.shapes]}
        read = _task_read(model_path, made.recorded)
        wanted = task or (read if src.kind is SourceKind.ONNX else made.task)
        if read != wanted:
            raise ModelError(f"calibkit reads the exported model as a {read} model, not {wanted} (from its output "
                             f"{output!r} and config.json); nothing was written",
                             hint="leave --task out, or export the model with the head it serves")
        meta.update(task=read, head=made.head, output=output, inputs=list(inputs), exporter=made.exporter)
        _record(model_path, meta)
        cb(ProgressEvent("export", 3, 3))
    return ExportResult(out_dir, out_dir / "model.onnx", src, read, made.head, inputs, output, parity, made.exporter,
                        time.perf_counter() - t0)


def _source_config(src: ExportSource) -> dict[str, Any]:
    """The source's config.json (empty without one)."""
    if src.config is None:
        return {}
    raw = _read_json(src.config)
    if not isinstance(raw, dict):
        raise ModelError(f"{src.config} is not a JSON object", hint="it must be what transformers writes")
    return raw


@dataclass(frozen=True)
class _Written:
    """What :func:`_write_model` wrote: the head, the exporter, the output ("": the graph's first), the
    config.json to record, the task planned for a checkpoint and its loaded module (None for ONNX)."""

    head: str
    exporter: str
    output: str
    recorded: dict[str, Any]
    task: str | None = None
    module: Any = None


def _write_model(src: ExportSource, config: dict[str, Any], task: str | None, model_path: Path,
                 meta: dict[str, Any], cb: ProgressCallback) -> _Written:
    """``model_path``: the source's ONNX copied, or its checkpoint exported (``meta`` gets the exporter's
    versions and options)."""
    if src.kind is SourceKind.ONNX:
        cb(ProgressEvent("export", 0, 3, message="copy"))
        _copy_onnx(src.path, model_path)
        return _Written("onnx", "copied", "", _recorded_config(config, task) if task else config)
    import calibkit.exporter.torch_export as torch_export

    head, planned, output = plan_head(src, config, task)
    recorded = _recorded_config(config, planned)
    cb(ProgressEvent("export", 0, 3, message="load"))
    module = torch_export.load_module(src.checkpoint or src.path, head, src.pooling, src.normalize)
    inputs = torch_export.input_names(module, config)
    cb(ProgressEvent("export", 1, 3, message="torch.onnx.export"))
    example = _probe(src.tokenizer, src.checkpoint or src.path, inputs)[0]
    torch_export.export(module, {k: v[:2] for k, v in example.items()}, output, model_path)
    meta.update(torch_export.versions(), opset=torch_export.OPSET, pooling=src.pooling, normalize=src.normalize)
    return _Written(head, "torch.onnx.export (dynamo)", output, recorded, planned, module)


def _checked_graph(model_path: Path, where: Path, output: str) -> tuple[tuple[str, ...], str]:
    """(the model's inputs, each with dynamic batch and sequence axes; the output read: ``output``, or the
    graph's first when empty), refused when the model lacks that output."""
    import onnx

    proto = onnx.load(str(model_path), load_external_data=False)
    inputs = _dynamic_axes(proto, where)
    if not output:
        output = proto.graph.output[0].name if proto.graph.output else ""
    if output not in [o.name for o in proto.graph.output]:
        raise ModelError(f"the exported model has no output {output!r}",
                         hint="report the model to calibkit; export it to ONNX yourself meanwhile")
    return inputs, output


def _checked_outputs(src: ExportSource, module: Any, folder: Path, model_path: Path, inputs: tuple[str, ...],
                     output: str, tolerance: float) -> Parity | None:
    """The exported model on the probe texts: against its checkpoint (the parity, refused past ``tolerance``),
    or, copied from ONNX, refused when its outputs are not finite (None: no parity to record)."""
    feeds = _probe(folder, folder, inputs)
    got = _onnx_outputs(model_path, output, feeds)
    if src.kind is SourceKind.ONNX:
        if not all(np.all(np.isfinite(g)) for g in got):
            raise ModelError(f"{src.path} gives non-finite outputs on the probe texts",
                             hint="check the model's weights (NaN or inf)")
        return None
    import calibkit.exporter.torch_export as torch_export

    parity = _parity([torch_export.run(module, f) for f in feeds], got, feeds, tolerance)
    if parity.relative > tolerance:
        raise ModelError(
            f"the exported model's outputs differ from the source's by up to {parity.max_abs_diff:.3g} "
            f"({parity.relative:.3g} of the largest output, over the tolerance {tolerance:g}); nothing "
            "was written", hint="report the model to calibkit, or raise --tolerance if you accept it")
    return parity
