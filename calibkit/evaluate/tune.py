"""`calibkit tune`: the mixed-precision plan with the most INT8 work that keeps accuracy within a target.

Flow (every number below is measured, none estimated):
1. statistics of the calibration set, collected once (reused from the statistics cache when present);
2. one table per method; with ``method="auto"`` each tensor takes the method whose all-INT8 model gives the
   best SQNR at the output of the node that reads it, and the auto table must beat every single-method table
   on the search split to be used (otherwise the best single method is);
3. the eval set is split (stratified by label, seeded) into a *search* part and a *holdout* part: every
   decision uses the search part; the holdout part is only measured at the end, for all-INT8 and the final plan,
   so over-fitting the search part shows as a gap between the two;
4. sensitivity ranking: for every quantized node, the KL divergence to FP32 when only that node is kept in
   higher precision (on a subset of the search part);
5. calibkit.evaluate.search.search_plan: prefix / bisect / prune over the ranking, each candidate evaluated
   on the whole search part.
Each finished evaluation is appended to ``OUT/.tune/ledger.jsonl`` (keyed by what determines its result), so
an interrupted run resumes without redoing it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from calibkit import __version__
from calibkit._io import atomic_dir, dumps_json, read_json, sha256_bytes, write_json
from calibkit.calibrate.methods import compute_table
from calibkit.calibrate.pipeline import gather_stats
from calibkit.calibrate.tablefile import write_calibration_json
from calibkit.calibrate.trtcache import write_cache
from calibkit.data.calibset import CalibrationSet, load_calibration_set
from calibkit.data.evalset import EvalSet, label_ids
from calibkit.data.modeldir import ModelDir
from calibkit.data.tokenizer import TextTokenizer
from calibkit.errors import CalibrationError, DataError
from calibkit.evaluate.flops import node_flops
from calibkit.evaluate.search import Measured, Plan, search_plan
from calibkit.evaluate.sensitivity import (
    ALL_BUT_THIS,
    ALL_INT8,
    SensitivityJob,
    SensitivityResult,
    run_jobs,
)
from calibkit.executors import Executor, from_spec
from calibkit.graph import load_model, model_sha256
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress
from calibkit.quantize.placement import DEFAULT_OP_TYPES, plan_placement
from calibkit.types import CalibrationTable, Method, MethodParams

log = logging.getLogger("calibkit.evaluate.tune")

TUNE_FORMAT = "calibkit-tune/1"
PLAN_MODE = "plan"


@dataclass(frozen=True)
class TuneConfig:
    max_drop: float = 0.5  # accuracy points (or percent of FP32 accuracy with relative=True)
    relative: bool = False
    method: str = "auto"  # "auto" or a Method value
    holdout_fraction: float = 0.3
    sensitivity_samples: int = 256
    sensitivity_layers: int | None = 16  # measured sensitivity for the K worst layers (own SQNR); None: all
    max_evaluations: int = 40
    workers: int | None = None
    seed: int = 0
    target: str = "tensorrt"
    op_types: tuple[str, ...] = DEFAULT_OP_TYPES
    batch_size: int = 32
    params: MethodParams = field(default_factory=MethodParams)

    def threshold(self, fp32_accuracy: float) -> float:
        if self.relative:
            return fp32_accuracy * (1.0 - self.max_drop / 100.0)
        return fp32_accuracy - self.max_drop / 100.0


@dataclass(frozen=True)
class TuneResult:
    out_dir: Path
    model_path: Path
    cache_path: Path
    json_path: Path
    plan_path: Path
    doc: dict[str, Any]
    kept_nodes: tuple[str, ...]
    int8_flops_fraction: float
    fp32_accuracy_holdout: float
    accuracy_holdout: float
    met_target: bool
    resumed_evaluations: int


# -- helpers ---------------------------------------------------------------------------------------------------
def split_eval(labels: np.ndarray, holdout_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Stratified (by label) seeded split into search and holdout indices, each sorted."""
    if not 0.0 <= holdout_fraction < 1.0:
        raise DataError(f"--holdout must be in [0, 1), got {holdout_fraction}")
    rng = np.random.default_rng(seed)
    search, hold = [], []
    for lab in np.unique(labels):
        idx = np.flatnonzero(labels == lab)
        rng.shuffle(idx)
        n_hold = int(round(len(idx) * holdout_fraction))
        hold.extend(idx[:n_hold].tolist())
        search.extend(idx[n_hold:].tolist())
    return np.array(sorted(search), dtype=np.int64), np.array(sorted(hold), dtype=np.int64)


