"""Run the model over calibration batches and stream every tapped tensor into mergeable statistics.

Padding: a padded position carries values production never sees (the model attends to nothing there, LayerNorm
normalises garbage), so it is excluded. Which axes of a tensor are the batch and sequence axes is found by two
tiny probe runs with distinct (batch, seq) sizes — (2, 13) and (3, 17) — so a static axis (12 heads, 32 head
dims) can never be mistaken for the sequence. A [b, s, ...] tensor keeps rows where the mask is set; an
attention tensor [b, h, s, s] keeps (query, key) pairs where both are real tokens. Tensors whose layout cannot be
read (batch folded into another axis by a Reshape) are observed unmasked and listed in ``meta["unmasked"]``.

Memory: ONNX Runtime returns every tapped tensor of a batch at once; those outputs are the peak, so batches are
formed by a :class:`calibkit.data.encode.TokenBudget` priced by the same probe runs (:func:`probe_cost`).
Statistics read the real tokens of each output as views, or, when those views would be small, in place with
padded entries overwritten by a copy of one real entry that is then taken back out (:func:`observe_real_tokens`;
no boolean-index copies, no float64 or int64 copies of whole tensors: 256K-element chunks through per-thread
buffers), and each output is released as soon as its statistics are done. Where a memory budget bounds the
batches and there are at least two statistics threads, batch k+1 is tokenized and inferred on a second thread
while batch k's statistics run (ONNX Runtime releases the GIL): two batches are then alive, so each is formed
with half the budget and together they stay within it. The statistics of one batch run on ``threads``
threads, one tensor per task, counting with np.bincount on few threads and with a GIL-free radix sort
from ``_SORT_FROM`` threads on (see :class:`calibkit.calibrate.histogram.BinCounter`). Results do not depend on
batch size, budget or thread count: power-of-two histograms merge exactly, min/max and counts are exact.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx

from calibkit.calibrate.stats import StatsAccumulator, StatsStore
from calibkit.data.encode import BatchCost
from calibkit.engines.base import BaseRunner
from calibkit.errors import BackendError, CalibrationError, UsageError
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.enginefiles.registry import ModelRunnerFactory

log = logging.getLogger("calibkit.calibrate")

RunnerSource = Callable[[], BaseRunner] | str | os.PathLike[str] | bytes | onnx.ModelProto

_PROBES = ((2, 13), (3, 17))
OVERLAP = True  # infer batch k+1 while batch k's statistics run (collect_stats' default); benchmarks A/B it
KERNEL = ""  # force a histogram kernel (calibkit.calibrate.histogram.BinCounter); benchmarks A/B them
# from this many statistics threads on, the radix-sort kernel: measured on the GPU machine's 16-core host
# (benchmarks/bench_scale.py --kernels), np.bincount costs 4.3 ns per value on one thread but only gets 1.75x
# faster on 16 (its min/max pre-pass holds the GIL), the sort kernel costs 7.6 ns but gets 3.8x faster:
# 2.4 against 2.0 ns per value at 16 threads; the two cross near 6 threads
_SORT_FROM = 6
_VIEWS_FROM = 1 << 16  # mean entries per view of real tokens from which views are read directly


@dataclass(frozen=True)
class TensorLayout:
    batch_axis: int | None
    seq_axes: tuple[int, ...]

    @property
    def maskable(self) -> bool:
        return self.batch_axis is not None and bool(self.seq_axes)


UNMASKED = TensorLayout(None, ())


def tapped_runner(
    model: str | os.PathLike[str] | bytes | onnx.ModelProto,
    tensors: Sequence[str],
    *,
    serialized: bytes | None = None,
    intra_op_threads: int | None = None,
    spinning: bool = True,
    make_runner: ModelRunnerFactory | None = None,
) -> BaseRunner:
    """A runner over ``model`` that also outputs ``tensors`` (by their tap names), made by ``make_runner``
    (``Resources.runner_factory``; default: the engine registry's ``model_runner``, ONNX Runtime).

    ``serialized``: the bytes ``model`` (a ModelProto) was parsed from (its file), when the caller has them. Then
    nothing of the model is serialized again: the taps are encoded as a small ModelProto holding only the extra
    graph outputs and Identity nodes, and appended to those bytes. Protobuf parses a concatenation of two
    messages as their merge, and a merge appends repeated fields (graph.output, graph.node), so ONNX Runtime
    reads exactly the tapped model; for BERT-large this skips serializing 1.3 GB. Otherwise a ModelProto is
    tapped in place and restored after serializing (no second copy of the weights). The bytes are dropped once
    the session has loaded them."""
    from calibkit.enginefiles.registry import model_runner
    from calibkit.graph import add_outputs, load_model

    make_runner = make_runner or model_runner
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, bytes):
        proto, serialized = onnx.load_from_string(model), model
    else:
        proto = load_model(model)
    names = tap_names(proto, tensors)
    if serialized is not None:
        data = serialized + _taps_suffix(proto, tensors, add_outputs)
    else:
        data = _serialized_with_outputs(proto, tensors, add_outputs)
    del serialized
    return make_runner(data, output_names=names, name="calibration-taps", keep_model=False,
                       threads=intra_op_threads, spinning=spinning)


def tap_names(proto: onnx.ModelProto, tensors: Sequence[str]) -> list[str]:
    """:func:`calibkit.graph.tap_name` of every tensor, with the graph's names gathered once."""
    known = {o for n in proto.graph.node for o in n.output} | {o.name for o in proto.graph.output}
    return [t if t in known else f"{t}__calibkit_tap" for t in tensors]


def _tapped_skeleton(proto: onnx.ModelProto, tensors: Sequence[str], add_outputs: Callable) -> onnx.GraphProto:
    g = proto.graph
    skeleton = onnx.ModelProto()
    skeleton.graph.node.extend(g.node)
    skeleton.graph.input.extend(g.input)
    skeleton.graph.output.extend(g.output)
    skeleton.graph.initializer.extend(onnx.TensorProto(name=i.name) for i in g.initializer)
    return add_outputs(skeleton, tensors).graph


def _taps_suffix(proto: onnx.ModelProto, tensors: Sequence[str], add_outputs: Callable) -> bytes:
    """The serialized ModelProto that, appended to ``proto``'s own bytes, adds the taps' outputs and nodes."""
    g = proto.graph
    tapped = _tapped_skeleton(proto, tensors, add_outputs)
    extra = onnx.ModelProto()
    extra.graph.output.extend(tapped.output[len(g.output):])
    extra.graph.node.extend(tapped.node[len(g.node):])
    return extra.SerializeToString()


def _serialized_with_outputs(proto: onnx.ModelProto, tensors: Sequence[str], add_outputs: Callable) -> bytes:
    """``add_outputs(proto, tensors)`` serialized, without its copy of the weights: the taps are planned on a
    weightless skeleton of the graph, appended to ``proto`` for serializing, then removed again."""
    g = proto.graph
    n_out, n_node = len(g.output), len(g.node)
    tapped = _tapped_skeleton(proto, tensors, add_outputs)
    g.output.extend(tapped.output[n_out:])
    g.node.extend(tapped.node[n_node:])
    try:
        return proto.SerializeToString()
    finally:
        del g.output[n_out:]
        del g.node[n_node:]


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


def _probe_shapes(
    runner: BaseRunner, template: Mapping[str, np.ndarray], mask: np.ndarray, tensors: Sequence[str]
) -> list[dict[str, tuple[int, ...]]] | None:
    shapes = []
    try:
        for b, s in _PROBES:
            out = runner.infer(_probe_feeds(template, mask, b, s))
            shapes.append({t: tuple(_output_of(out, t).shape) for t in tensors})
            del out
    except (ValueError, BackendError, UsageError) as exc:
        log.warning("padding cannot be masked (layout probe failed: %s); statistics include padded positions", exc)
        return None
    return shapes


def _layouts_from(shapes: list[dict[str, tuple[int, ...]]], tensors: Sequence[str]) -> dict[str, TensorLayout]:
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


def _cost_from(shapes: list[dict[str, tuple[int, ...]]], tensors: Sequence[str]) -> BatchCost:
    """Elements per text as fixed + per_token·s + per_pair·s², solved from the two probes per tensor."""
    (b1, s1), (b2, s2) = _PROBES
    fixed = token = pair = 0.0
    for t in tensors:
        n1 = float(np.prod(shapes[0][t], dtype=np.float64)) / b1
        n2 = float(np.prod(shapes[1][t], dtype=np.float64)) / b2
        # n = c1·s + c2·s² through both probes; a tensor that does not grow with s is fixed
        c2 = (n2 / s2 - n1 / s1) / (s2 - s1)
        c1 = n1 / s1 - c2 * s1
        if abs(n1 - n2) < 0.5:
            fixed += n1
        elif c2 > 1e-9 and c1 >= -1e-9:
            pair += c2
            token += max(c1, 0.0)
        else:
            token += max(n1 / s1, n2 / s2)
    return BatchCost(per_token=token, per_pair=pair, fixed=fixed)


def probe_layouts(
    runner: BaseRunner, template: Mapping[str, np.ndarray], mask: np.ndarray, tensors: Sequence[str]
) -> dict[str, TensorLayout]:
    """Find each tensor's batch and sequence axes from two runs with distinct (batch, seq) sizes."""
    shapes = _probe_shapes(runner, template, mask, tensors)
    return {t: UNMASKED for t in tensors} if shapes is None else _layouts_from(shapes, tensors)


def probe_cost(
    runner: BaseRunner, template: Mapping[str, np.ndarray], mask: np.ndarray, tensors: Sequence[str]
) -> tuple[dict[str, TensorLayout], BatchCost | None]:
    """Layouts and the bytes per batch of ``tensors`` (None when the probe fails), from the same two runs."""
    shapes = _probe_shapes(runner, template, mask, tensors)
    if shapes is None:
        return {t: UNMASKED for t in tensors}, None
    return _layouts_from(shapes, tensors), _cost_from(shapes, tensors)


def _runs(mask_row: np.ndarray) -> int | None:
    """The number of real tokens when they form a prefix of the row (right padding), else None."""
    n = int(mask_row.sum())
    return n if mask_row[:n].all() else None


def valid_blocks(x: np.ndarray, layout: TensorLayout, mask: np.ndarray | None) -> Iterator[np.ndarray]:
    """Views of ``x`` that together hold exactly its real-token entries; copies only for rows whose padding is
    not at the end (rare: left padding), and then one row at a time."""
    if mask is None or not layout.maskable or mask.all():
        yield x
        return
    b, s = mask.shape
    ba = layout.batch_axis
    if ba is None or x.shape[ba] != b or any(x.shape[a] != s for a in layout.seq_axes):
        yield x
        return
    i = 0
    while i < b:
        n = _runs(mask[i])
        j = i + 1
        if n is not None:
            while j < b and _runs(mask[j]) == n:
                j += 1
            if n:
                index: list[slice | int] = [slice(None)] * x.ndim
                index[ba] = slice(i, j)
                for a in layout.seq_axes:
                    index[a] = slice(0, n)
                yield x[tuple(index)]
        else:
            row = np.take(x, [i], axis=ba)
            keep = np.flatnonzero(mask[i])
            for a in layout.seq_axes:
                row = np.take(row, keep, axis=a)
            yield row
        i = j


def padding_entries(x: np.ndarray, layout: TensorLayout, mask: np.ndarray | None) -> tuple[np.ndarray, int] | None:
    """A bool array broadcastable to ``x``, True at padded entries, and how many entries of ``x`` are padding
    (None when there is nothing to mask)."""
    if mask is None or not layout.maskable or mask.all():
        return None
    b, s = mask.shape
    ba = layout.batch_axis
    if ba is None or x.shape[ba] != b or any(x.shape[a] != s for a in layout.seq_axes):
        return None
    keep = None
    for a in layout.seq_axes:
        shape = [1] * x.ndim
        shape[ba], shape[a] = b, s
        m = (mask if ba < a else mask.T).reshape(shape)
        keep = m if keep is None else keep & m
    k = len(layout.seq_axes)
    static = x.size // (b * s**k)
    real = static * int((mask.sum(axis=1).astype(np.int64) ** k).sum())
    return ~keep, x.size - real  # type: ignore[operator]


def observe_real_tokens(acc: StatsAccumulator, x: np.ndarray, layout: TensorLayout, mask: np.ndarray | None) -> None:
    """Statistics of the real-token entries of ``x`` (an output the collector owns; padded entries may be
    overwritten).

    Large views of the real tokens (long texts) are read as they are (:func:`valid_blocks`). When they would be
    small (short texts: many rows of a few thousand entries), padded entries are overwritten in one pass with a
    copy of one real entry ``v``, the whole contiguous tensor is observed in 256K-element chunks, and the copies
    of ``v`` are taken back out (``count`` and v's bin). min/max never see a value that is not real and counts
    are exact, so both ways equal observing the real entries alone, bit for bit."""
    pad = padding_entries(x, layout, mask)
    if pad is None:
        acc.observe(x)
        return
    where, n_pad = pad
    assert mask is not None and layout.batch_axis is not None  # padding_entries checked both
    groups = 1 + int(np.count_nonzero(np.diff(mask.sum(axis=1))))  # rows of equal length share one view
    small = x.size < _VIEWS_FROM * groups  # small views: numpy call overhead (and the GIL) would dominate
    if small and x.flags.writeable and x.flags.c_contiguous and x.dtype in (np.float32, np.float16):
        rows = np.flatnonzero(mask.any(axis=1))
        if rows.size:
            i = int(rows[0])
            index = [0] * x.ndim
            index[layout.batch_axis] = i
            for a in layout.seq_axes:
                index[a] = int(np.flatnonzero(mask[i])[0])
            v = x[tuple(index)]
            if np.isfinite(v):
                np.copyto(x, v, where=where)
                acc.observe(x)
                acc.forget(v, n_pad)
                return
    for block in valid_blocks(x, layout, mask):
        acc.observe(block)


def valid_values(x: np.ndarray, layout: TensorLayout, mask: np.ndarray | None) -> np.ndarray:
    """The entries of ``x`` at real-token positions, as one flat array (a copy; the collector uses
    :func:`valid_blocks` views instead)."""
    blocks = [np.ravel(v) for v in valid_blocks(x, layout, mask)]
    return blocks[0] if len(blocks) == 1 else (np.concatenate(blocks) if blocks else x.reshape(-1)[:0])


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def collect_stats(
    runner_factory_or_model_path: RunnerSource,
    batches: Iterable[object],
    tensors: Sequence[str],
    *,
    num_bins: int = 2048,
    progress: ProgressCallback | None = None,
    mask_padding: bool = True,
    threads: int | None = None,
    serialized: bytes | None = None,
    overlap: bool | None = None,
    make_runner: ModelRunnerFactory | None = None,
) -> StatsStore:
    """Statistics of ``tensors`` over ``batches``.

    ``batches`` yields :class:`calibkit.data.encode.Batch` (feeds + padding mask) or plain feed mappings
    (no masking); a :class:`calibkit.data.encode.BucketedBatches` with a memory budget is re-grouped once the
    probe runs have priced its batches. ``runner_factory_or_model_path`` is a callable returning a fresh runner
    whose outputs include the tensors (under their own or their tap names), or an ONNX model (path, bytes,
    ModelProto) to tap; ``serialized``: the bytes a ModelProto was parsed from (see :func:`tapped_runner`).
    ``threads`` compute statistics (default: the CPUs, or half of them while the next batch's inference overlaps;
    ``overlap`` None: :data:`OVERLAP`). ``make_runner``: makes the tapped runner of a model (see
    :func:`tapped_runner`). ``meta`` records where the time
    went: ``session_seconds`` (tapping and ONNX Runtime's session), ``probe_seconds``, ``inference_seconds`` and
    ``statistics_seconds`` (wall, and ``statistics_cpu_seconds`` summed over the threads; inference and statistics
    run at the same time when ``overlapped``, so their seconds add up to more than the wall time).
    """
    if not tensors:
        raise CalibrationError("no tensors to calibrate", hint="check --op-types and --exclude")
    if num_bins < 2 or num_bins & (num_bins - 1):
        raise UsageError(f"--num-bins must be a power of two (e.g. 2048), got {num_bins}")
    cpus = default_threads()
    workers, may_overlap = _statistics_threads(cpus, threads, (OVERLAP if overlap is None else overlap)
                                               and bool(getattr(batches, "memory_bounded", False)))
    tensors = list(dict.fromkeys(tensors))
    t_session = time.perf_counter()
    if callable(runner_factory_or_model_path) and not isinstance(runner_factory_or_model_path, onnx.ModelProto):
        runner = runner_factory_or_model_path()
    else:
        runner = tapped_runner(runner_factory_or_model_path, tensors, serialized=serialized,
                               intra_op_threads=max(1, cpus - cpus // 4) if may_overlap else None,
                               spinning=not may_overlap, make_runner=make_runner)
    del serialized
    kernel = KERNEL or ("sort" if workers >= _SORT_FROM else "bincount")
    acc = {t: StatsAccumulator(t, num_bins, kernel=kernel) for t in tensors}
    tally = _Tally(workers)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="calibkit-stats") if workers > 1 else None
    try:
        with runner:
            tally.session_s = time.perf_counter() - t_session  # the session is created on activation
            layouts = _stream_statistics(runner, batches, tensors, acc, pool, tally, mask_padding=mask_padding,
                                         may_overlap=may_overlap, progress=progress or no_progress)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    if tally.samples == 0:
        raise CalibrationError("the calibration batches were empty", hint="check the calibration set")
    return StatsStore({t: a.freeze() for t, a in acc.items()}, num_bins, tally.meta(layouts, runner.inference_count))


def _statistics_threads(cpus: int, threads: int | None, may_overlap: bool) -> tuple[int, bool]:
    """(the threads that compute statistics, whether the next batch's inference overlaps them)."""
    # overlapped, the CPUs are shared: half for statistics, three quarters for ONNX Runtime, whose idle threads
    # sleep instead of spinning (measured on 16 cores, BERT-base, 2,048 log texts: 54 s with both on all CPUs and
    # spinning, 41 s without spinning, 37 s split so; 52 s not overlapped; benchmarks/bench_scale.py)
    workers = (max(2, cpus // 2) if may_overlap else cpus) if threads is None else int(threads)
    if workers < 1:
        raise UsageError(f"statistics threads must be at least 1, got {threads}")
    return workers, may_overlap and workers > 1


@dataclass
class _Tally:
    """What :func:`collect_stats` counts while it streams: the statistics' ``meta``."""

    workers: int
    samples: int = 0
    batches: int = 0
    padded: int = 0
    positions: int = 0
    peak_bytes: int = 0
    session_s: float = 0.0
    probe_s: float = 0.0
    infer_s: float = 0.0
    stats_s: float = 0.0
    stats_cpu: float = 0.0
    overlapped: bool = False

    def count(self, feeds: Mapping[str, np.ndarray], mask: np.ndarray | None) -> None:
        """One batch's texts and (with a mask) its real and padded positions."""
        if mask is not None:
            self.samples += mask.shape[0]
            self.positions += mask.size
            self.padded += int(mask.size - mask.sum())
        else:
            self.samples += len(next(iter(feeds.values()))) if feeds else 0

    def meta(self, layouts: Mapping[str, TensorLayout] | None, runner_calls: int) -> dict[str, object]:
        return {
            "samples": self.samples,
            "batches": self.batches,
            "padding_fraction": self.padded / self.positions if self.positions else 0.0,
            "unmasked": sorted(t for t, lay in (layouts or {}).items() if not lay.maskable),
            "session_seconds": round(self.session_s, 3),
            "probe_seconds": round(self.probe_s, 3),
            "inference_seconds": round(self.infer_s, 3),
            "statistics_seconds": round(self.stats_s, 3),
            "statistics_threads": self.workers,
            "statistics_cpu_seconds": round(self.stats_cpu, 3),
            "overlapped": self.overlapped,
            "largest_batch_tapped_bytes": self.peak_bytes,
            "runner_calls": runner_calls,
        }


def _stream_statistics(runner: BaseRunner, batches: Iterable[object], tensors: Sequence[str],
                       acc: Mapping[str, StatsAccumulator], pool: ThreadPoolExecutor | None, tally: _Tally, *,
                       mask_padding: bool, may_overlap: bool, progress: ProgressCallback
                       ) -> dict[str, TensorLayout] | None:
    """Infer every batch on the active ``runner`` and observe its tapped tensors into ``acc`` (on ``pool``'s
    threads when there is one), counting into ``tally``; returns the tensors' layouts (None: no batch)."""
    stream, layouts = _priced_stream(runner, batches, tensors, tally, mask_padding=mask_padding,
                                     may_overlap=may_overlap)
    total = len(stream) if hasattr(stream, "__len__") else None  # type: ignore[arg-type]
    progress(ProgressEvent("statistics", 0, total))
    runs = _inferred_ahead(runner, stream) if tally.overlapped else _inferred_in_turn(runner, stream)
    # closed before the runner is: an inference still running on the second thread finishes first
    with contextlib.closing(runs):
        for done, (feeds, mask, out, dt) in enumerate(runs, 1):
            if layouts is None:
                layouts = (
                    probe_layouts(runner, feeds, mask, tensors)
                    if mask_padding and mask is not None
                    else {t: UNMASKED for t in tensors}
                )
            tally.infer_s += dt
            t1 = time.perf_counter()
            nbytes, cpu = _observe_batch(out, tensors, layouts, mask, acc, pool)
            del out
            tally.peak_bytes = max(tally.peak_bytes, nbytes)
            tally.stats_cpu += cpu
            tally.stats_s += time.perf_counter() - t1
            progress(ProgressEvent("statistics", done, total))
            tally.count(feeds, mask)
            tally.batches = done
    return layouts


def _priced_stream(runner: BaseRunner, batches: Iterable[object], tensors: Sequence[str], tally: _Tally, *,
                   mask_padding: bool, may_overlap: bool) -> tuple[Iterable[object], dict[str, TensorLayout] | None]:
    """The batches to run and the tensors' layouts (None until the first batch of a one-shot iterator): the
    probe runs on the first batch find the layouts and price the batches, which a memory-bounded collection
    then re-groups (overlapped where ``may_overlap``: two batches alive, half the budget each)."""
    first = _first_batch(batches)
    if first is None:
        return batches, None
    feeds, mask = _unpack(first)
    cost: BatchCost | None = None
    if mask_padding and mask is not None:
        t_probe = time.perf_counter()
        layouts, cost = probe_cost(runner, feeds, mask, tensors)
        tally.probe_s = time.perf_counter() - t_probe
    else:
        layouts = {t: UNMASKED for t in tensors}
    priced = getattr(batches, "priced", None)
    if cost is None or priced is None:
        return batches, layouts
    # overlap only where a memory budget bounds the batches: two are alive, half the budget each
    tally.overlapped = may_overlap
    return priced(cost, share=2 if may_overlap else 1), layouts


def _observe_batch(out: dict[str, np.ndarray], tensors: Sequence[str], layouts: Mapping[str, TensorLayout],
                   mask: np.ndarray | None, acc: Mapping[str, StatsAccumulator], pool: ThreadPoolExecutor | None
                   ) -> tuple[int, float]:
    """Observe one batch's tapped outputs (``out`` is emptied; each array is dropped once observed): (the bytes
    tapped, the CPU seconds the statistics took)."""
    arrays = [(t, _output_of(out, t)) for t in tensors]
    nbytes = sum(int(getattr(x, "nbytes", 0)) for _, x in arrays)
    out.clear()
    cpu = 0.0
    if pool is None:
        while arrays:
            t, x = arrays.pop()
            cpu += _observe(acc[t], x, layouts[t], mask)
            del x
        return nbytes, cpu
    # biggest first, so the threads finish together; each array is dropped when its task ends
    arrays.sort(key=lambda tx: -int(getattr(tx[1], "size", 0)))
    futures = [pool.submit(_observe, acc[t], x, layouts[t], mask) for t, x in arrays]
    arrays.clear()
    for f in futures:
        cpu += f.result()
    return nbytes, cpu


def _observe(acc: StatsAccumulator, x: np.ndarray, layout: TensorLayout, mask: np.ndarray | None) -> float:
    c0 = time.thread_time()
    observe_real_tokens(acc, x, layout, mask)
    return time.thread_time() - c0  # CPU seconds: against wall seconds, how well the threads ran together


_Run = tuple[Mapping[str, np.ndarray], np.ndarray | None, dict[str, np.ndarray], float]


def _infer(runner: BaseRunner, item: object) -> _Run:
    feeds, mask = _unpack(item)
    t0 = time.perf_counter()
    out = dict(runner.infer(feeds))
    return feeds, mask, out, time.perf_counter() - t0


def _inferred_in_turn(runner: BaseRunner, stream: Iterable[object]) -> Generator[_Run, None, None]:
    for item in stream:
        yield _infer(runner, item)


def _inferred_ahead(runner: BaseRunner, stream: Iterable[object]) -> Generator[_Run, None, None]:
    """Each batch's outputs, with the next batch tokenized and inferred on a second thread meanwhile (ONNX
    Runtime releases the GIL), so the statistics of batch k run while the model runs batch k+1. The consumer
    must drop batch k's outputs before asking for batch k+1: at most two batches are alive."""
    items = iter(stream)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="calibkit-infer") as ex:
        first = next(items, None)
        pending = ex.submit(_infer, runner, first) if first is not None else None
        try:
            while pending is not None:
                run = pending.result()
                nxt = next(items, None)
                pending = ex.submit(_infer, runner, nxt) if nxt is not None else None
                yield run
                del run
        finally:
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(Exception):
                    pending.result()


def _first_batch(batches: Iterable[object]) -> object | None:
    """The first batch of a re-iterable collection (for the probe runs); None for a one-shot iterator."""
    if iter(batches) is batches:
        return None
    for item in batches:
        return item
    return None


def _unpack(item: object) -> tuple[Mapping[str, np.ndarray], np.ndarray | None]:
    feeds = getattr(item, "feeds", None)
    if feeds is not None:
        return feeds, getattr(item, "mask", None)
    if isinstance(item, Mapping):
        return item, None
    raise UsageError(f"a calibration batch must be a Batch or a mapping of feeds, got {type(item).__name__}")
