"""Compare two engines (and optionally a reference) on a labelled eval set, layer by layer.

Flow: evaluate each engine untapped (accuracy, F1, confusion, latency) -> compare outputs -> read the INT8
model's Q/DQ clipping ranges -> stream the eval inputs through tapped copies (FP ranges, SQNR, cosine) ->
optional per-layer sensitivity in a process pool -> flags and a recommendation. The result is plain data
(:class:`Comparison`) that renders to the calibkit-compare/1 JSON document.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from calibkit import __version__
from calibkit.consistency import check_engines
from calibkit.data.evalset import EvalSet, label_ids
from calibkit.data.tokenizer import TextTokenizer
from calibkit.engines.artifact import EngineArtifact
from calibkit.engines.base import BaseRunner
from calibkit.errors import DataError, ModelError, UsageError
from calibkit.evaluate.flags import Flag, LayerFlag, Thresholds, flag_layer, gate_on_overall
from calibkit.evaluate.layers import LayerSpec, WeightError, find_layers, weight_errors
from calibkit.evaluate.metrics import (
    ClassificationMetrics,
    ConfidenceBucket,
    LatencyStats,
    OutputAgreement,
    OutputError,
    classification_metrics,
    flips_by_confidence,
    latency_stats,
    output_agreement,
    output_error,
    top2_gap,
)
from calibkit.evaluate.predict import Predicted, predict_logits
from calibkit.evaluate.schema import FORMAT
from calibkit.evaluate.sensitivity import LayerSensitivity, SensitivityAnalysis, analyse_sensitivity
from calibkit.evaluate.streaming import RangeAccumulator
from calibkit.evaluate.subsets import EvalSubset, stratified_subset
from calibkit.evaluate.taps import LayerMeasurement, RunnerFactory, measure_layers, ort_runner_factory
from calibkit.evaluate.tasks import (
    Fidelity,
    Task,
    TaskKind,
    TokenClassificationTask,
    WordGold,
    align_word_labels,
    choose_task,
    is_multi_label,
    is_regression,
    model_outputs,
)
from calibkit.evaluate.uncertainty import (
    Interval,
    PairedDifference,
    evidence_warnings,
    macro_f1_intervals,
    paired_difference,
    proportion,
)
from calibkit.graph import load_model, qdq_layout
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress
from calibkit.types import Backend, Method, MethodParams, Precision, check_seed

log = logging.getLogger("calibkit.evaluate.compare")

HISTOGRAM_BINS = 256


@dataclass(frozen=True)
class CompareOptions:
    batch_size: int = 32
    layers: bool = True
    layer_samples: int | None = 512  # eval examples streamed through the tapped models (None: all)
    sensitivity: bool = True
    sensitivity_samples: int = 256
    sensitivity_layers: int | None = None  # only the K layers with the worst own SQNR / zeroed weights
    workers: int | None = None
    executor: Any = field(default=None, compare=False, repr=False)  # calibkit.executors.Executor for sensitivity
    max_disagreements: int = 50
    histogram_layers: int = 6
    thresholds: Thresholds = field(default_factory=Thresholds)
    seed: int = 0  # draws the layer-statistics and sensitivity subsets (stratified by label)
    task: str | None = None  # --task: classification | embedding | token-classification (default: from outputs)
    budget: Any = None  # calibkit.data.encode.TokenBudget of the layer taps (None: the default memory budget)

    def __post_init__(self) -> None:
        check_seed(self.seed)


@dataclass(frozen=True, eq=False)
class EngineEvaluation:
    name: str  # "A" | "B" | "reference"
    artifact: EngineArtifact
    logits: np.ndarray  # the task's output per text: logits, pooled embeddings, token logits (padded)
    metrics: ClassificationMetrics | None  # None without labels, or for tasks other than classification
    latency: LatencyStats
    accuracy_ci: Interval | None = None
    macro_f1_ci: Interval | None = None
    outputs: Predicted | None = None  # with the real-token mask of sequence outputs


@dataclass(frozen=True)
class Disagreement:
    index: int
    text: str
    label: str
    pred_a: str
    pred_b: str
    confidence_a: float | None = None  # A's top-2 probability gap on this text (classification)


@dataclass(frozen=True)
class LayerReport:
    measurement: LayerMeasurement
    sensitivity: LayerSensitivity | None
    flag: LayerFlag
    weight: WeightError | None = None  # the node's INT8 weights against the reference's FP weights


@dataclass(frozen=True)
class TensorHistogram:
    tensor: str
    counts: tuple[int, ...]
    upper: float
    thresholds: dict[str, float | None]


@dataclass(frozen=True, eq=False)
class Comparison:
    eval_set: EvalSet
    labels: tuple[str, ...]
    engines: tuple[EngineEvaluation, ...]
    agreement: OutputAgreement
    output_error: OutputError  # B against A
    disagreements: tuple[Disagreement, ...]
    layers: tuple[LayerReport, ...]
    thresholds: Thresholds
    histograms: tuple[TensorHistogram, ...]
    sensitivity: SensitivityAnalysis | None = None
    layer_samples: int = 0
    # paired uncertainty of B against A on the same examples
    accuracy_diff: PairedDifference | None = None
    macro_f1_diff: Interval | None = None
    agreement_ci: Interval | None = None
    warnings: tuple[str, ...] = ()
    seed: int = 0
    rows: EvalSubset | None = None  # the eval set's rows used (--limit), as indices into the file
    layer_subset: EvalSubset | None = None
    sensitivity_subset: EvalSubset | None = None
    task: str = "classification"  # evaluate.tasks.TaskKind value
    task_output: str = ""
    fidelity: Fidelity | None = None  # B against A in the task's terms
    gold: dict[str, Any] | None = None  # token classification: each engine against the eval set's gold word tags
    flips_by_confidence: tuple[ConfidenceBucket, ...] = ()  # classification: flips per band of A's top-2 gap
    labels_scored: bool = False  # regression / multi-label: the engines were scored against the labels (fidelity)

    @property
    def keep_in_higher_precision(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.measurement.spec.node for r in self.layers
                                   if r.flag.flag in (Flag.KEEP_FP16, Flag.KEEP_FP32)))

    @property
    def recommended_precision(self) -> str:
        return "fp32" if any(r.flag.flag is Flag.KEEP_FP32 for r in self.layers) else "fp16"

    def to_dict(self) -> dict[str, Any]:
        """The calibkit-compare/1 document (keys are a contract with the report renderer)."""
        return {
            "format": FORMAT,
            "calibkit_version": __version__,
            "eval_set": {"path": str(self.eval_set.path), "count": len(self.eval_set), "labels": list(self.labels),
                         "rows": self.rows.to_dict() if self.rows else None},
            "engines": [_engine_dict(e) for e in self.engines],
            "agreement": self.agreement.agreement,
            "agreement_ci": self.agreement_ci.to_dict() if self.agreement_ci else None,
            "flip_rate": 1.0 - self.agreement.agreement if len(self.eval_set) else None,
            "difference": {
                "accuracy": self.accuracy_diff.to_dict() if self.accuracy_diff else None,
                "macro_f1": self.macro_f1_diff.to_dict() if self.macro_f1_diff else None,
            },
            "warnings": list(self.warnings),
            "seed": self.seed,
            "subsets": {
                "layers": self.layer_subset.to_dict() if self.layer_subset else None,
                "sensitivity": self.sensitivity_subset.to_dict() if self.sensitivity_subset else None,
            },
            "outputs": {
                "cosine_mean": self.agreement.cosine_mean,
                "cosine_min": self.agreement.cosine_min,
                "max_abs_error": self.agreement.max_abs_error,
                "mean_abs_error": self.agreement.mean_abs_error,
                "mean_kl": self.output_error.mean_kl,
                "logit_mse": self.output_error.logit_mse,
            },
            "disagreements": [
                {"index": d.index, "text": d.text, "label": d.label, "pred_a": d.pred_a, "pred_b": d.pred_b,
                 "confidence_a": d.confidence_a}
                for d in self.disagreements
            ],
            "flips_by_confidence": [b.to_dict() for b in self.flips_by_confidence],
            "layers": [_layer_dict(r) for r in self.layers],
            "layer_samples": self.layer_samples,
            "sensitivity_samples": self.sensitivity.samples if self.sensitivity else 0,
            "thresholds": self.thresholds.to_dict(),
            "recommendation": {
                "keep_in_higher_precision": list(self.keep_in_higher_precision),
                "precision": self.recommended_precision,
            },
            "histograms": {
                h.tensor: {"counts": list(h.counts), "upper": h.upper, "thresholds": dict(h.thresholds)}
                for h in self.histograms
            },
            "task": {"kind": self.task, "output": self.task_output,
                     "labelled": bool(self.engines and self.engines[0].metrics is not None) or self.gold is not None
                     or self.labels_scored,
                     "fidelity": self.fidelity.to_dict() if self.fidelity else None, "gold": self.gold},
        }


def _engine_dict(e: EngineEvaluation) -> dict[str, Any]:
    return {
        "name": e.name,
        "path": str(e.artifact.path),
        "precision": e.artifact.precision.value,
        "backend": e.artifact.backend.value,
        "accuracy": e.metrics.accuracy if e.metrics else None,
        "accuracy_ci": e.accuracy_ci.to_dict() if e.accuracy_ci else None,
        "macro_f1": e.metrics.macro_f1 if e.metrics else None,
        "macro_f1_ci": e.macro_f1_ci.to_dict() if e.macro_f1_ci else None,
        "confusion_matrix": [list(r) for r in e.metrics.confusion_matrix] if e.metrics else None,
        "labels": list(e.metrics.labels) if e.metrics else [],
        "latency_ms": {"mean": e.latency.mean_ms, "p50": e.latency.p50_ms, "p95": e.latency.p95_ms},
        "throughput_per_s": e.latency.throughput_per_s,
        "batch_size": e.latency.batch_size,
    }


def _sens_dict(accuracy: float, delta: float, logit_mse: float, mean_kl: float, flip_rate: float = float("nan"),
               diff: PairedDifference | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {"accuracy": accuracy, "delta": delta, "logit_mse": logit_mse, "mean_kl": mean_kl,
                         "flip_rate": flip_rate}
    if diff is not None:
        d.update(delta_low=diff.interval.low, delta_high=diff.interval.high, significant=diff.significant,
                 examples_to_settle=None if diff.significant else diff.examples_to_settle())
    return d


def _layer_dict(r: LayerReport) -> dict[str, Any]:
    m, s = r.measurement, r.measurement.spec
    sens = None
    if r.sensitivity is not None:
        ls = r.sensitivity
        sens = {
            "only_this_int8": _sens_dict(ls.only_this.accuracy, ls.only_this_delta, ls.only_this.logit_mse,
                                         ls.only_this.mean_kl, ls.only_this.flip_rate, ls.only_this_diff),
            "all_but_this": _sens_dict(ls.all_but_this.accuracy, ls.all_but_this_delta, ls.all_but_this.logit_mse,
                                       ls.all_but_this.mean_kl, ls.all_but_this.flip_rate, ls.all_but_this_diff),
            "flips_removed": ls.flips_removed.to_dict() if ls.flips_removed else None,
        }
    return {
        "index": s.index,
        "node": s.node,
        "module": s.module,
        "op_type": s.op_type,
        "tensor": s.tensor,
        "output": s.output,
        "amax": s.amax,
        "fp_min": m.fp_min,
        "fp_max": m.fp_max,
        "fp_absmax": m.fp_absmax,
        "p99": m.p99,
        "p9999": m.p9999,
        "clipped_fraction": m.clipped_fraction,
        "outlier_ratio": m.outlier_ratio,
        "nonfinite": m.nonfinite,
        "sqnr_db": m.sqnr_db,
        "quant_sqnr_db": m.quant_sqnr_db,
        "weight_sqnr_db": r.weight.sqnr_db if r.weight else None,
        "weight_zeroed_fraction": r.weight.zeroed_fraction if r.weight else None,
        "cosine": m.cosine,
        "sensitivity": sens,
        "flag": r.flag.flag.value,
        "reasons": list(r.flag.reasons),
    }


# ------------------------------------------------------------------------------------------ evaluation


def _config(tokenizer_dir: str | Path | None) -> Mapping[str, Any]:
    """The model folder's config.json ({} when there is none; read once per file version)."""
    from calibkit.data.modeldir import read_config

    return read_config(tokenizer_dir)


