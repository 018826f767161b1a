"""`calibkit smooth`: per-channel activation statistics of the calibration set -> a smoothed FP32 model folder.

The folder is a model folder like the input (model.onnx, the tokenizer and config files copied, no other
.onnx) plus ``smoothing.json``; calibrate, build, compare and tune take it as they take the original. Before it
is written, the smoothed model is run beside the original on calibration texts and refused if their outputs
differ by more than float rounding. See calibkit.quantize.smooth for the transformation."""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from calibkit._io import atomic_dir, record_path, write_json
from calibkit._version import __version__
from calibkit.data.calibset import CalibrationSet, load_calibration_set
from calibkit.data.encode import DEFAULT_MEMORY_BUDGET, TokenBudget
from calibkit.data.modeldir import ModelDir
from calibkit.errors import CalibrationError, ModelError
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress
from calibkit.provenance import PATHS_RELATIVE, SMOOTHING_JSON
from calibkit.quantize.qdq import save_model, weightless_copy
from calibkit.quantize.smooth import (
    METADATA_KEY,
    GroupChoice,
    SmoothGroup,
    apply_smoothing,
    choose_scales,
    find_groups,
)
from calibkit.requests.smooth import SmoothRequest
from calibkit.resources import Resources
from calibkit.results.codec import SMOOTHING_FORMAT, document_json
from calibkit.results.files import SmoothedActivation, SmoothingRecord
from calibkit.results.runs import finite

if TYPE_CHECKING:  # pragma: no cover - types only
    import onnx

log = logging.getLogger("calibkit.calibrate.smoothing")

SMOOTHING_FILE = SMOOTHING_JSON  # the record a smoothed model folder holds
ROW_BYTES = 128 << 20  # sampled rows of every smoothed activation together (float32), for the alpha search
MAX_ROWS = 1024  # per activation
MIN_ROWS = 64
EQUIVALENCE_TEXTS = 32
EQUIVALENCE_TOLERANCE = 1e-3  # max |smoothed - original| / max |original| over the outputs
# files a model folder carries besides its .onnx (copied so the smoothed folder is a model folder of its own)
_FOLDER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
                 "vocab.json", "merges.txt", "spm.model", "sentencepiece.bpe.model", "added_tokens.json")



@dataclass(frozen=True)
class ChannelStats:
    absmax: dict[str, np.ndarray]  # per input channel, over every real token
    rows: dict[str, np.ndarray]  # sampled real-token rows [n, K]
    texts: int
    tokens: int
    skipped: tuple[str, ...] = ()  # activations laid out otherwise (channels not last): left unsmoothed


@dataclass(frozen=True)
class SmoothResult:
    out_dir: Path
    model_path: Path
    choices: tuple[GroupChoice, ...]
    groups: int
    max_deviation: float
    alpha: float | None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def smoothed(self) -> tuple[GroupChoice, ...]:
        return tuple(c for c in self.choices if c.scale is not None)