class Ledger:
    """Append-only JSON Lines of finished evaluations; a torn last line (interrupted write) is ignored."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._done: dict[str, dict[str, Any]] = {}
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    rec = json.loads(line)
                    self._done[rec["key"]] = rec
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue
        self.loaded = len(self._done)

    def get(self, key: str) -> dict[str, Any] | None:
        return self._done.get(key)

    def put(self, key: str, record: dict[str, Any]) -> None:
        rec = {**record, "key": key}
        self._done[key] = rec
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec, sort_keys=True, allow_nan=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def _job_key(job: SensitivityJob, table_sha: str, model_sha: str) -> str:
    payload = {
        "model": model_sha,
        "table": table_sha,
        "keep": sorted(job.keep_nodes),
        "texts": sha256_bytes("\n".join(job.texts).encode("utf-8")),
        "target": job.target,
        "mode": job.mode,
    }
    return sha256_bytes(json.dumps(payload, sort_keys=True).encode("utf-8"))[:32]


def _result_record(r: SensitivityResult) -> dict[str, Any]:
    return {
        "mode": r.mode, "node": r.node, "accuracy": r.accuracy, "logit_mse": r.logit_mse,
        "mean_kl": r.mean_kl, "seconds": r.seconds, "error": r.error,
    }


def _from_record(rec: dict[str, Any]) -> SensitivityResult:
    return SensitivityResult(rec["mode"], rec.get("node"), float(rec["accuracy"]), float(rec["logit_mse"]),
                             float(rec["mean_kl"]), float(rec["seconds"]), rec.get("error"))


class _Evaluator:
    """Runs SensitivityJobs through the ledger: finished ones are read back, the rest run on the executor, and
    each result is in the ledger as soon as it comes back (an interrupt loses only the units in flight)."""

    def __init__(self, ledger: Ledger, model_sha: str, executor: Executor, progress: ProgressCallback) -> None:
        self.ledger = ledger
        self.model_sha = model_sha
        self.executor = executor
        self.progress = progress
        self.reused = 0
        self.ran = 0

    def run(self, jobs: Sequence[SensitivityJob], table_sha: str, task: str) -> list[SensitivityResult]:
        keys = [_job_key(j, table_sha, self.model_sha) for j in jobs]
        out: list[SensitivityResult | None] = []
        todo: list[int] = []
        for i, k in enumerate(keys):
            rec = self.ledger.get(k)
            if rec is not None and not rec.get("error"):
                out.append(_from_record(rec))
                self.reused += 1
            else:
                out.append(None)
                todo.append(i)
        reused = len(jobs) - len(todo)
        self.progress(ProgressEvent(task, reused, len(jobs)))

        def record(pos: int, r: SensitivityResult) -> None:
            i = todo[pos]
            out[i] = r
            self.ran += 1
            if not r.error:
                self.ledger.put(keys[i], _result_record(r))
            self.progress(ProgressEvent(task, sum(x is not None for x in out), len(jobs)))

        if todo:
            run_jobs([jobs[i] for i in todo], executor=self.executor, task=task, on_result=record)
        failed = [r for r in out if r is not None and r.error]
        if failed:
            raise CalibrationError(f"{len(failed)} evaluations failed, e.g.: {failed[0].error}")
        return [r for r in out if r is not None]


def _accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(logits.argmax(axis=1) == labels)) if len(labels) else float("nan")


def _write_table(path: Path, table: CalibrationTable, extras: dict[str, Any]) -> str:
    write_calibration_json(path, table, extras)
    return sha256_bytes(dumps_json(table.to_dict()).encode("utf-8"))


def _typical_feeds(tok: TextTokenizer, cset: CalibrationSet, input_names: Sequence[str]) -> dict[str, np.ndarray]:
    lengths = np.minimum(tok.token_lengths(cset.texts), tok.max_length)
    median_text = cset.texts[int(np.argsort(lengths)[len(lengths) // 2])]
    return tok.encode([median_text]).feeds(input_names)


# -- the pipeline ----------------------------------------------------------------------------------------------
def run_tune(
    model_dir: ModelDir,
    calibration_set: CalibrationSet | str | Path,
    eval_set: EvalSet,
    out_dir: str | Path,
    config: TuneConfig = TuneConfig(),
    *,
    progress: ProgressCallback | None = None,
    render: Callable[[dict[str, Any], Path], Any] | None = None,
    report_dir: str | Path | None = None,
    executor: Executor | None = None,
) -> TuneResult:
    """``executor``: where evaluations run (default: a process pool of ``config.workers``, closed at the end)."""
    with contextlib.ExitStack() as stack:
        given = executor is not None
        if executor is None:
            executor = stack.enter_context(from_spec("local", config.workers))
        return _run_tune(model_dir, calibration_set, eval_set, out_dir, config, progress=progress, render=render,
                         report_dir=report_dir, executor=executor, shard_stats=given)


def _run_tune(
    model_dir: ModelDir,
    calibration_set: CalibrationSet | str | Path,
    eval_set: EvalSet,
    out_dir: str | Path,
    config: TuneConfig,
    *,
    progress: ProgressCallback | None,
    render: Callable[[dict[str, Any], Path], Any] | None,
    report_dir: str | Path | None,
    executor: Executor,
    shard_stats: bool,
) -> TuneResult:
    cb = progress or no_progress
    out = Path(out_dir)
    work = out.parent / f".{out.name}.tune"  # beside OUT so OUT itself is swapped in whole at the end
    t0 = time.perf_counter()
    cset = calibration_set if isinstance(calibration_set, CalibrationSet) else load_calibration_set(calibration_set)
    tok = TextTokenizer(model_dir.tokenizer_path, max_length=model_dir.max_length)
    sha = model_sha256(model_dir.onnx_path)
    proto = load_model(model_dir.onnx_path)
    input_names = [i.name for i in proto.graph.input if i.name not in {x.name for x in proto.graph.initializer}]
    placement = plan_placement(proto, config.op_types)
    nodes = [n.name for n in placement.nodes]
    if not nodes:
        raise CalibrationError(f"no {', '.join(config.op_types)} nodes to quantize in {model_dir.onnx_path.name}")

    # eval set -> ids, split
    id2label = model_dir.id2label
    if not id2label:
        raise DataError("the model folder's config.json has no id2label: tune cannot map eval labels to classes")
    labels = label_ids(eval_set, id2label, len(id2label))
    search_idx, hold_idx = split_eval(labels, config.holdout_fraction, config.seed)
    if len(search_idx) < 10:
        raise DataError(f"the eval set is too small to tune on ({len(eval_set)} examples)",
                        hint="use at least a few hundred labelled examples")
    texts = eval_set.texts
    search_texts = tuple(texts[i] for i in search_idx)
    rng = np.random.default_rng(config.seed + 1)
    sens_pick = np.sort(rng.permutation(len(search_idx))[: min(config.sensitivity_samples, len(search_idx))])

    # FP32 reference logits on everything (once)
    from calibkit.engines.onnxruntime import OnnxRuntimeRunner
    from calibkit.evaluate.predict import predict_logits

    with OnnxRuntimeRunner(model_dir.onnx_path, name="fp32") as fp32:
        ref_logits = predict_logits(fp32, tok, texts, batch_size=config.batch_size, progress=cb,
                                    task="FP32 reference")
    fp32_search = _accuracy(ref_logits[search_idx], labels[search_idx])
    fp32_hold = _accuracy(ref_logits[hold_idx], labels[hold_idx]) if len(hold_idx) else float("nan")
    threshold = config.threshold(fp32_search)

    # statistics and tables
    store, reused_stats = gather_stats(model_dir, cset, placement.activations, model_sha256=sha,
                                       num_bins=config.params.num_bins, batch_size=config.batch_size, progress=cb,
                                       model=proto, executor=executor if shard_stats else None)
    flops = {f.node: f.flops for f in node_flops(proto, _typical_feeds(tok, cset, input_names), config.op_types)}
    work.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(work / "ledger.jsonl")
    threads = executor.threads_per_task
    ev = _Evaluator(ledger, sha, executor, cb)

    def job(table_path: Path, keep: Plan, text_subset: Sequence[str], idx: np.ndarray, mode: str,
            node: str | None = None) -> SensitivityJob:
        return SensitivityJob(
            source_model=str(model_dir.onnx_path), calibration_json=str(table_path),
            tokenizer=str(model_dir.tokenizer_path), texts=tuple(text_subset),
            labels=tuple(int(v) for v in labels[idx]),
            reference_logits=tuple(tuple(float(v) for v in row) for row in ref_logits[idx]),
            keep_nodes=tuple(keep), mode=mode, node=node, target=config.target,
            batch_size=config.batch_size, threads=threads, max_length=model_dir.max_length,
        )

    methods = [Method(config.method)] if config.method != "auto" else list(Method)
    tables: dict[str, tuple[CalibrationTable, Path, str]] = {}
    for m in methods:
        t = compute_table(store, m, config.params, sha, cset.id, tensors=placement.activations)
        p = work / f"table-{m.value}.json"
        tables[m.value] = (t, p, _write_table(p, t, {"target": config.target}))

    chosen_methods: dict[str, str] = {}
    probe_texts = search_texts[: min(128, len(search_texts))]
    quality = _layer_quality(proto, {k: v[0] for k, v in tables.items()}, tok, probe_texts, cb)
    if config.method == "auto":
        chosen_methods = _auto_methods(quality, placement.activations)
        per_tensor = {t: Method(m) for t, m in chosen_methods.items()}
        t = compute_table(store, per_tensor, config.params, sha, cset.id, tensors=placement.activations)
        p = work / "table-auto.json"
        tables["auto"] = (t, p, _write_table(p, t, {"target": config.target}))

    # all-INT8 accuracy of every table on the search split; the best one is the base of the search
    base_jobs = {k: job(v[1], (), search_texts, search_idx, ALL_INT8) for k, v in tables.items()}
    table_acc: dict[str, float] = {}
    for k, j in base_jobs.items():
        (r,) = ev.run([j], tables[k][2], f"all-INT8 ({k})")
        table_acc[k] = r.accuracy
    base_key = max(table_acc, key=lambda k: (table_acc[k], k == "auto"))
    table, table_path, table_sha = tables[base_key]

    # ranking: layers ordered by their own quantization error (cheap, every layer), then the worst K of them
    # re-ordered by measured sensitivity (keep only this one in higher precision) on a subset of the search split
    if base_key not in quality:
        quality.update(_layer_quality(proto, {base_key: table}, tok, probe_texts, cb))
    from calibkit.evaluate.compare import worst_layers
    from calibkit.evaluate.layers import weight_errors

    base_meas, base_model = quality[base_key]
    by_badness = [spec.node for spec in worst_layers(base_meas.layers, weight_errors(base_model, proto), None)]
    by_badness += [n for n in nodes if n not in by_badness]
    k = len(nodes) if config.sensitivity_layers is None else min(config.sensitivity_layers, len(nodes))
    sens_texts = tuple(search_texts[i] for i in sens_pick)
    sens_idx = search_idx[sens_pick]
    sens_jobs = [job(table_path, (n,), sens_texts, sens_idx, ALL_BUT_THIS, n) for n in by_badness[:k]]
    (sens_base,) = ev.run([job(table_path, (), sens_texts, sens_idx, ALL_INT8)], table_sha, "sensitivity base")
    sens = ev.run(sens_jobs, table_sha, "sensitivity (keep one node)")
    gain = {r.node: sens_base.mean_kl - r.mean_kl for r in sens if r.node}
    ranking = sorted(by_badness[:k], key=lambda n: (-gain[n], flops.get(n, 0.0))) + by_badness[k:]

    def evaluate(plans: Sequence[Plan]) -> list[float]:
        res = ev.run([job(table_path, p, search_texts, search_idx, PLAN_MODE) for p in plans], table_sha,
                     "candidate plans")
        return [r.accuracy for r in res]

    outcome = search_plan(ranking, flops, evaluate, threshold, max_evaluations=config.max_evaluations)
    final: Measured | None = outcome.best
    if final is None:  # nothing met the target: report the most accurate plan measured
        final = max(outcome.tried, key=lambda m: (m.accuracy, m.int8_flops_fraction))
    met = outcome.best is not None

    # holdout check: all-INT8 and the final plan, measured once each
    hold_texts = tuple(texts[i] for i in hold_idx)
    hold_acc: dict[Plan, float] = {}
    if len(hold_idx):
        plans_to_check = list(dict.fromkeys([(), final.plan]))
        res = ev.run([job(table_path, p, hold_texts, hold_idx, PLAN_MODE) for p in plans_to_check], table_sha,
                     "holdout check")
        hold_acc = {p: r.accuracy for p, r in zip(plans_to_check, res, strict=True)}

    own_sqnr: dict[str, float] = {}
    for lm in base_meas.layers:
        if lm.quant_sqnr_db is not None:
            own_sqnr[lm.spec.node] = min(own_sqnr.get(lm.spec.node, float("inf")), lm.quant_sqnr_db)
    reasons = _reasons(final.plan, gain, sens_base, flops, own_sqnr, outcome.tried)
    doc = _document(config, eval_set, fp32_search, fp32_hold, threshold, outcome.tried, final, met, hold_acc,
                    reasons, table_acc, base_key, chosen_methods, len(search_idx), len(hold_idx), len(sens_idx),
                    reused_stats, ev.reused, time.perf_counter() - t0)
    result = _write_outputs(out, model_dir, proto, table, final.plan, config, doc, reasons)
    if render is not None:
        render(doc, Path(report_dir) if report_dir else out / "report")
    return replace(result, resumed_evaluations=ledger.loaded)


def _layer_quality(
    fp: Any,
    tables: dict[str, CalibrationTable],
    tok: TextTokenizer,
    texts: Sequence[str],
    cb: ProgressCallback,
) -> dict[str, tuple[Any, Any]]:
    """Per table: the per-layer measurements (own and output SQNR) of its all-INT8 model, and that model."""
    from calibkit.evaluate.layers import find_layers
    from calibkit.evaluate.taps import measure_layers, ort_runner_factory
    from calibkit.quantize.qdq import Target, quantize_model

    out: dict[str, tuple[Any, Any]] = {}
    for i, (m, table) in enumerate(tables.items()):
        cb(ProgressEvent("per-layer SQNR of each table", i, len(tables), message=m))
        q = quantize_model(fp, table, target=Target.TENSORRT).model
        out[m] = (measure_layers(find_layers(q), texts, tok, reference=fp, baseline=fp, candidate=q,
                                 runner_factory=ort_runner_factory()), q)
    cb(ProgressEvent("per-layer SQNR of each table", len(tables), len(tables)))
    return out


def _auto_methods(quality: dict[str, tuple[Any, Any]], tensors: Sequence[str]) -> dict[str, str]:
    """For each tensor, the method whose all-INT8 model has the best SQNR at the output of the node reading it
    (the worst over its consumers)."""
    sqnr: dict[str, dict[str, float]] = {}
    for m, (meas, _) in quality.items():
        for lm in meas.layers:
            v = lm.sqnr_db if lm.sqnr_db is not None else float("-inf")
            prev = sqnr.setdefault(lm.spec.tensor, {}).get(m, float("inf"))
            sqnr[lm.spec.tensor][m] = min(prev, v)
    first = next(iter(quality))
    return {t: max(sqnr.get(t, {first: 0.0}).items(), key=lambda kv: kv[1])[0] for t in tensors}


def _reasons(
    plan: Plan, gain: dict[str, float], base: SensitivityResult, flops: dict[str, float],
    own_sqnr: dict[str, float], tried: Sequence[Measured] = (),
) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    total = sum(flops.values()) or 1.0
    for n in plan:
        r = []
        if n in gain:
            r.append(f"keeping only it in higher precision lowers the output KL divergence to FP32 from "
                     f"{base.mean_kl:.4g} to {base.mean_kl - gain[n]:.4g} on the sensitivity subset")
        if n in own_sqnr:
            r.append(f"its own INT8 error: SQNR {own_sqnr[n]:.1f} dB (input against its fake-quantized copy)")
        without = tuple(x for x in plan if x != n)
        miss = next((m for m in tried if m.plan == without and not m.meets), None)
        if miss is not None:
            r.append(f"the same plan with it in INT8 was measured at {100 * miss.accuracy:.2f} %, below the target")
        r.append(f"costs {100 * flops.get(n, 0.0) / total:.2f} % of the MatMul/Gemm FLOPs")
        out[n] = r
    return out


def _document(config: TuneConfig, eval_set: EvalSet, fp32_search: float, fp32_hold: float, threshold: float,
              tried: Sequence[Measured], final: Measured, met: bool, hold_acc: dict[Plan, float],
              reasons: dict[str, list[str]], table_acc: dict[str, float], base_key: str,
              chosen_methods: dict[str, str], n_search: int, n_hold: int, n_sens: int, reused_stats: bool,
              reused_evals: int, seconds: float) -> dict[str, Any]:
    candidates = [
        {"id": i, "stage": m.stage, "int8_flops_fraction": m.int8_flops_fraction, "accuracy_search": m.accuracy,
         "accuracy_holdout": hold_acc.get(m.plan), "kept_nodes": list(m.plan), "method": base_key,
         "accepted": m.plan == final.plan, "meets_target": m.meets}
        for i, m in enumerate(tried)
    ]
    method_counts: dict[str, int] = {}
    for m in chosen_methods.values():
        method_counts[m] = method_counts.get(m, 0) + 1
    return {
        "format": TUNE_FORMAT,
        "calibkit_version": __version__,
        "eval_set": {"path": str(eval_set.path), "count": len(eval_set), "search": n_search, "holdout": n_hold,
                     "sensitivity_samples": n_sens},
        "target": {"max_drop": config.max_drop, "relative": config.relative, "fp32_accuracy": fp32_search,
                   "fp32_accuracy_holdout": fp32_hold, "threshold": threshold, "met": met},
        "methods": {"requested": config.method, "all_int8_accuracy_search": table_acc, "chosen": base_key,
                    "per_tensor_counts": method_counts},
        "candidates": candidates,
        "final": {"kept_nodes": list(final.plan), "int8_flops_fraction": final.int8_flops_fraction,
                  "accuracy_search": final.accuracy, "accuracy_holdout": hold_acc.get(final.plan),
                  "all_int8_accuracy_holdout": hold_acc.get(()), "reasons": reasons, "method": base_key},
        "peers": [],
        "statistics_reused": reused_stats,
        "evaluations_reused": reused_evals,
        "seconds": round(seconds, 1),
    }


def _write_outputs(out: Path, model_dir: ModelDir, fp: Any, table: CalibrationTable, plan: Plan,
                   config: TuneConfig, doc: dict[str, Any], reasons: dict[str, list[str]]) -> TuneResult:
    from calibkit.quantize.qdq import Target, quantize_model, save_model

    q = quantize_model(fp, table, op_types=config.op_types, keep_nodes=plan,
                       target=Target(config.target))
    plan_doc = {
        "format": "calibkit-plan/1",
        "kept_nodes": list(plan),
        "precision_of_kept": "fp16 (TensorRT) / fp32 (ONNX Runtime CPU)",
        "reasons": reasons,
        "int8_flops_fraction": doc["final"]["int8_flops_fraction"],
        "accuracy": {"fp32_search": doc["target"]["fp32_accuracy"], "search": doc["final"]["accuracy_search"],
                     "fp32_holdout": doc["target"]["fp32_accuracy_holdout"],
                     "holdout": doc["final"]["accuracy_holdout"]},
        "met_target": doc["target"]["met"],
        "method": doc["final"]["method"],
    }
    extras = {
        "target": config.target, "op_types": list(config.op_types), "exclude": [],
        "quantized_nodes": list(q.quantized_nodes), "kept_nodes": list(q.kept_nodes),
        "missing_ranges": list(q.missing_ranges),
        "files": {"model": "model.int8.onnx", "cache": "calibration.cache", "plan": "plan.json"},
        "source_model": str(model_dir.onnx_path), "tokenizer": str(model_dir.tokenizer_path),
        "tune": {"max_drop": config.max_drop, "relative": config.relative},
    }
    with atomic_dir(out) as tmp:
        save_model(q.model, tmp / "model.int8.onnx")
        write_cache(tmp / "calibration.cache", table)
        write_calibration_json(tmp / "calibration.json", table, extras)
        write_json(tmp / "plan.json", plan_doc)
        write_json(tmp / "tune.json", doc)
    final = doc["final"]
    return TuneResult(
        out_dir=out, model_path=out / "model.int8.onnx", cache_path=out / "calibration.cache",
        json_path=out / "calibration.json", plan_path=out / "plan.json", doc=doc, kept_nodes=tuple(plan),
        int8_flops_fraction=float(final["int8_flops_fraction"]),
        fp32_accuracy_holdout=float(doc["target"]["fp32_accuracy_holdout"] or float("nan")),
        accuracy_holdout=float(final["accuracy_holdout"]) if final["accuracy_holdout"] is not None else float("nan"),
        met_target=bool(doc["target"]["met"]), resumed_evaluations=0,
    )


def load_tune_document(path: str | Path) -> dict[str, Any]:
    d = read_json(path)
    if not isinstance(d, dict) or d.get("format") != TUNE_FORMAT:
        raise DataError(f"{path} is not a calibkit tune document")
    return d