def read_id2label(tokenizer_dir: str | Path | None) -> dict[int, str]:
    return _id2label(_config(tokenizer_dir))


def _id2label(cfg: Mapping[str, Any]) -> dict[int, str]:
    from calibkit.data.modeldir import parse_id2label

    return parse_id2label(cfg.get("id2label"), "config.json")


def evaluate_runner(
    runner: BaseRunner,
    tokenizer: TextTokenizer,
    texts: Sequence[str],
    *,
    batch_size: int,
    progress: ProgressCallback | None = None,
    task: str = "inference",
    output_name: str | None = None,
) -> tuple[np.ndarray, LatencyStats]:
    """Logits in input order and per-batch latency. ``runner`` must be active; one warm-up batch first."""
    cb = progress or no_progress
    predict_logits(runner, tokenizer, list(texts[: min(len(texts), batch_size)]), batch_size=batch_size,
                   output_name=output_name)
    seconds: list[float] = []

    def timed(ev: ProgressEvent) -> None:
        if ev.done > 0:  # each step after the first event follows exactly one infer() call
            seconds.append(runner.last_inference_seconds)
        cb(ev)

    logits = predict_logits(runner, tokenizer, texts, batch_size=batch_size, progress=timed, task=task,
                            output_name=output_name)
    return logits, latency_stats(seconds, len(texts), batch_size)


