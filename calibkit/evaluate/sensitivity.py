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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calibkit._io import read_json
from calibkit.consistency import check_file
from calibkit.errors import CalibkitError, CalibrationError
from calibkit.evaluate.metrics import output_error
from calibkit.evaluate.uncertainty import PairedDifference, paired_difference
from calibkit.executors import default_workers
from calibkit.executors.base import Executor
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress
from calibkit.types import CalibrationTable

log = logging.getLogger("calibkit.evaluate.sensitivity")

ONLY_THIS = "only_this_int8"
ALL_BUT_THIS = "all_but_this"
ALL_INT8 = "all_int8"


@dataclass(frozen=True)
class SensitivityJob:
    """Build one variant (``keep_nodes`` stay in higher precision, every other placed node is INT8), run it
    on ``texts`` and score it against ``labels`` and ``reference_logits``."""

    source_model: str
    calibration_json: str
    tokenizer: str
    texts: tuple[str, ...]
    labels: tuple[int, ...]
    reference_logits: tuple[tuple[float, ...], ...]
    keep_nodes: tuple[str, ...]
    mode: str  # ONLY_THIS | ALL_BUT_THIS | ALL_INT8
    node: str | None = None
    target: str = "tensorrt"  # calibkit.quantize.qdq.Target value
    batch_size: int = 32
    threads: int = 1
    max_length: int | None = None
    output_name: str | None = None  # the model output holding the logits (None: the first)
    # what source_model must hold (the sha256 the engine under study or the tune run recorded); run_jobs
    # refuses a file replaced since, before any variant is built from it
    source_model_sha256: str | None = None


@dataclass(frozen=True)
class SensitivityResult:
    mode: str
    node: str | None
    accuracy: float
    logit_mse: float
    mean_kl: float
    seconds: float
    error: str | None = None  # set when the variant could not be built or run
    error_hint: str | None = None  # what to do about ``error``, when the failure said
    flip_rate: float = float("nan")  # share of examples whose prediction differs from the reference's
    predictions: tuple[int, ...] = ()  # argmax per example, in the order of the job's texts

    def correct(self, labels: np.ndarray) -> np.ndarray:
        return np.asarray(self.predictions, dtype=np.int64) == np.asarray(labels, dtype=np.int64)

    def flips(self, reference_predictions: np.ndarray) -> np.ndarray:
        return np.asarray(self.predictions, dtype=np.int64) != np.asarray(reference_predictions, dtype=np.int64)


def load_calibration_table(path: str | Path) -> CalibrationTable:
    """The CalibrationTable of a calibration.json (calibkit-calibration/1), or of a bare table document."""
    from calibkit.calibrate.tablefile import load_calibration_json

    p = Path(path)
    if p.is_file():
        d = read_json(p)
        if isinstance(d, dict) and "ranges" in d and "format" not in d:
            try:
                return CalibrationTable.from_dict(d)
            except (KeyError, TypeError, ValueError) as exc:
                raise CalibrationError(f"{p} is not a calibkit calibration table ({exc})") from exc
    return load_calibration_json(p).table


def build_variant(
    source_model: str, calibration_json: str, keep_nodes: Sequence[str], target: str = "tensorrt"
) -> bytes:
    """Serialized Q/DQ ONNX of ``source_model`` with ``keep_nodes`` left in higher precision."""
    from calibkit.graph import load_model
    from calibkit.quantize.qdq import Target, quantize_model

    table = load_calibration_table(calibration_json)
    result = quantize_model(load_model(source_model), table, keep_nodes=tuple(keep_nodes), target=Target(target))
    return result.model.SerializeToString()


def run_sensitivity_job(job: SensitivityJob) -> SensitivityResult:
    """Pure work unit: everything it needs is in ``job``; failures come back in ``error``, never raised."""
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.engines.onnxruntime import OnnxRuntimeRunner, evaluation_optimization
    from calibkit.evaluate.predict import predict_logits

    start = time.perf_counter()
    try:
        model = build_variant(job.source_model, job.calibration_json, job.keep_nodes, job.target)
        tok = TextTokenizer(job.tokenizer, max_length=job.max_length)
        with OnnxRuntimeRunner(model, intra_op_threads=job.threads, name=f"{job.mode}:{job.node}",
                               optimization=evaluation_optimization(job.target)) as runner:
            logits = predict_logits(runner, tok, job.texts, batch_size=job.batch_size, output_name=job.output_name)
    except CalibkitError as exc:
        return SensitivityResult(job.mode, job.node, float("nan"), float("nan"), float("nan"),
                                 time.perf_counter() - start, error=exc.message, error_hint=exc.hint)
    ref = np.asarray(job.reference_logits, dtype=np.float64)
    pred = logits.argmax(axis=1)
    acc = float(np.mean(pred == np.asarray(job.labels)))
    flip = float(np.mean(pred != ref.argmax(axis=1))) if len(ref) else float("nan")
    oe = output_error(ref, logits)
    return SensitivityResult(job.mode, job.node, acc, oe.logit_mse, oe.mean_kl, time.perf_counter() - start,
                             flip_rate=flip, predictions=tuple(int(v) for v in pred))


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
