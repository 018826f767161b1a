"""Per-layer sensitivity: the accuracy effect of quantizing only one layer, and of keeping only one layer in
higher precision.

The work unit is pure and serialisable: :class:`SensitivityJob` (a frozen dataclass of paths, texts and
numbers) in, :class:`SensitivityResult` out, so a process pool, ``tune`` or a distributed engine can run it.
Each job rebuilds its variant from the FP32 source model and the calibration table with
``calibkit.quantize.qdq.quantize_model(model, table, keep_nodes=...)``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from calibkit.consistency import check_file
from calibkit.errors import CalibrationError
from calibkit.evaluate.jobs import (
    ALL_BUT_THIS,
    ALL_INT8,
    ONLY_THIS,
    SensitivityJob,
    SensitivityResult,
    build_variant,
    load_calibration_table,
    run_sensitivity_job,
)
from calibkit.evaluate.uncertainty import PairedDifference, paired_difference
from calibkit.executors import default_workers
from calibkit.executors.base import Executor
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress

log = logging.getLogger("calibkit.evaluate.sensitivity")

# the work units live in evaluate.jobs (shipping imports them too); their names are part of this module's API
__all__ = ["ALL_BUT_THIS", "ALL_INT8", "ONLY_THIS", "LayerSensitivity", "SensitivityAnalysis", "SensitivityJob",
           "SensitivityResult", "analyse_sensitivity", "build_variant", "load_calibration_table", "run_jobs",
           "run_sensitivity_job"]


def run_jobs(
    jobs: Sequence[SensitivityJob],
    *,
    workers: int | None = None,
    progress: ProgressCallback | None = None,
    task: str = "sensitivity",
    executor: Executor | None = None,
    on_result: Callable[[int, SensitivityResult], None] | None = None,
) -> list[SensitivityResult]:
    """Run ``jobs`` on ``executor`` (default: a process pool of ``workers``; <= 1: in this process); results
    in the order of ``jobs``. Model, table, tokenizer and eval rows are shared once per worker
    (:mod:`calibkit.evaluate.shipping`); ``on_result(i, result)`` is called as each job finishes."""
    cb = progress or no_progress
    for src, sha in dict.fromkeys((j.source_model, j.source_model_sha256) for j in jobs):
        check_file(src, sha, what="the source model the variants are rebuilt from",
                   hint=f"restore {src} as it was when it was recorded (the engine's build, or the start of "
                        "this tune run), or rebuild the engine from the current model (`calibkit calibrate` then "
                        "`calibkit build`)")

    def finished(i: int, r: SensitivityResult) -> None:
        log.info("%s %s %s: accuracy %.4f (%.1f s)", task, r.mode, r.node or "", r.accuracy, r.seconds)
        if on_result is not None:
            on_result(i, r)

    if executor is None:
        n = workers if workers is not None else default_workers()
        if n <= 1 or len(jobs) <= 1:
            results = []
            cb(ProgressEvent(task, 0, len(jobs)))
            for i, job in enumerate(jobs):
                results.append(r := run_sensitivity_job(job))
                finished(i, r)
                cb(ProgressEvent(task, i + 1, len(jobs), message=job.node or job.mode))
            return results
        from calibkit.executors.pool import ProcessPoolExecutor

        with ProcessPoolExecutor(min(n, len(jobs))) as pool:
            return run_jobs(jobs, progress=progress, task=task, executor=pool, on_result=on_result)
    from calibkit.evaluate.shipping import pack_jobs, run_shipped_job

    shipped = pack_jobs(jobs, executor, threads=executor.task_threads)
    return executor.map(run_shipped_job, shipped, task=task, progress=cb, on_result=finished)


@dataclass(frozen=True)
class LayerSensitivity:
    node: str
    only_this: SensitivityResult  # every other node kept in higher precision
    all_but_this: SensitivityResult  # this node kept in higher precision
    only_this_delta: float  # accuracy(only this INT8) - accuracy(reference)
    all_but_this_delta: float  # accuracy(all but this) - accuracy(all INT8)
    # paired 95 % intervals of the two deltas (same examples); None when a variant failed
    only_this_diff: PairedDifference | None = None
    all_but_this_diff: PairedDifference | None = None
    # flips to the reference removed by keeping only this layer in higher precision (all INT8 minus all but
    # this, as a paired difference of per-example flip indicators: positive = fewer flips)
    flips_removed: PairedDifference | None = None


@dataclass(frozen=True)
class SensitivityAnalysis:
    samples: int
    reference_accuracy: float
    all_int8: SensitivityResult
    layers: tuple[LayerSensitivity, ...]


def analyse_sensitivity(
    nodes: Sequence[str],
    *,
    source_model: str,
    calibration_json: str,
    tokenizer: str,
    texts: Sequence[str],
    labels: Sequence[int],
    reference_logits: np.ndarray,
    base_keep: Sequence[str] = (),
    target: str = "tensorrt",
    batch_size: int = 32,
    workers: int | None = None,
    max_length: int | None = None,
    progress: ProgressCallback | None = None,
    executor: Executor | None = None,
    output_name: str | None = None,
    source_model_sha256: str | None = None,
    calibration_sha256: str | None = None,
) -> SensitivityAnalysis:
    """Two variants per node plus one all-INT8 variant, on ``texts`` (already the subset to use).

    ``base_keep``: nodes the engine under study already keeps in higher precision (kept in every variant).
    ``source_model_sha256`` / ``calibration_sha256``: what the engine under study was built from (its
    sidecar); the files are refused before any variant is built when their bytes differ.
    """
    check_file(calibration_json, calibration_sha256, what="the calibration table the variants are rebuilt from",
               error=CalibrationError, hint="restore that calibration.json, or rebuild the engine with "
                                            "`calibkit build`")
    nodes = list(dict.fromkeys(nodes))
    n = workers if workers is not None else default_workers()
    threads = executor.threads_per_task if executor is not None else max(1, (os.cpu_count() or 1) // max(1, n))
    base = dict(
        source_model=str(source_model),
        calibration_json=str(calibration_json),
        tokenizer=str(tokenizer),
        texts=tuple(texts),
        labels=tuple(int(v) for v in labels),
        reference_logits=tuple(tuple(float(v) for v in row) for row in np.asarray(reference_logits)),
        batch_size=batch_size,
        threads=threads,
        max_length=max_length,
        target=target,
        output_name=output_name,
        source_model_sha256=source_model_sha256,
    )
    kept = tuple(base_keep)
    jobs = [SensitivityJob(keep_nodes=kept, mode=ALL_INT8, **base)]  # type: ignore[arg-type]
    for node in nodes:
        others = tuple(x for x in nodes if x != node) + kept
        jobs.append(SensitivityJob(keep_nodes=others, mode=ONLY_THIS, node=node, **base))  # type: ignore[arg-type]
        jobs.append(SensitivityJob(keep_nodes=(node, *kept), mode=ALL_BUT_THIS, node=node, **base))  # type: ignore[arg-type]
    results = run_jobs(jobs, workers=n, progress=progress, executor=executor)
    y = np.asarray(labels, dtype=np.int64)
    ref_pred = np.asarray(reference_logits).argmax(axis=1)
    ref_correct = ref_pred == y
    ref_acc = float(np.mean(ref_correct))
    all_int8 = results[0]
    if all_int8.error:
        raise CalibrationError(f"sensitivity: the all-INT8 variant could not be built: {all_int8.error}",
                               hint=all_int8.error_hint or "run with --no-sensitivity to compare without it")
    per_node = []
    for k, node in enumerate(nodes):
        only, abt = results[1 + 2 * k], results[2 + 2 * k]
        for r in (only, abt):
            if r.error:
                log.warning("sensitivity variant %s for %s failed: %s", r.mode, node, r.error)
        ok = len(all_int8.predictions) == len(y)
        only_ok = ok and not only.error and len(only.predictions) == len(y)
        abt_ok = ok and not abt.error and len(abt.predictions) == len(y)
        per_node.append(
            LayerSensitivity(
                node=node,
                only_this=only,
                all_but_this=abt,
                only_this_delta=only.accuracy - ref_acc,
                all_but_this_delta=abt.accuracy - all_int8.accuracy,
                only_this_diff=paired_difference(ref_correct, only.correct(y)) if only_ok else None,
                all_but_this_diff=paired_difference(all_int8.correct(y), abt.correct(y)) if abt_ok else None,
                flips_removed=paired_difference(abt.flips(ref_pred), all_int8.flips(ref_pred)) if abt_ok else None,
            )
        )
    return SensitivityAnalysis(len(texts), ref_acc, all_int8, tuple(per_node))