def select_task(artifact: EngineArtifact, tokenizer_dir: str | Path | None, kind: str | None = None) -> Task:
    """The evaluate.tasks Task for the engines' model: from its ONNX outputs and config.json (``kind`` forces)."""
    cfg = _config(tokenizer_dir)
    src = artifact.path if artifact.backend is Backend.ONNXRUNTIME else artifact.source_model
    if src and Path(src).is_file():
        outputs = model_outputs(load_model(src, load_external_data=False))
    else:
        outputs = {"logits": 2}  # a TensorRT engine without its source model: classification as before
    try:
        return choose_task(outputs, cfg, kind)
    except ValueError:
        raise UsageError(f"unknown --task {kind!r}",
                         hint="choose classification, embedding, token-classification, regression or "
                              "multi-label") from None


def _evaluate_task(runner: BaseRunner, tokenizer: TextTokenizer, texts: Sequence[str], task: Task, *,
                   batch_size: int, progress: ProgressCallback | None, name: str) -> tuple[Predicted, LatencyStats]:
    """Like :func:`evaluate_runner`, through the task (pooling, sequence outputs with their mask)."""
    cb = progress or no_progress
    task.predict(runner, tokenizer, list(texts[: min(len(texts), batch_size)]), batch_size=batch_size)
    seconds: list[float] = []

    def timed(ev: ProgressEvent) -> None:
        if ev.done > 0:
            seconds.append(runner.last_inference_seconds)
        cb(ev)

    out = task.predict(runner, tokenizer, texts, batch_size=batch_size, progress=timed, task=name)
    return out, latency_stats(seconds, len(texts), batch_size)


