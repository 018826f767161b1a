"""Per-layer sensitivity: the accuracy effect of quantizing only one layer, and of keeping only one layer in
higher precision.

The work unit is pure and serialisable: :class:`SensitivityJob` (a frozen dataclass of paths, texts and
numbers) in, :class:`SensitivityResult` out, so a process pool, ``tune`` or a distributed engine can run it.
Each job rebuilds its variant from the FP32 source model and the calibration table with
``calibkit.quantize.qdq.quantize_model(model, table, keep_nodes=...)``.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from calibkit.consistency import check_file
from calibkit.cpus import usable_cpus
from calibkit.errors import CalibrationError, ModelError
from calibkit.evaluate.boardjobs import run_on_boards, served
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
from calibkit.evidence.intervals import Z95, Interval, PairedDifference, paired_difference
from calibkit.executors import default_workers
from calibkit.executors.base import Executor
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress
from calibkit.tasks import task_class

log = logging.getLogger("calibkit.evaluate.sensitivity")

# the work units live in evaluate.jobs (shipping imports them too); their names are part of this module's API
__all__ = ["ALL_BUT_THIS", "ALL_INT8", "ONLY_THIS", "LayerSensitivity", "SensitivityAnalysis", "SensitivityJob",
           "SensitivityResult", "analyse_sensitivity", "build_variant", "load_calibration_table", "paired_values",
           "run_jobs", "run_sensitivity_job"]


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
        acc = f"accuracy {r.accuracy:.4f}, " if np.isfinite(r.accuracy) else ""
        log.info("%s %s %s: %sagreement %s (%.1f s)", task, r.mode, r.node or "", acc,
                 f"{1 - r.flip_rate:.4f}" if np.isfinite(r.flip_rate) else "n/a", r.seconds)
        if on_result is not None:
            on_result(i, r)

    if executor is None:
        n = workers if workers is not None else default_workers()
        if served(jobs):  # one session per process serves every job: a pool only when it has cores to use
            from calibkit.executors import from_spec

            with from_spec("local", n) as ex:
                return run_jobs(jobs, progress=progress, task=task, executor=ex, on_result=on_result)
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
    if served(jobs):
        done = [0]

        def counted(i: int, r: SensitivityResult) -> None:
            finished(i, r)
            done[0] += 1
            cb(ProgressEvent(task, done[0], len(jobs), message=r.node or r.mode))

        try:
            cb(ProgressEvent(task, 0, len(jobs)))
            return run_on_boards(jobs, executor, counted)
        except ModelError as exc:  # a model the switchboard cannot be made of: one variant per job, as before
            log.warning("evaluating each variant on its own: %s", exc.message)
    from calibkit.evaluate.shipping import pack_jobs, run_shipped_job

    shipped = pack_jobs(jobs, executor, threads=executor.task_threads)
    return executor.map(run_shipped_job, shipped, task=task, progress=cb, on_result=finished)


class PairedMeanDifference(PairedDifference):
    """``b - a`` of a per-text value in [0, 1] that is not 0/1 (cosine, the share of a text's tokens kept):
    a paired bootstrap of the mean difference; ``a_only`` / ``b_only`` count the texts where a / b is higher,
    and the examples that would settle it come from the spread of the per-text differences."""

    def __init__(self, interval: Interval, a_only: int, b_only: int, n: int, sd: float) -> None:
        super().__init__(interval, a_only, b_only, n, float("nan"))
        object.__setattr__(self, "sd", sd)

    def examples_to_settle(self) -> int | None:
        effect = self.interval.estimate
        if self.n <= 0 or not effect or not self.sd:  # type: ignore[attr-defined]
            return None
        return int(math.ceil((Z95 * self.sd / effect) ** 2))  # type: ignore[attr-defined]


def paired_values(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, *, seed: int = 0,
                  resamples: int = 2000) -> PairedDifference:
    """95 % paired interval of mean(b) - mean(a) over the same texts: ``uncertainty.paired_difference`` when
    every value is 0 or 1 (agreement of classification and embeddings), else a paired bootstrap of the mean
    per-text difference (:class:`PairedMeanDifference`)."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"paired values differ in shape: {x.shape} vs {y.shape}")
    if np.isin(x, (0.0, 1.0)).all() and np.isin(y, (0.0, 1.0)).all():
        return paired_difference(x.astype(bool), y.astype(bool), seed=seed, resamples=resamples)
    d = y - x
    n = int(d.size)
    est = float(d.mean()) if n else float("nan")
    if n == 0 or not np.any(d):
        iv = Interval(est, est, est) if n else Interval(est, float("-inf"), float("inf"))
    else:
        rows = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
        lo, hi = np.quantile(d[rows].mean(axis=1), [0.025, 0.975])
        iv = Interval(est, float(lo), float(hi))
    return PairedMeanDifference(iv, int((d < 0).sum()), int((d > 0).sum()), n, float(d.std(ddof=1)) if n > 1 else 0.0)


@dataclass(frozen=True)
class LayerSensitivity:
    """A layer's two variants against the reference and the all-INT8 variant. Accuracy deltas (fractions) only
    where the texts have class labels; fidelity (``evidence.rowfidelity``: agreement for every task, cosine for
    embeddings) always, as paired differences over the per-text values."""

    node: str
    only_this: SensitivityResult  # every other node kept in higher precision
    # this node kept in higher precision; None: not run, because quantizing only this node already settled its
    # flag (see analyse_sensitivity's ``settles``)
    all_but_this: SensitivityResult | None
    only_this_delta: float | None = None  # accuracy(only this INT8) - accuracy(reference); None without labels
    all_but_this_delta: float | None = None  # accuracy(all but this) - accuracy(all INT8); None without labels
    # paired 95 % intervals of the two deltas (same examples); None when a variant failed or without labels
    only_this_diff: PairedDifference | None = None
    all_but_this_diff: PairedDifference | None = None
    # agreement with the reference recovered by keeping only this layer in higher precision (all but this
    # minus all INT8, per text; for classification: the flips it removes; positive = recovered)
    flips_removed: PairedDifference | None = None
    # agreement lost by quantizing only this layer (only this minus the reference's 1.0; negative = lost)
    agreement_cost: PairedDifference | None = None
    # embeddings: cosine to the reference recovered / lost the same ways
    cosine_recovered: PairedDifference | None = None
    cosine_cost: PairedDifference | None = None


@dataclass(frozen=True)
class SensitivityAnalysis:
    samples: int
    reference_accuracy: float | None  # None without labels
    all_int8: SensitivityResult
    layers: tuple[LayerSensitivity, ...]
    task: str = "classification"

    @property
    def labelled(self) -> bool:
        return self.reference_accuracy is not None


def analyse_sensitivity(
    nodes: Sequence[str],
    *,
    source_model: str,
    calibration_json: str,
    tokenizer: str,
    texts: Sequence[str],
    labels: Sequence[int] = (),
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
    task: str = "classification",
    pooling: str | None = None,
    neighbour_index: np.ndarray | None = None,
    index_rows: Sequence[int] | None = None,
    settles: Callable[[LayerSensitivity], bool] | None = None,
) -> SensitivityAnalysis:
    """Two variants per node plus one all-INT8 variant, on ``texts`` (already the subset to use).

    ``settles(layer)``: whether quantizing only a node already settles its flag (``decisions.cost_settles``):
    its all-but-this variant is then not run; None: every node gets both.

    ``reference_logits``: the reference's outputs on ``texts`` in ``task``'s terms (``evaluate.jobs``:
    logits, vectors, or token tag ids); ``labels``: class ids of ``texts`` (classification; empty: judged on
    fidelity alone). ``neighbour_index`` / ``index_rows`` (embeddings): the FP32 vectors nearest neighbours are
    looked up among, and each text's own row there. ``base_keep``: nodes the engine under study already keeps
    in higher precision (kept in every variant). ``source_model_sha256`` / ``calibration_sha256``: what the
    engine under study was built from (its sidecar); the files are refused before any variant is built when
    their bytes differ.
    """
    check_file(calibration_json, calibration_sha256, what="the calibration table the variants are rebuilt from",
               error=CalibrationError, hint="restore that calibration.json, or rebuild the engine with "
                                            "`calibkit build`")
    nodes = list(dict.fromkeys(nodes))
    n = workers if workers is not None else default_workers()
    threads = executor.threads_per_task if executor is not None else max(1, usable_cpus() // max(1, n))
    labelled = task_class(task).classifies and len(labels) == len(texts) and len(texts) > 0
    base = _job_fields(
        source_model=str(source_model), calibration_json=str(calibration_json), tokenizer=str(tokenizer),
        texts=tuple(texts), labels=tuple(int(v) for v in labels) if labelled else (),
        reference_logits=reference_logits, batch_size=batch_size, threads=threads, max_length=max_length,
        target=target, output_name=output_name, source_model_sha256=source_model_sha256, task=task,
        pooling=pooling, neighbour_index=neighbour_index, index_rows=index_rows)
    kept = tuple(base_keep)

    def job(mode: str, keep: tuple[str, ...], node: str | None = None) -> SensitivityJob:
        return SensitivityJob(keep_nodes=keep, mode=mode, node=node, **base)  # type: ignore[arg-type]

    def all_but(node: str) -> SensitivityJob:
        return job(ALL_BUT_THIS, (node, *kept), node)

    first = [job(ALL_INT8, kept)] + [job(ONLY_THIS, tuple(x for x in nodes if x != m) + kept, m) for m in nodes]
    run = functools.partial(run_jobs, workers=n, progress=progress, executor=executor)
    if settles is None:  # one call: every variant in one executor map
        results = run(first + [all_but(node) for node in nodes])
        only, rest = results[1:1 + len(nodes)], dict(zip(nodes, results[1 + len(nodes):]))
    else:
        results = run(first, task="sensitivity (one layer INT8)")
        only, rest = results[1:], {}
    all_int8 = _all_int8(results[0])
    y = np.asarray(labels, dtype=np.int64) if labelled else None
    ref_correct = np.asarray(reference_logits).argmax(axis=1) == y if y is not None else None
    if settles is not None:
        open_nodes = [node for node, r in zip(nodes, only)
                      if not settles(_layer(node, r, None, all_int8, y, ref_correct, len(texts)))]
        log.info("sensitivity: %d of %d nodes settled by quantizing only them", len(nodes) - len(open_nodes),
                 len(nodes))
        rest = dict(zip(open_nodes, run([all_but(node) for node in open_nodes], task="sensitivity (one layer kept)")))
    per_node = [_layer(node, only[k], rest.get(node), all_int8, y, ref_correct, len(texts))
                for k, node in enumerate(nodes)]
    ref_acc = float(np.mean(ref_correct)) if ref_correct is not None else None
    return SensitivityAnalysis(len(texts), ref_acc, all_int8, tuple(per_node), task)


def _all_int8(r: SensitivityResult) -> SensitivityResult:
    if r.error:
        raise CalibrationError(f"sensitivity: the all-INT8 variant could not be built: {r.error}",
                               hint=r.error_hint or "run with --no-sensitivity to compare without it")
    return r


def _job_fields(*, reference_logits: np.ndarray, neighbour_index: np.ndarray | None,
                index_rows: Sequence[int] | None, **fields: object) -> dict[str, object]:
    """The fields every job of one analysis shares, as a SensitivityJob holds them (nested tuples)."""
    return dict(fields, reference_logits=_nested(reference_logits),
                neighbour_index=None if neighbour_index is None else _nested(neighbour_index),
                index_rows=None if index_rows is None else tuple(int(v) for v in index_rows))


def _nested(a: np.ndarray) -> tuple:
    return tuple(tuple(float(v) for v in np.ravel(row)) for row in np.asarray(a))


def _layer(node: str, only: SensitivityResult, abt: SensitivityResult | None, all_int8: SensitivityResult,
           y: np.ndarray | None, ref_correct: np.ndarray | None, n: int) -> LayerSensitivity:
    """One node's effects: accuracy deltas where ``y`` (labels) exist, fidelity always (``abt`` None: only the
    effects of quantizing only this node)."""
    for r in (only, abt):
        if r is not None and r.error:
            log.warning("sensitivity variant %s for %s failed: %s", r.mode, node, r.error)
    ok = len(all_int8.agreement_values) == n
    only_ok = ok and not only.error and len(only.agreement_values) == n
    abt_ok = abt is not None and ok and not abt.error and len(abt.agreement_values) == n
    ones = np.ones(n)
    acc: dict = {}
    if y is not None and ref_correct is not None:
        acc = dict(
            only_this_delta=only.accuracy - float(np.mean(ref_correct)) if not only.error else None,
            all_but_this_delta=abt.accuracy - all_int8.accuracy if abt is not None and not abt.error else None,
            only_this_diff=paired_difference(ref_correct, only.correct(y)) if only_ok else None,
            all_but_this_diff=paired_difference(all_int8.correct(y), abt.correct(y)) if abt_ok and abt else None,
        )
    cos = ok and len(all_int8.cosine_values) == n
    return LayerSensitivity(
        node, only, abt, **acc,
        flips_removed=paired_values(all_int8.agreement_values, abt.agreement_values) if abt_ok and abt else None,
        agreement_cost=paired_values(ones, only.agreement_values) if only_ok else None,
        cosine_recovered=paired_values(all_int8.cosine_values, abt.cosine_values)
        if abt_ok and abt and cos and len(abt.cosine_values) == n else None,
        cosine_cost=paired_values(ones, only.cosine_values) if only_ok and cos and len(only.cosine_values) == n
        else None,
    )
