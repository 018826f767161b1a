"""Calibration statistics computed shard by shard on an executor's workers and merged on the driver.

The calibration batches (already tokenized and bucketed on the driver) are dealt round-robin into shards, so
long and short batches spread evenly; each worker runs the public
:func:`calibkit.calibrate.collect.collect_stats` over its shard; the driver merges the shards' stores.
Histograms have power-of-two ranges and every batch is binned exactly as in one process, so the merged
statistics are bit-identical to a single-process run over the same batches, whatever the shard count or order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from calibkit.calibrate.stats import StatsStore
from calibkit.errors import CalibrationError
from calibkit.executors.base import Executor, Shared, fetch
from calibkit.progress import ProgressCallback

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.engines.base import BaseRunner


@dataclass(frozen=True)
class Shard:
    """One work unit: a shared tapped-able model, the tensors to observe and this shard's batches."""

    model: Shared[bytes]  # the FP32 ONNX model
    tensors: tuple[str, ...]
    batches: tuple[Any, ...]  # calibkit.data.encode.Batch (feeds and padding mask)
    num_bins: int
    threads: int | None


def _shard_runner(model: bytes, tensors: Sequence[str], threads: int | None) -> BaseRunner:
    import onnx

    from calibkit.enginefiles.registry import model_runner
    from calibkit.graph import add_outputs, tap_name

    proto = onnx.load_from_string(model)
    names = [tap_name(t, proto) for t in tensors]
    tapped = add_outputs(proto, tensors).SerializeToString()
    del proto
    return model_runner(tapped, output_names=names, threads=threads, name="calibration-shard")


def collect_shard(shard: Shard) -> StatsStore:
    """The work unit: statistics of one shard (on a worker)."""
    from calibkit.calibrate.collect import collect_stats

    model = fetch(shard.model)
    return collect_stats(lambda: _shard_runner(model, shard.tensors, shard.threads), shard.batches,
                         shard.tensors, num_bins=shard.num_bins, threads=shard.threads or 1)


def merge_stores(stores: Sequence[StatsStore]) -> StatsStore:
    """Merge per-shard stores; ``meta`` adds up counts and times (``shards``: how many)."""
    if not stores:
        raise CalibrationError("no shards to merge")
    merged = stores[0]
    for s in stores[1:]:
        merged = merged.merge(s)
    metas = [dict(s.meta) for s in stores]

    def total(key: str) -> float:
        return sum(float(m.get(key) or 0) for m in metas)

    meta = {
        "samples": int(total("samples")),
        "batches": int(total("batches")),
        "unmasked": sorted({t for m in metas for t in m.get("unmasked", [])}),
        "inference_seconds": round(total("inference_seconds"), 3),
        "statistics_seconds": round(total("statistics_seconds"), 3),
        "runner_calls": int(total("runner_calls")),
        "shards": len(stores),
    }
    return StatsStore(dict(merged.stats), merged.num_bins, meta)


def collect_stats_sharded(
    model: bytes,
    batches: Iterable[Any],
    tensors: Sequence[str],
    executor: Executor,
    *,
    num_bins: int = 2048,
    shards: int | None = None,
    progress: ProgressCallback | None = None,
) -> StatsStore:
    """Statistics of ``tensors`` over ``batches`` (a re-iterable of Batch, e.g. BucketedBatches), computed in
    ``shards`` work units (default: one per worker) on ``executor``."""
    if not tensors:
        raise CalibrationError("no tensors to calibrate", hint="check --op-types and --exclude")
    items = list(batches)
    if not items:
        raise CalibrationError("the calibration batches were empty", hint="check the calibration set")
    k = max(1, min(shards or executor.workers, len(items)))
    tensors = tuple(dict.fromkeys(tensors))
    ref = executor.share(model)
    threads = executor.task_threads or executor.threads_per_task
    units = [Shard(ref, tensors, tuple(items[i::k]), num_bins, threads) for i in range(k)]
    stores = executor.map(collect_shard, units, task="statistics (shards)", progress=progress)
    out = merge_stores(stores)
    positions = sum(int(b.mask.size) for b in items if getattr(b, "mask", None) is not None)
    padded = sum(int(b.mask.size - b.mask.sum()) for b in items if getattr(b, "mask", None) is not None)
    return StatsStore(dict(out.stats), out.num_bins,
                      {**out.meta, "batches": len(items), "padding_fraction": padded / positions if positions else 0.0})
