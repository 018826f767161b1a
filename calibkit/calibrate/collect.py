"""Run the model over calibration batches and stream every tapped tensor into mergeable statistics.

Padding: a padded position carries values production never sees (the model attends to nothing there, LayerNorm
normalises garbage), so it is excluded. Which axes of a tensor are the batch and sequence axes is found by two
tiny probe runs with distinct (batch, seq) sizes — (2, 13) and (3, 17) — so a static axis (12 heads, 32 head
dims) can never be mistaken for the sequence. A [b, s, ...] tensor keeps rows where the mask is set; an
attention tensor [b, h, s, s] keeps (query, key) pairs where both are real tokens. Tensors whose layout cannot be
read (batch folded into another axis by a Reshape) are observed unmasked and listed in ``meta["unmasked"]``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import onnx

from calibkit.calibrate.stats import StatsAccumulator, StatsStore
from calibkit.engines.base import BaseRunner
from calibkit.errors import BackendError, CalibrationError, UsageError
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress

log = logging.getLogger("calibkit.calibrate")

RunnerSource = Callable[[], BaseRunner] | str | os.PathLike[str] | bytes | onnx.ModelProto

_PROBES = ((2, 13), (3, 17))


@dataclass(frozen=True)
class TensorLayout:
    batch_axis: int | None
    seq_axes: tuple[int, ...]

    @property
    def maskable(self) -> bool:
        return self.batch_axis is not None and bool(self.seq_axes)


UNMASKED = TensorLayout(None, ())


def tapped_runner(model: str | os.PathLike[str] | bytes | onnx.ModelProto, tensors: Sequence[str]) -> BaseRunner:
    """An ONNX Runtime runner over a copy of ``model`` that outputs ``tensors`` (by their tap names)."""
    from calibkit.engines.onnxruntime import OnnxRuntimeRunner
    from calibkit.graph import add_outputs, load_model, tap_name

    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, bytes):
        proto = onnx.load_from_string(model)
    else:
        proto = load_model(model)
    tapped = add_outputs(proto, tensors)
    names = [tap_name(t, proto) for t in tensors]
    return OnnxRuntimeRunner(tapped.SerializeToString(), output_names=names, name="calibration-taps")


def _output_of(outputs: Mapping[str, np.ndarray], tensor: str) -> np.ndarray:
    if tensor in outputs:
        return outputs[tensor]
    alias = f"{tensor}__calibkit_tap"
    if alias in outputs:
        return outputs[alias]
    raise CalibrationError(
        f"the runner did not return tensor {tensor!r}", hint="the runner must output every tapped tensor"
    )


def _probe_feeds(template: Mapping[str, np.ndarray], mask: np.ndarray, b: int, s: int) -> dict[str, np.ndarray]:
    feeds = {}
    for name, arr in template.items():
        a = np.asarray(arr)
        if a.shape != mask.shape:
            raise ValueError(f"feed {name} is not [batch, seq]")
        feeds[name] = np.tile(a[:1, :1], (b, s))
    return feeds


def probe_layouts(
    runner: BaseRunner, template: Mapping[str, np.ndarray], mask: np.ndarray, tensors: Sequence[str]
) -> dict[str, TensorLayout]:
    """Find each tensor's batch and sequence axes from two runs with distinct (batch, seq) sizes."""
    shapes = []
    try:
        for b, s in _PROBES:
            out = runner.infer(_probe_feeds(template, mask, b, s))
            shapes.append({t: _output_of(out, t).shape for t in tensors})
    except (ValueError, BackendError, UsageError) as exc:
        log.warning("padding cannot be masked (layout probe failed: %s); statistics include padded positions", exc)
        return {t: UNMASKED for t in tensors}
    layouts = {}
    (b1, s1), (b2, s2) = _PROBES
    for t in tensors:
        a, c = shapes[0][t], shapes[1][t]
        if len(a) != len(c):
            layouts[t] = UNMASKED
            continue
        batch = [i for i in range(len(a)) if a[i] == b1 and c[i] == b2]
        seq = tuple(i for i in range(len(a)) if a[i] == s1 and c[i] == s2)
        layouts[t] = TensorLayout(batch[0], seq) if len(batch) == 1 and seq else UNMASKED
    return layouts


def valid_values(x: np.ndarray, layout: TensorLayout, mask: np.ndarray | None) -> np.ndarray:
    """The entries of ``x`` at real-token positions (all of ``x`` when unmasked or without padding)."""
    if mask is None or not layout.maskable or mask.all():
        return x
    b, s = mask.shape
    ba = layout.batch_axis
    assert ba is not None
    if x.shape[ba] != b or any(x.shape[a] != s for a in layout.seq_axes):
        return x
    keep = None
    for a in layout.seq_axes:
        shape = [1] * x.ndim
        shape[ba], shape[a] = b, s
        m = (mask if ba < a else mask.T).reshape(shape)
        keep = m if keep is None else keep & m
    return x[np.broadcast_to(keep, x.shape)]