def _compare_fidelity(
    task: Task,
    a: EngineArtifact,
    b: EngineArtifact,
    eval_set: EvalSet,
    *,
    reference: EngineArtifact | None,
    options: CompareOptions,
    open_runner: Any,
    factory: RunnerFactory,
    tokenizer: TextTokenizer,
    progress: ProgressCallback | None,
    rows: EvalSubset | None,
) -> Comparison:
    """compare without labels, or for embeddings and token classifiers: fidelity of B to A in the task's terms
    (agreement, cosine, retrieval, entity F1) and the per-layer measurements, which need no labels. Accuracy,
    its intervals and the per-layer accuracy sensitivity are left out (they need labels)."""
    engines = [a, b] + ([reference] if reference is not None else [])
    texts = list(eval_set.texts)
    # gold word tags (NER sets) score token classifiers; aligned before any inference, so bad tags fail fast
    scored = task if isinstance(task, TokenClassificationTask) and eval_set.has_word_labels else None
    word_gold = align_word_labels(tokenizer, eval_set, task.labels) if scored and task.labels else None
    evals: list[EngineEvaluation] = []
    for name, art in zip(["A", "B", "reference"], engines):
        with open_runner(art) as runner:
            out, lat = _evaluate_task(runner, tokenizer, texts, task, batch_size=options.batch_size,
                                      progress=progress, name=f"evaluate {name} ({art.path.name})")
        evals.append(EngineEvaluation(name, art, out.values, None, lat, outputs=out))
    ea, eb = evals[0], evals[1]
    assert ea.outputs is not None and eb.outputs is not None  # set just above
    fid = task.fidelity(ea.outputs, eb.outputs)
    scored_scores = task.kind in (TaskKind.REGRESSION, TaskKind.MULTI_LABEL) and eval_set.has_labels
    if scored_scores:  # each engine against the gold scores or label sets
        from dataclasses import replace

        against = (_score_errors(eval_set, ea.logits, eb.logits) if task.kind is TaskKind.REGRESSION else
                   _label_set_scores(eval_set, dict(enumerate(task.labels)), ea.logits, eb.logits))
        fid = replace(fid, extra={**fid.extra, **against})
    gold = _gold_metrics(scored, tokenizer, eval_set, evals, word_gold) if scored else None
    va, vb = ea.logits, eb.logits
    if ea.outputs.mask is not None:  # token outputs: real tokens only
        va, vb = va[ea.outputs.mask], vb[ea.outputs.mask]
    err = np.abs(va.astype(np.float64) - vb) if va.size else np.zeros(1)
    agreement = OutputAgreement(fid.agreement, fid.cosine_mean, fid.cosine_min, float(err.max()), float(err.mean()))
    if task.kind in (TaskKind.EMBEDDING, TaskKind.REGRESSION):  # no class distribution: only the squared error
        out_err = OutputError(mean_kl=float("nan"), logit_mse=float(np.mean(err**2)))
    else:
        out_err = output_error(va.reshape(-1, va.shape[-1]), vb.reshape(-1, vb.shape[-1])) if va.size else \
            OutputError(0.0, 0.0)
    labels: tuple[str, ...] = tuple(task.labels)
    disagreements: tuple[Disagreement, ...] = ()
    strata: list[str] = [""] * len(texts)
    pa = task.predictions(ea.outputs)
    pb = task.predictions(eb.outputs)
    if pa is not None and pb is not None:
        names = labels or tuple(str(i) for i in range(int(va.shape[-1]) if va.ndim else 0))
        file_row = (lambda i: rows.indices[i]) if rows is not None else (lambda i: i)
        gap = top2_gap(va) if task.kind is TaskKind.CLASSIFICATION else None
        disagreements = tuple(
            Disagreement(int(file_row(int(i))), texts[i], "", names[int(pa[i])], names[int(pb[i])],
                         float(gap[i]) if gap is not None else None)
            for i in np.flatnonzero(pa != pb)[: options.max_disagreements]
        )
        strata = [str(int(v)) for v in pa]  # layer subsets stratified by A's prediction
    if gold is not None or scored_scores:
        warnings = []
    elif eval_set.has_word_labels:
        warnings = [f"the eval set's word tags are used for token-classification models, not {task.kind.value}: "
                    "fidelity to A is reported, accuracy is not"]
    elif not eval_set.has_labels:
        warnings = ["the eval set has no labels: fidelity to A is reported, accuracy is not"]
    else:
        warnings = [f"labels are not used for {task.kind.value} models yet: fidelity to A is reported, accuracy is "
                    "not"]
    if options.sensitivity and options.layers:
        warnings.append("per-layer sensitivity (accuracy of one-layer variants) needs a labelled classification "
                        "eval set: skipped")
    layer_reports: list[LayerReport] = []
    histograms: list[TensorHistogram] = []
    layer_subset: EvalSubset | None = None
    if options.layers:
        lr = _layer_run(a, b, reference, texts, strata, options, factory, tokenizer, progress)
        measured, wsqnr, layer_subset = lr.measured, lr.wsqnr, lr.subset
        for m in measured.layers:
            ws = wsqnr.get(m.spec.node)
            flag = flag_layer(
                options.thresholds, sqnr_db=m.sqnr_db, clipped_fraction=m.clipped_fraction,
                outlier_ratio=m.outlier_ratio, nonfinite=m.nonfinite, fp_absmax=m.fp_absmax,
                quant_sqnr_db=m.quant_sqnr_db, weight_sqnr_db=ws.sqnr_db if ws else None,
                zeroed_weights=ws.zeroed_fraction if ws else None,
            )
            layer_reports.append(LayerReport(m, None, flag, ws))
        histograms = _histograms(measured.layers, measured.ranges, options.histogram_layers)
    for w in warnings:  # returned with the result, whose caller shows them (the CLI as "warning:")
        log.info("%s", w)
    return Comparison(
        eval_set=eval_set, labels=labels, engines=tuple(evals), agreement=agreement, output_error=out_err,
        disagreements=disagreements, layers=tuple(layer_reports), thresholds=options.thresholds,
        histograms=tuple(histograms), sensitivity=None, layer_samples=len(layer_subset) if layer_subset else 0,
        agreement_ci=proportion(pa == pb) if pa is not None and pb is not None else None,
        warnings=tuple(warnings), seed=options.seed, rows=rows, layer_subset=layer_subset,
        task=task.kind.value, task_output=task.output_name, fidelity=fid, gold=gold,
        flips_by_confidence=flips_by_confidence(va, vb) if task.kind is TaskKind.CLASSIFICATION and va.size else (),
        labels_scored=scored_scores,
    )