def _token_rows(x: np.ndarray, mask: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Real-token rows of ``x`` [n, K] and their (text, position) grid index, or None when the layout is not
    [batch, seq, K] or [batch, K]."""
    b, s = mask.shape
    if x.ndim == 3 and x.shape[:2] == (b, s) and x.shape[2] == k:
        return x[mask], np.argwhere(mask)
    if x.ndim == 2 and x.shape == (b, k):
        return x, np.stack([np.arange(b), np.zeros(b, dtype=np.int64)], axis=1)
    if x.ndim == 2 and x.shape == (b * s, k):  # tokens flattened before the MatMul
        return x[mask.reshape(-1)], np.argwhere(mask)
    return None


def _keep(text_idx: np.ndarray, pos: np.ndarray, q: float) -> np.ndarray:
    """A deterministic share ``q`` of (text, position) pairs: the same rows whatever the batches."""
    u = (text_idx * 0.6180339887498949 + pos * 0.7548776662466927) % 1.0
    return u < q


def channel_stats(proto: onnx.ModelProto, groups: Sequence[SmoothGroup], model_dir: ModelDir, texts: Sequence[str], *,
                  budget: TokenBudget | None = None, batch_size: int = 32, serialized: bytes | None = None,
                  progress: ProgressCallback | None = None) -> ChannelStats:
    from calibkit.calibrate.collect import _output_of, probe_cost, tapped_runner
    from calibkit.data.encode import bucketed_batches
    from calibkit.data.tokenizer import TextTokenizer

    cb = progress or no_progress
    tensors = [g.tensor for g in groups]
    inits = {i.name: i for i in proto.graph.initializer}
    width = {g.tensor: int(inits[g.weights[0]].dims[g.axes[0]]) for g in groups}
    rows_each = int(np.clip(ROW_BYTES // max(1, 4 * sum(width.values())), MIN_ROWS, MAX_ROWS))
    tok = TextTokenizer(model_dir.tokenizer_path, max_length=model_dir.max_length)
    input_names = [i.name for i in proto.graph.input if i.name not in inits]
    budget = budget if budget is not None else TokenBudget(memory_bytes=DEFAULT_MEMORY_BUDGET)
    batches = bucketed_batches(tok, texts, input_names, batch_size=batch_size, budget=budget)
    q = min(1.0, rows_each / max(1, batches.tokens))
    absmax: dict[str, np.ndarray] = {}
    rows: dict[str, list[np.ndarray]] = {t: [] for t in tensors}
    skipped: set[str] = set()
    runner = tapped_runner(proto, tensors, serialized=serialized)
    with runner:
        first = next(iter(batches), None)
        if first is None:
            raise CalibrationError("the calibration set is empty", hint="create one with `calibkit sample`")
        _, cost = probe_cost(runner, first.feeds, first.mask, tensors)
        stream = batches.priced(cost) if cost is not None else batches
        total = len(stream)
        cb(ProgressEvent("channel statistics", 0, total))
        for done, batch in enumerate(stream, 1):
            out = runner.infer(batch.feeds)
            for t in tensors:
                if t in skipped:
                    continue
                got = _token_rows(np.asarray(_output_of(out, t)), batch.mask, width[t])
                if got is None:
                    skipped.add(t)
                    log.info("activation %s is not laid out [batch, sequence, channels]: not smoothed", t)
                    continue
                r, grid = got
                a = np.abs(r)
                a = np.where(np.isfinite(a), a, 0.0).max(axis=0, initial=0.0).astype(np.float32)
                absmax[t] = a if t not in absmax else np.maximum(absmax[t], a)
                sel = _keep(batch.indices[grid[:, 0]], grid[:, 1], q)
                if sel.any():
                    picked = r[sel].astype(np.float32)
                    rows[t].append(np.where(np.isfinite(picked), picked, 0.0))
            del out
            cb(ProgressEvent("channel statistics", done, total))
    for t in skipped:
        absmax.pop(t, None)
    return ChannelStats(absmax, {t: np.concatenate(v)[:rows_each] if v else np.zeros((0, width[t]), np.float32)
                                 for t, v in rows.items() if t not in skipped}, batches.num_texts, batches.tokens,
                        tuple(sorted(skipped)))


def _outputs(model: Path | bytes, name: str, model_dir: ModelDir, texts: Sequence[str]) -> list[dict[str, Any]]:
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.enginefiles.registry import model_runner

    tok = TextTokenizer(model_dir.tokenizer_path, max_length=model_dir.max_length)
    with model_runner(model, name=name) as r:
        names = [s.name for s in r.input_specs]
        return [dict(r.infer(tok.encode(texts[i:i + 8]).feeds(names))) for i in range(0, len(texts), 8)]


def _max_deviation(smoothed: Path, model_dir: ModelDir, texts: Sequence[str]) -> float:
    """The largest |smoothed - original| over every output, relative to the original's max |output|; one model
    loaded at a time (the original from its file)."""
    ref = _outputs(model_dir.onnx_path, "fp32", model_dir, texts)
    got = _outputs(smoothed, "fp32-smoothed", model_dir, texts)
    worst = 0.0
    for ra, rb in zip(ref, got, strict=True):
        for k, va in ra.items():
            va, vb = np.asarray(va, np.float64), np.asarray(rb[k], np.float64)
            scale = float(np.max(np.abs(va), initial=0.0)) or 1.0
            worst = max(worst, float(np.max(np.abs(va - vb), initial=0.0)) / scale)
    return worst


def _equivalence_texts(texts: Sequence[str]) -> list[str]:
    """Spread over the lengths: every k-th text of the set sorted by length (long texts included)."""
    order = sorted(range(len(texts)), key=lambda i: (len(texts[i]), i))
    step = max(1, len(order) // EQUIVALENCE_TEXTS)
    return [texts[i] for i in order[::step][:EQUIVALENCE_TEXTS]]


def smooth(request: SmoothRequest, resources: Resources = Resources()) -> SmoothResult:
    """Write a smoothed copy of the request's model into its ``out`` (atomically), the activations measured on its
    calibration set in batches of ``resources.budget`` (the model folder and the set are loaded here when the
    request names them by path)."""
    from calibkit.calibrate.pipeline import load_hashed, model_dir_of

    model_dir, cset, alpha = model_dir_of(request), request.calibration_set, request.fixed_alpha
    cset = cset if isinstance(cset, CalibrationSet) else load_calibration_set(cset)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    proto, sha, data = load_hashed(model_dir.onnx_path)
    if any(p.key == METADATA_KEY for p in proto.metadata_props):
        raise ModelError(f"{model_dir.onnx_path} is already smoothed by calibkit",
                         hint="smooth the original model again instead of smoothing twice")
    groups = find_groups(proto)
    if not groups:
        raise ModelError("no MatMul/Gemm with a constant 2-D float weight: nothing to smooth",
                         hint="calibrate the model as it is")
    lean = bool(data)  # the file alone is the model: ONNX Runtime gets its bytes, we keep no weights meanwhile
    stats_model = weightless_copy(proto) if lean else proto
    if lean:
        del proto
    stats = channel_stats(stats_model, groups, model_dir, cset.texts, budget=resources.budget,
                          batch_size=request.batch_size, serialized=data.pop() if data else None,
                          progress=resources.progress)
    del stats_model
    timings["statistics"] = time.perf_counter() - t0
    if lean:
        proto, again, reread = load_hashed(model_dir.onnx_path)
        reread.clear()
        if again != sha:
            raise ModelError(f"{model_dir.onnx_path} changed while smooth was reading its statistics",
                             hint="run calibkit smooth again once the file is no longer being written")
    t = time.perf_counter()
    from onnx import numpy_helper

    wanted = {w for g in groups for w in g.weights}
    weights = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer if i.name in wanted}
    choices = choose_scales(groups, weights, stats.absmax, stats.rows, alpha)
    del weights
    timings["alpha search"] = time.perf_counter() - t
    meta = {"format": SMOOTHING_FORMAT, "alpha": "auto" if alpha is None else alpha, "source_sha256": sha,
            "calibration_set_id": cset.id}
    smoothed = apply_smoothing(proto, groups, choices, metadata=json.dumps(meta, sort_keys=True), in_place=True)
    del proto
    out = Path(request.out)
    src_folder = model_dir.onnx_path.parent
    with atomic_dir(out, what="smooth") as tmp:
        save_model(smoothed, tmp / "model.onnx")  # weights written from their buffers: no serialized copy
        del smoothed
        t = time.perf_counter()
        # one model in memory at a time, each read from its file; a refusal leaves nothing behind
        deviation = _max_deviation(tmp / "model.onnx", model_dir, _equivalence_texts(cset.texts))
        timings["equivalence check"] = time.perf_counter() - t
        if not np.isfinite(deviation) or deviation > EQUIVALENCE_TOLERANCE:
            raise ModelError(
                f"the smoothed model's outputs differ from the original's by {deviation:.3g} of their range "
                f"(more than float rounding, {EQUIVALENCE_TOLERANCE:g}); nothing was written",
                hint="calibrate the original model without smoothing, and report the model to calibkit")
        for folder in dict.fromkeys([src_folder, model_dir.tokenizer_path if model_dir.tokenizer_path.is_dir()
                                     else model_dir.tokenizer_path.parent]):
            for name in _FOLDER_FILES:
                if (folder / name).is_file() and not (tmp / name).exists():
                    shutil.copyfile(folder / name, tmp / name)
        timings["total"] = time.perf_counter() - t0
        write_json(tmp / SMOOTHING_FILE, document_json(SmoothingRecord(
            alpha="auto" if alpha is None else alpha, source_sha256=sha, calibration_set_id=cset.id,
            calibkit=__version__, paths=PATHS_RELATIVE,
            source_model=record_path(tmp / SMOOTHING_FILE, model_dir.onnx_path),  # read by document_path
            texts=stats.texts, tokens=stats.tokens, sampled_rows={t: int(len(r)) for t, r in stats.rows.items()},
            groups=len(groups), smoothed=sum(c.scale is not None for c in choices),
            not_smoothed_layout=tuple(stats.skipped), max_output_deviation=deviation,
            layers=tuple(SmoothedActivation(
                tensor=c.tensor, alpha=c.alpha, error_before=finite(c.error_before), error_after=finite(c.error_after),
                gain_db=round(c.gain_db, 3), scale_min=None if c.scale is None else float(c.scale.min()),
                scale_max=None if c.scale is None else float(c.scale.max())) for c in choices),
            timings={k: round(v, 3) for k, v in timings.items()})))
    return SmoothResult(out, out / "model.onnx", tuple(choices), len(groups), deviation, alpha, timings)