def collect_stats(
    runner_factory_or_model_path: RunnerSource,
    batches: Iterable[object],
    tensors: Sequence[str],
    *,
    num_bins: int = 2048,
    progress: ProgressCallback | None = None,
    mask_padding: bool = True,
    overlap: bool = True,
) -> StatsStore:
    """Statistics of ``tensors`` over ``batches``.

    ``batches`` yields :class:`calibkit.data.encode.Batch` (feeds + padding mask) or plain feed mappings
    (no masking). ``runner_factory_or_model_path`` is a callable returning a fresh runner whose outputs include
    the tensors (under their own or their tap names), or an ONNX model (path, bytes, ModelProto) to tap.
    """
    if not tensors:
        raise CalibrationError("no tensors to calibrate", hint="check --op-types and --exclude")
    if num_bins < 2 or num_bins & (num_bins - 1):
        raise UsageError(f"--num-bins must be a power of two (e.g. 2048), got {num_bins}")
    tensors = list(dict.fromkeys(tensors))
    if callable(runner_factory_or_model_path) and not isinstance(runner_factory_or_model_path, onnx.ModelProto):
        runner = runner_factory_or_model_path()
    else:
        runner = tapped_runner(runner_factory_or_model_path, tensors)  # type: ignore[arg-type]
    cb = progress or no_progress
    total = len(batches) if hasattr(batches, "__len__") else None  # type: ignore[arg-type]
    acc = {t: StatsAccumulator(t, num_bins) for t in tensors}
    layouts: dict[str, TensorLayout] | None = None
    samples = 0
    done_batches = 0
    padded = 0
    positions = 0
    infer_s = stats_s = 0.0
    cb(ProgressEvent("statistics", 0, total))
    # Statistics of batch k are computed on a worker thread while the model runs batch k+1 (ONNX Runtime and
    # numpy's ufuncs release the GIL); at most two batches of tapped outputs are alive at a time.
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="calibkit-stats") if overlap else None
    pending: Future[float] | None = None

    def observe(out: Mapping[str, np.ndarray], lay: dict[str, TensorLayout], mask: np.ndarray | None) -> float:
        t1 = time.perf_counter()
        for t in tensors:
            acc[t].observe(valid_values(_output_of(out, t), lay[t], mask))
        return time.perf_counter() - t1

    try:
        with runner:
            for done, item in enumerate(batches, 1):
                feeds, mask = _unpack(item)
                if layouts is None:
                    layouts = (
                        probe_layouts(runner, feeds, mask, tensors)
                        if mask_padding and mask is not None
                        else {t: UNMASKED for t in tensors}
                    )
                t0 = time.perf_counter()
                out = runner.infer(feeds)
                infer_s += time.perf_counter() - t0
                if pending is not None:
                    stats_s += pending.result()
                    cb(ProgressEvent("statistics", done - 1, total))
                if pool is not None:
                    pending = pool.submit(observe, out, layouts, mask)
                else:
                    stats_s += observe(out, layouts, mask)
                    cb(ProgressEvent("statistics", done, total))
                del out
                if mask is not None:
                    samples += mask.shape[0]
                    positions += mask.size
                    padded += int(mask.size - mask.sum())
                else:
                    samples += len(next(iter(feeds.values()))) if feeds else 0
                done_batches = done
            if pending is not None:
                stats_s += pending.result()
                pending = None
                cb(ProgressEvent("statistics", done_batches, total))
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    if samples == 0:
        raise CalibrationError("the calibration batches were empty", hint="check the calibration set")
    meta = {
        "samples": samples,
        "batches": total,
        "padding_fraction": padded / positions if positions else 0.0,
        "unmasked": sorted(t for t, lay in (layouts or {}).items() if not lay.maskable),
        "inference_seconds": round(infer_s, 3),
        "statistics_seconds": round(stats_s, 3),  # on the worker thread, overlapping inference when overlap=True
        "runner_calls": runner.inference_count,
    }
    return StatsStore({t: a.freeze() for t, a in acc.items()}, num_bins, meta)


def _unpack(item: object) -> tuple[Mapping[str, np.ndarray], np.ndarray | None]:
    feeds = getattr(item, "feeds", None)
    if feeds is not None:
        return feeds, getattr(item, "mask", None)
    if isinstance(item, Mapping):
        return item, None
    raise UsageError(f"a calibration batch must be a Batch or a mapping of feeds, got {type(item).__name__}")