def _score_errors(eval_set: EvalSet, a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Mean absolute and root-mean-square error of A's and B's first score against numeric gold labels."""
    y = numeric_labels(eval_set)
    out = {}
    for name, x in (("A", a), ("B", b)):
        err = np.asarray(x, dtype=np.float64).reshape(len(y), -1)[:, 0] - y
        out[f"{name}_mae_vs_labels"] = float(np.abs(err).mean())
        out[f"{name}_rmse_vs_labels"] = float(np.sqrt((err ** 2).mean()))
    return out


def expects_label_sets(tokenizer_dir: str | Path | None) -> bool:
    """Whether the engines' model is multi-label, so a list in the eval set's label column is a set of labels."""
    return is_multi_label(_config(tokenizer_dir))


def multi_hot(eval_set: EvalSet, id2label: Mapping[int, str]) -> np.ndarray:
    """[examples, labels] bool from label sets (names or ids, joined by SET_SEPARATOR); unknown names refused."""
    from calibkit.data.evalset import SET_SEPARATOR, describe_labels

    by_name = {v: k for k, v in id2label.items()} | {str(k): k for k in id2label}
    y = np.zeros((len(eval_set), len(id2label)), dtype=bool)
    for i, lab in enumerate(eval_set.labels):
        for name in filter(None, lab.split(SET_SEPARATOR)):
            if name not in by_name:
                raise DataError(f"eval set {eval_set.path.name}: example {i + 1} has the label {name!r}, which the "
                                "model does not know",
                                hint=f"the model's labels (config.json id2label) are: {describe_labels(id2label)}")
            y[i, by_name[name]] = True
    return y


def _label_set_scores(eval_set: EvalSet, id2label: Mapping[int, str], a: np.ndarray, b: np.ndarray
                      ) -> dict[str, float]:
    """Each engine's decisions (logit > 0) against the gold label sets: exact-set accuracy, micro and macro F1."""
    y = multi_hot(eval_set, id2label)
    out = {}
    for name, x in (("A", a), ("B", b)):
        d = np.asarray(x) > 0
        tp, fp, fn = (d & y).sum(0), (d & ~y).sum(0), (~d & y).sum(0)
        per_label = np.where(2 * tp + fp + fn > 0, 2 * tp / np.maximum(2 * tp + fp + fn, 1), 1.0)
        out[f"{name}_exact_set_accuracy"] = float((d == y).all(axis=1).mean())
        total = 2 * tp.sum() + fp.sum() + fn.sum()
        out[f"{name}_micro_f1"] = float(2 * tp.sum() / total) if total else 1.0
        out[f"{name}_macro_f1"] = float(per_label.mean())
    return out


def numeric_labels(eval_set: EvalSet) -> np.ndarray:
    """The labels as target scores; a label that is not a finite number is refused, naming the example."""
    y = np.empty(len(eval_set), dtype=np.float64)
    for i, lab in enumerate(eval_set.labels):
        try:
            y[i] = float(lab)
        except ValueError:
            raise DataError(f"eval set {eval_set.path.name}: example {i + 1}'s label {lab!r} is not a number",
                            hint="a regression model's labels are its target scores") from None
    bad = np.flatnonzero(~np.isfinite(y))
    if len(bad):
        raise DataError(f"eval set {eval_set.path.name}: example {bad[0] + 1}'s label is not a finite number",
                        hint="a regression model's labels are its target scores")
    return y


def _gold_metrics(task: TokenClassificationTask, tokenizer: TextTokenizer, eval_set: EvalSet,
                  evals: Sequence[EngineEvaluation], word_gold: WordGold | None) -> dict[str, Any]:
    """Each engine against the eval set's gold word tags (evaluate.tasks.TokenClassificationTask.gold_metrics)."""
    if word_gold is None:  # no id2label: the model's label ids name its labels
        n = int(evals[0].logits.shape[-1]) if evals[0].logits.ndim == 3 else 0
        word_gold = align_word_labels(tokenizer, eval_set, tuple(str(i) for i in range(n)))
    per = {e.name: task.gold_metrics(e.outputs, word_gold) for e in evals if e.outputs is not None}
    first = next(iter(per.values()))
    return {"engines": {k: v.to_dict() for k, v in per.items()}, "words": first.words,
            "unscored_words": first.unscored_words, "entities": first.gold_entities,
            "convention": "one BIO tag per word; a word's prediction is its first token's"}


def origin_sha256(e: EngineArtifact) -> str:
    """The model an engine's FP32 function comes from: a smoothed model's original (calibkit smooth keeps the
    function), else its own source."""
    return str(e.extra.get("smoothed_from_sha256") or e.source_model_sha256)


def check_same_model(engines: Sequence[EngineArtifact]) -> None:
    shas = {origin_sha256(e) for e in engines}
    if len(shas) > 1:
        listed = "; ".join(f"{e.path.name}: {origin_sha256(e)[:12]}" for e in engines)
        raise UsageError(
            f"the engines were built from different models ({listed})",
            hint="compare engines built from the same FP32 model (see source_model_sha256 in their .calibkit.json)",
        )


def _is_int8(a: EngineArtifact) -> bool:
    return a.precision is Precision.INT8


def _onnx_of(a: EngineArtifact) -> onnx.ModelProto | None:
    if a.backend is Backend.ONNXRUNTIME:
        return load_model(a.path)
    log.warning("%s is a TensorRT engine: per-layer analysis needs ONNX models, skipped for it", a.path.name)
    return None


def compare_engines(
    a: EngineArtifact,
    b: EngineArtifact,
    eval_set: EvalSet,
    *,
    reference: EngineArtifact | None = None,
    options: CompareOptions = CompareOptions(),
    open_runner: Any = None,
    runner_factory: RunnerFactory | None = None,
    progress: ProgressCallback | None = None,
    rows: EvalSubset | None = None,
) -> Comparison:
    """Everything ``calibkit compare`` reports. ``open_runner(artifact) -> BaseRunner`` defaults to the engine
    registry; ``runner_factory(model_bytes, outputs)`` builds runners for tapped ONNX copies (default ORT).
    ``rows``: where ``eval_set`` is a subset of a file (``--limit``), which rows of the file it holds."""
    if open_runner is None:
        from calibkit.engines.registry import open_runner as _open

        open_runner = _open
    factory = runner_factory or ort_runner_factory()
    if options.batch_size <= 0:
        raise UsageError(f"--batch-size must be positive, got {options.batch_size}")
    engines = [a, b] + ([reference] if reference is not None else [])
    check_same_model(engines)
    # inputs agree by content before any work: one tokenizer and label map; the source models and tables
    # that per-layer ranges and sensitivity rebuild from are the ones the engines were built from
    check_engines(dict(zip(["A", "B", "reference"], engines)), sources=options.layers or options.sensitivity)
    tok_dir = next((e.tokenizer for e in engines if e.tokenizer), None)
    if tok_dir is None:
        raise ModelError(
            "none of the engines' sidecars names a tokenizer folder",
            hint="rebuild the engines with `calibkit build`, which records the tokenizer in the sidecar",
        )
    tokenizer = TextTokenizer(tok_dir)
    id2label = read_id2label(tok_dir)
    task = select_task(a, tok_dir, options.task)
    if task.kind is not TaskKind.CLASSIFICATION or not eval_set.has_labels:
        return _compare_fidelity(task, a, b, eval_set, reference=reference, options=options,
                                 open_runner=open_runner, factory=factory, tokenizer=tokenizer, progress=progress,
                                 rows=rows)
    texts = list(eval_set.texts)
    y_true: np.ndarray | None = label_ids(eval_set, id2label, len(id2label)) if id2label else None

    evals: list[EngineEvaluation] = []
    labels: tuple[str, ...] = ()
    for name, art in zip(["A", "B", "reference"], engines):
        with open_runner(art) as runner:
            logits, lat = evaluate_runner(runner, tokenizer, texts, batch_size=options.batch_size,
                                          progress=progress, task=f"evaluate {name} ({art.path.name})",
                                          output_name=task.output_name)
        if not labels:
            n_cls = int(logits.shape[1]) if logits.ndim == 2 else 0
            if id2label and n_cls != len(id2label):
                raise ModelError(f"{art.path.name} returns {n_cls} logits but config.json names {len(id2label)} labels")
            labels = tuple(id2label.get(i, str(i)) for i in range(n_cls))
            if y_true is None:
                y_true = label_ids(eval_set, {}, n_cls)
        metrics = classification_metrics(y_true, logits.argmax(axis=1), labels)
        evals.append(EngineEvaluation(name, art, logits, metrics, lat))
    if y_true is None:  # only when there were no engines, which the signature rules out
        raise UsageError("no engine was evaluated")
    evals = _with_intervals(evals, y_true, len(labels), options.seed)
    ea, eb = evals[0], evals[1]
    agreement = output_agreement(ea.logits, eb.logits)
    pa, pb = ea.logits.argmax(axis=1), eb.logits.argmax(axis=1)
    accuracy_diff = paired_difference(pa == y_true, pb == y_true, seed=options.seed)
    f1_diff = macro_f1_intervals(y_true, pa, pb, len(labels), seed=options.seed)[2] if len(y_true) else None
    warnings = evidence_warnings(y_true, labels)
    for w in warnings:  # returned with the result, whose caller shows them (the CLI as "warning:")
        log.info("%s", w)
    file_row = (lambda i: rows.indices[i]) if rows is not None else (lambda i: i)
    gap = top2_gap(ea.logits)
    disagreements = tuple(
        Disagreement(int(file_row(int(i))), texts[i], labels[int(y_true[i])], labels[int(pa[i])], labels[int(pb[i])],
                     float(gap[i]))
        for i in np.flatnonzero(pa != pb)[: options.max_disagreements]
    )
    str_labels = [str(int(v)) for v in y_true]
    layer_subset: EvalSubset | None = None
    sens_subset: EvalSubset | None = None

    layer_reports: list[LayerReport] = []
    histograms: list[TensorHistogram] = []
    sens: SensitivityAnalysis | None = None
    n_layer = 0
    if options.layers:
        lr = _layer_run(a, b, reference, texts, str_labels, options, factory, tokenizer, progress)
        measured, wsqnr, layer_subset = lr.measured, lr.wsqnr, lr.subset
        int8_art, int8_model = lr.int8_art, lr.int8_model
        n_layer = len(layer_subset)
        if options.sensitivity and int8_art is not None and int8_model is not None and texts:
            sens_specs = worst_layers(measured.layers, wsqnr, options.sensitivity_layers)
            sens_subset = stratified_subset(texts, str_labels, options.sensitivity_samples, options.seed)
            sens = _sensitivity(int8_art, int8_model, sens_specs, evals, eval_set, y_true, tok_dir, options,
                                progress, sens_subset, output_name=task.output_name)
        by_node = {ls.node: ls for ls in sens.layers} if sens else {}
        for m in measured.layers:
            ls = by_node.get(m.spec.node)
            ws = wsqnr.get(m.spec.node)
            flag = flag_layer(
                options.thresholds,
                sqnr_db=m.sqnr_db,
                clipped_fraction=m.clipped_fraction,
                outlier_ratio=m.outlier_ratio,
                nonfinite=m.nonfinite,
                fp_absmax=m.fp_absmax,
                quant_sqnr_db=m.quant_sqnr_db,
                weight_sqnr_db=ws.sqnr_db if ws else None,
                zeroed_weights=ws.zeroed_fraction if ws else None,
                only_this_delta=ls.only_this_delta if ls and not ls.only_this.error else None,
                all_but_this_delta=ls.all_but_this_delta if ls and not ls.all_but_this.error else None,
                only_this_diff=ls.only_this_diff if ls else None,
                all_but_this_diff=ls.all_but_this_diff if ls else None,
                flips_removed=ls.flips_removed if ls else None,
            )
            flag = gate_on_overall(flag, accuracy_diff)
            layer_reports.append(LayerReport(m, ls, flag, ws))
        histograms = _histograms(measured.layers, measured.ranges, options.histogram_layers)
    return Comparison(
        eval_set=eval_set,
        labels=labels,
        engines=tuple(evals),
        agreement=agreement,
        output_error=output_error(ea.logits, eb.logits),
        disagreements=disagreements,
        layers=tuple(layer_reports),
        thresholds=options.thresholds,
        histograms=tuple(histograms),
        sensitivity=sens,
        layer_samples=n_layer,
        accuracy_diff=accuracy_diff,
        macro_f1_diff=f1_diff,
        agreement_ci=proportion(pa == pb),
        warnings=warnings,
        seed=options.seed,
        rows=rows,
        layer_subset=layer_subset,
        sensitivity_subset=sens_subset,
        task=task.kind.value,
        task_output=task.output_name,
        fidelity=task.fidelity(Predicted(ea.logits), Predicted(eb.logits)),
        flips_by_confidence=flips_by_confidence(ea.logits, eb.logits),
    )


def _with_intervals(evals: Sequence[EngineEvaluation], y_true: np.ndarray, n_classes: int, seed: int
                    ) -> list[EngineEvaluation]:
    from dataclasses import replace

    out = []
    for e in evals:
        pred = e.logits.argmax(axis=1)
        f1 = macro_f1_intervals(y_true, pred, pred, n_classes, seed=seed)[0] if len(y_true) else None
        out.append(replace(e, accuracy_ci=proportion(pred == y_true), macro_f1_ci=f1))
    return out


@dataclass(frozen=True, eq=False)
class _LayerRun:
    int8_art: EngineArtifact | None  # the INT8 side, if either is
    int8_model: onnx.ModelProto | None
    measured: Any  # calibkit.evaluate.taps.LayerMeasurements
    wsqnr: dict[str, Any]  # node -> weight error
    subset: EvalSubset


def _layer_run(a: EngineArtifact, b: EngineArtifact, reference: EngineArtifact | None, texts: Sequence[str],
               strata: Sequence[str], options: CompareOptions, factory: RunnerFactory, tokenizer: TextTokenizer,
               progress: ProgressCallback | None) -> _LayerRun:
    """Per-layer measurements of the quantized layers on a stratified subset (``strata``: labels, or A's
    predictions without labels), and the weight errors of the INT8 side."""
    int8_art = b if _is_int8(b) else (a if _is_int8(a) else None)
    model_a, model_b = _onnx_of(a), _onnx_of(b)
    int8_model = model_b if int8_art is b else (model_a if int8_art is a else None)
    layer_source = int8_model if int8_model is not None else model_a
    specs = find_layers(layer_source) if layer_source is not None else ()
    ref_model = _reference_model(a, b, reference, model_a, model_b, int8_art)
    subset = stratified_subset(texts, list(strata), options.layer_samples, options.seed)
    measured = measure_layers(
        specs, subset.take(texts), tokenizer, reference=ref_model, baseline=model_a, candidate=model_b,
        runner_factory=factory, batch_size=options.batch_size, progress=progress, budget=options.budget,
    )
    wsqnr = weight_errors(int8_model, ref_model) if int8_model is not None and ref_model is not None else {}
    return _LayerRun(int8_art, int8_model, measured, wsqnr, subset)


def _reference_model(
    a: EngineArtifact,
    b: EngineArtifact,
    reference: EngineArtifact | None,
    model_a: onnx.ModelProto | None,
    model_b: onnx.ModelProto | None,
    int8_art: EngineArtifact | None,
) -> onnx.ModelProto | None:
    """The higher-precision model whose tensors give the FP ranges (same object as model_a when it is A).
    For an INT8 model built from a smoothed model, that smoothed FP32 model: its tensors are what INT8
    quantizes (X/s), and its layer outputs are the original's."""
    src = int8_art.source_model if int8_art else None
    if int8_art is not None and int8_art.extra.get("smoothed_from_sha256") and src and Path(src).is_file():
        return load_model(src)
    if reference is not None:
        return _onnx_of(reference)
    if not _is_int8(a) and model_a is not None:
        return model_a
    if not _is_int8(b) and model_b is not None:
        return model_b
    if src and Path(src).is_file():
        return load_model(src)
    log.warning("no higher-precision model to measure FP ranges on (pass --reference FP32.onnx)")
    return None


def worst_layers(measured: Sequence[Any], wsqnr: dict[str, Any], k: int | None) -> list[LayerSpec]:
    """The specs of the ``k`` nodes most likely to hurt: lowest own SQNR of input or weights, or most
    zeroed weights first (all nodes when ``k`` is None)."""
    def badness(m: Any) -> float:
        own = m.quant_sqnr_db if m.quant_sqnr_db is not None else float("inf")
        ws = wsqnr.get(m.spec.node)
        w = ws.sqnr_db if ws is not None and ws.sqnr_db is not None else float("inf")
        zeroed = ws.zeroed_fraction if ws is not None and ws.zeroed_fraction is not None else 0.0
        return min(own, w) - 100.0 * zeroed

    ordered = sorted(measured, key=badness)
    chosen: dict[str, LayerSpec] = {}
    for m in ordered:
        if k is not None and len(chosen) >= k:
            break
        chosen.setdefault(m.spec.node, m.spec)
    return list(chosen.values())


def _sensitivity(
    int8_art: EngineArtifact,
    int8_model: onnx.ModelProto,
    specs: Sequence[LayerSpec],
    evals: Sequence[EngineEvaluation],
    eval_set: EvalSet,
    y_true: np.ndarray,
    tok_dir: str,
    options: CompareOptions,
    progress: ProgressCallback | None,
    subset: EvalSubset,
    output_name: str | None = None,
) -> SensitivityAnalysis | None:
    src, cal = int8_art.source_model, int8_art.calibration_json
    if not (src and cal and Path(src).is_file() and Path(cal).is_file()):
        log.warning(
            "sensitivity skipped: %s's sidecar does not name an existing source_model and calibration_json",
            int8_art.path.name,
        )
        return None
    # reference logits: the --reference engine when given, else the higher-precision one of A and B
    ordered = sorted(evals, key=lambda e: e.name != "reference")
    fp = next((e for e in ordered if e.artifact.precision is not Precision.INT8), None)
    if fp is None:
        log.warning("sensitivity skipped: no higher-precision engine gives reference logits (pass --reference)")
        return None
    if not len(subset):
        return None
    nodes = [s.node for s in specs]
    idx = subset.array
    return analyse_sensitivity(
        nodes,
        source_model=src,
        calibration_json=cal,
        tokenizer=tok_dir,
        texts=subset.take(eval_set.texts),
        labels=[int(v) for v in y_true[idx]],
        reference_logits=fp.logits[idx],
        base_keep=int8_art.kept_higher_precision,
        target=qdq_layout(int8_model) or "tensorrt",
        batch_size=options.batch_size,
        workers=options.workers,
        progress=progress,
        executor=options.executor,
        output_name=output_name,
        source_model_sha256=int8_art.source_model_sha256,
        calibration_sha256=int8_art.calibration_sha256,
    )


def _histograms(
    layers: Sequence[LayerMeasurement], ranges: dict[str, RangeAccumulator], count: int
) -> list[TensorHistogram]:
    """|x| histograms of the ``count`` worst layers' input tensors (lowest own SQNR, then highest outlier ratio)."""

    def badness(m: LayerMeasurement) -> tuple[float, float]:
        own = m.quant_sqnr_db if m.quant_sqnr_db is not None else m.sqnr_db
        return (own if own is not None else math.inf, -(m.outlier_ratio or 0.0))

    chosen: dict[str, LayerMeasurement] = {}
    for m in sorted(layers, key=badness):
        acc = ranges.get(m.spec.tensor)
        if acc is None or not acc.count or m.spec.tensor in chosen:
            continue
        chosen[m.spec.tensor] = m
        if len(chosen) >= count:
            break
    from calibkit.calibrate.methods import compute_amax

    out = []
    for tensor, m in chosen.items():
        acc = ranges[tensor]
        stats = acc.coarse_stats(MethodParams().num_bins)
        thresholds: dict[str, float | None] = {}
        for method in Method:
            try:
                thresholds[method.value] = float(compute_amax(stats, method, MethodParams()))
            except Exception as exc:  # a method failing must not lose the whole comparison
                log.warning("method %s failed on %s: %s", method.value, tensor, exc)
                thresholds[method.value] = None
        thresholds["amax"] = m.spec.amax
        counts = stats.histogram.counts.reshape(HISTOGRAM_BINS, -1).sum(axis=1)
        out.append(TensorHistogram(tensor, tuple(int(c) for c in counts), float(stats.histogram.upper), thresholds))
    return out


def ensure_known_labels(eval_set: EvalSet, tokenizer_dir: str | None) -> None:
    """Fail fast (before any inference) when the eval set's labels are not the model's (a score head's labels
    are numbers, not classes: not checked)."""
    if not eval_set.has_labels:
        return
    cfg = _config(tokenizer_dir)
    id2label = _id2label(cfg)
    if is_regression(cfg):
        numeric_labels(eval_set)
    elif is_multi_label(cfg):
        multi_hot(eval_set, id2label)
    elif id2label:
        label_ids(eval_set, id2label, len(id2label))
