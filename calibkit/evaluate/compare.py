"""Compare two engines (and optionally a reference) on an eval set, layer by layer — one pipeline for every task.

Flow: the task's gold labels (validated before any inference) -> evaluate each engine untapped through the
task (outputs, latency) -> the task scores them (accuracy, F1, label errors, gold tags) and B's fidelity to A
-> read the INT8 model's Q/DQ clipping ranges -> stream a stratified subset through tapped copies (FP ranges,
SQNR, cosine) -> per-layer sensitivity in a process pool where the labels are classes -> flags
(``evaluate.decisions``) and a recommendation. The result is the typed :class:`results.runs.Comparison`;
``results.codec`` alone turns it into the calibkit-compare/1 document.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from calibkit._version import __version__
from calibkit.consistency import check_engines
from calibkit.cpus import usable_cpus
from calibkit.data.evalset import EvalSet
from calibkit.data.tokenizer import TextTokenizer
from calibkit.enginefiles.artifact import EngineArtifact
from calibkit.enginefiles.registry import is_onnx_engine
from calibkit.engines.base import BaseRunner
from calibkit.errors import CalibkitError, ModelError, UsageError
from calibkit.evaluate.decisions import cost_settles, fidelity_basis, gate, layer_verdicts, recommend
from calibkit.evaluate.estimate import (
    announce,
    compare_size,
    estimate_compare,
    finish,
    padded_tokens,
    token_counts,
)
from calibkit.evaluate.findings import FlaggedInput, group_flags
from calibkit.evaluate.inputs import artifact, engine_calibration_set, load_evidence, load_traffic, not_an_input
from calibkit.evaluate.jobs import load_calibration_table
from calibkit.evaluate.layers import LayerSpec, find_layers, weight_errors
from calibkit.evaluate.metrics import LatencyStats, flips_by_confidence, latency_stats, output_error, top2_gap
from calibkit.evaluate.phases import PhaseClock
from calibkit.evaluate.predict import Predicted
from calibkit.evaluate.sensitivity import SensitivityAnalysis, analyse_sensitivity
from calibkit.evaluate.streaming import RangeAccumulator
from calibkit.evaluate.taps import (
    LayerMeasurement,
    LayerMeasurements,
    RunnerFactory,
    measure_layers,
    ort_runner_factory,
)
from calibkit.evaluate.traffic import TrafficEvidence, evidence_of
from calibkit.evidence.intervals import proportion
from calibkit.evidence.subsets import EvalSubset, stratified_subset
from calibkit.graph import load_external_weights, load_model, qdq_layout
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress
from calibkit.quantize.rangecheck import tensor_families
from calibkit.requests.compare import CompareRequest
from calibkit.requests.traffic import Traffic
from calibkit.resources import Resources
from calibkit.results.flags import Flag, LayerFlag, Thresholds
from calibkit.results.runs import (
    Comparison,
    ConfidenceBand,
    Difference,
    Differences,
    Disagreement,
    EngineEvaluation,
    Evidence,
    Fidelity,
    FindingResult,
    Latency,
    LayerVerdict,
    OutputStats,
    PerTextOutputs,
    Range,
    RowSelection,
    SensitivityEvidence,
    Speed,
    Subsets,
    TaskResult,
    TensorHistogram,
    TimeEstimate,
    TrafficFidelity,
    finite,
)
from calibkit.tasks import (
    EngineScore,
    Task,
    TaskScore,
    check_label_count,
    choose_task,
    kind_names,
    model_outputs,
    per_text_kinds,
    unscored_warnings,
)
from calibkit.types import Backend, Method, MethodParams, Precision

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.data.encode import TokenBudget

log = logging.getLogger("calibkit.evaluate.compare")

HISTOGRAM_BINS = 256


# ------------------------------------------------------------------------------------------ evaluation


def _config(tokenizer_dir: str | Path | None) -> Mapping[str, Any]:
    """The model folder's config.json ({} when there is none; read once per file version)."""
    from calibkit.data.modeldir import read_config

    return read_config(tokenizer_dir)


def select_task(artifact: EngineArtifact, tokenizer_dir: str | Path | None, kind: str | None = None,
                graph: onnx.ModelProto | None = None) -> Task:
    """The calibkit.tasks Task for the engines' model: from its ONNX outputs and config.json (``kind`` forces).
    ``graph``: the engine's ONNX model when the caller has loaded it."""
    cfg = _config(tokenizer_dir)
    src = artifact.path if is_onnx_engine(artifact) else artifact.source_model
    if graph is None and src and Path(src).is_file():
        graph = load_model(src, load_external_data=False)
    # a TensorRT engine without its source model: classification as before
    outputs = model_outputs(graph) if graph is not None else {"logits": 2}
    try:
        task = choose_task(outputs, cfg, kind)
    except ValueError:
        *others, last = kind_names()
        raise UsageError(f"unknown --task {kind!r}", hint=f"choose {', '.join(others)} or {last}") from None
    if graph is not None:
        assert src is not None  # graph is src's model: loaded from it, or the ONNX engine's own (src its path)
        check_label_count(task, graph, Path(src).name)
    return task


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


def origin_sha256(e: EngineArtifact) -> str:
    """The model an engine's FP32 function comes from: a smoothed model's original (calibkit smooth keeps the
    function), else its own source."""
    return str(e.extra.smoothed_from_sha256 or e.source_model_sha256)


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


def _onnx_of(a: EngineArtifact, loaded: onnx.ModelProto | None = None) -> onnx.ModelProto | None:
    """The engine's ONNX model with its weights; ``loaded``: its graph as read already (external weights are
    added to it, so the file is parsed once per run)."""
    if is_onnx_engine(a):
        if loaded is not None:
            load_external_weights(loaded, Path(a.path))
            return loaded
        return load_model(a.path)
    log.warning("%s is a TensorRT engine: per-layer analysis needs ONNX models, skipped for it", a.path.name)
    return None


@dataclass(frozen=True, eq=False)
class _EngineRun:
    """One engine's outputs on the evidence (internal: the result keeps only what its document holds)."""

    name: str  # "A" | "B" | "reference"
    artifact: EngineArtifact
    outputs: Predicted
    latency: LatencyStats

    @property
    def logits(self) -> np.ndarray:
        return self.outputs.values


@dataclass(frozen=True, eq=False)
class CompareInputs:
    """What a compare request names, loaded: the engines, the rows to evaluate (``rows``: which rows of the
    eval file they are, None for all), the model's task and the traffic drawn."""

    a: EngineArtifact
    b: EngineArtifact
    reference: EngineArtifact | None
    eval_set: EvalSet
    rows: EvalSubset | None
    task: Task
    traffic: TrafficEvidence | None
    graph_a: onnx.ModelProto | None = None  # A's ONNX model as read once for the run (external weights not yet)


def resolve_compare(request: CompareRequest, progress: ProgressCallback | None = None) -> CompareInputs:
    """The inputs of a validated compare request, before any inference: the engines (of one FP32 model), the
    task, the eval set (labels checked over the whole file, then --limit drawn) and the traffic, the eval set's
    texts left out of it; without an eval set the traffic texts are the (unlabeled) eval set."""
    a, b = artifact(request.engine_a), artifact(request.engine_b)
    ref = artifact(request.reference) if request.reference is not None else None
    engines = [a, b] + ([ref] if ref else [])
    traffic = None if isinstance(request.traffic, Traffic) else request.traffic
    not_an_input(request.save_outputs, [*engines, request.eval_set, traffic], "save_outputs")
    check_same_model(engines)
    graph_a = load_model(a.path, load_external_data=False) if is_onnx_engine(a) else None
    task = select_task(a, tokenizer_dir(engines), request.task, graph_a)
    ev = rows = None
    if request.eval_set is not None:
        ev, rows = load_evidence(request.eval_set, task=task, limit=request.limit, seed=request.seed,
                                 text_column=request.text_column, label_column=request.label_column,
                                 split=request.split)
    drawn = load_traffic(request.traffic, engine_calibration_set(b, a), size=request.traffic_size,
                         text_field=request.traffic_text_field, seed=request.seed, progress=progress,
                         exclude=ev.texts if ev is not None else (), tokenizer=tokenizer_dir(engines))
    if ev is None:
        if drawn is None or not len(drawn):
            raise UsageError("compare has no texts: no eval set was given and no traffic was drawn",
                             hint="pass --eval-set test.jsonl, or --traffic LOG with texts outside the "
                                  "calibration set")
        ev = EvalSet(Path(drawn.source.path), tuple(drawn.texts), ())
    return CompareInputs(a, b, ref, ev, rows, task, drawn, graph_a)


def compare_engines(request: CompareRequest, resources: Resources) -> Comparison:
    """Everything ``calibkit compare`` reports, for every task through one pipeline: evaluate each engine
    through the task, score the outputs against the task's gold labels (where the eval set has them), B's
    fidelity to A (on the traffic too, ``Comparison.traffic``), per-layer measurements, sensitivity and the
    flags. The inputs are loaded first (:func:`resolve_compare`); every runner comes from
    ``resources.runner_factory``, sensitivity's variants run on ``resources.executor``."""
    inputs = resolve_compare(request, resources.progress)
    return compare_loaded(inputs, request, resources)


def compare_loaded(inputs: CompareInputs, options: CompareRequest, resources: Resources) -> Comparison:
    """The measurements of :func:`compare_engines` on loaded inputs, in order."""
    a, b, reference, eval_set, task, traffic = (inputs.a, inputs.b, inputs.reference, inputs.eval_set, inputs.task,
                                                inputs.traffic)
    progress, rows = resources.progress, inputs.rows
    factory = ort_runner_factory(factory=resources.runner_factory)
    engines = [a, b] + ([reference] if reference is not None else [])
    # inputs agree by content before any work: one tokenizer and label map; the source models and tables
    # that per-layer ranges and sensitivity rebuild from are the ones the engines were built from
    check_engines(dict(zip(["A", "B", "reference"], engines)), sources=options.layers or options.measures_sensitivity)
    tok_dir = tokenizer_dir(engines)
    tokenizer = TextTokenizer(tok_dir)
    texts = list(eval_set.texts)
    gold = task.gold(eval_set, tokenizer)  # bad labels fail here, before any inference
    estimate, since, clock = _time_estimate(engines, eval_set, task, tokenizer, traffic, options, resources)
    with clock.phase("evaluate engines"):
        runs = _evaluate_engines(engines, task, tokenizer, texts, options, resources)
    ea, eb = runs[0], runs[1]
    width = int(ea.logits.shape[-1]) if ea.logits.ndim >= 2 else 0
    pa, pb = task.predictions(ea.outputs), task.predictions(eb.outputs)
    if pa is not None and task.labels and width != len(task.labels):
        raise ModelError(f"{a.path.name} returns {width} logits but config.json names {len(task.labels)} labels")
    if gold is None:
        gold = task.gold(eval_set, tokenizer, width)
    score = task.score({r.name: r.outputs for r in runs}, gold, seed=options.seed)
    fid = task.fidelity(ea.outputs, eb.outputs)
    if score.extra:
        fid = replace(fid, extra={**fid.extra, **score.extra})
    labels = task.labels or (tuple(str(i) for i in range(width)) if score.engines else ())
    warnings = list(score.warnings) if score.labelled else list(unscored_warnings(task, eval_set))
    traffic_outs = None
    if traffic is not None and len(traffic):
        # the traffic is the eval set itself (compare without --eval-set): its outputs are the ones just taken
        same = tuple(traffic.texts) == tuple(texts)
        with clock.phase("traffic"):
            traffic_outs = ((ea.outputs, eb.outputs) if same
                            else _traffic_outputs(a, b, traffic, task, tokenizer, options, resources))
    evidence, why_not = sensitivity_texts(task, runs, texts, score, traffic, traffic_outs, options)
    layered = _layers(a, b, reference, texts, runs, score, pa, task, options, factory, tokenizer, tok_dir,
                      progress, resources, evidence, why_not, clock, inputs.graph_a)
    if options.layers and not layered.evidence.measured:
        warnings.append(f"per-layer sensitivity not measured: {layered.evidence.why_not}")
    for w in warnings:  # returned with the result, whose caller shows them (the CLI as "warning:")
        log.info("%s", w)
    comparison = build_comparison(
        eval_set=eval_set, rows=rows, labels=labels, runs=runs, task=task, score=score, fidelity=fid,
        predictions=(pa, pb), disagreements=_disagreements(texts, labels, score, pa, pb, ea, task, rows,
                                                           options.max_disagreements),
        layered=layered, options=options, warnings=tuple(warnings),
    )
    if traffic is not None and traffic_outs is not None:
        comparison = replace(comparison, traffic=_traffic_result(traffic, task, traffic_outs))
    with clock.phase("speed"):
        speed, speed_note = _speed(a, b, tokenizer, traffic.texts if traffic is not None and len(traffic) else texts,
                                   options, resources, inputs.graph_a)
    comparison = replace(comparison, speed=speed, speed_note=speed_note)
    comparison = replace(comparison, gate=gate(comparison, options.min_agreement, options.max_drop))
    return replace(comparison, time_estimate=finish(estimate, time.perf_counter() - since, clock.phases))


def _speed(a: EngineArtifact, b: EngineArtifact, tokenizer: TextTokenizer, texts: Sequence[str],
           options: CompareRequest, resources: Resources, graph_a: onnx.ModelProto | None = None
           ) -> tuple[Speed | None, str | None]:
    """B timed against A as a server runs them (evaluate.speed), or why not. ``graph_a``: A's model as read."""
    if not options.speed:
        return None, "not measured (--no-speed)"
    if Backend.TENSORRT in (a.backend, b.backend):
        return None, ("not measured: a TensorRT engine is timed where TensorRT runs it (trtexec, perf_analyzer); "
                      "TensorRT is not installed here")
    if not texts:
        return None, "not measured: no texts"
    from calibkit.evaluate.speed import measure_speed, text_batches
    from calibkit.graph import model_input_names

    names = model_input_names(graph_a if graph_a is not None else load_model(a.path, load_external_data=False))
    speeds = measure_speed({"A": a.path, "B": b.path}, "A",
                           text_batches(tokenizer, names, texts, seed=options.seed),
                           make_runner=resources.runner_factory, progress=resources.progress)
    return speeds["B"], None


def _time_estimate(engines: Sequence[EngineArtifact], eval_set: EvalSet, task: Task, tokenizer: TextTokenizer,
                   traffic: TrafficEvidence | None, options: CompareRequest, resources: Resources
                   ) -> tuple[TimeEstimate, float, PhaseClock]:
    """The estimate of everything below (evaluate.estimate), sent through ``progress``; when it was made, and the
    clock that times each step against it."""
    texts = list(eval_set.texts)
    beside = len(traffic) if traffic is not None and tuple(traffic.texts) != tuple(texts) else 0
    scale = 1.0
    if beside and texts:  # traffic texts priced by their padded tokens against the eval texts timed
        assert traffic is not None  # beside counts traffic texts
        def per_text(xs: Sequence[str]) -> float:
            return padded_tokens(token_counts(tokenizer, xs), options.batch_size) / max(1, len(xs))

        scale = per_text(list(traffic.texts)) / max(1e-9, per_text(texts))
    size = compare_size(engines, len(texts), beside, options, labelled=eval_set.has_labels and task.classifies,
                        row_task=task.per_text, traffic_scale=scale)
    sample = texts or (list(traffic.texts) if traffic is not None else [])
    estimate = estimate_compare(engines, size, resources.runner_factory.engine, tokenizer, task, sample, options,
                                resources.executor)
    announce(estimate, "compare", resources.progress)
    return estimate, time.perf_counter(), PhaseClock(usable_cpus())


def _traffic_outputs(a: EngineArtifact, b: EngineArtifact, traffic: TrafficEvidence, task: Task,
                     tokenizer: TextTokenizer, options: CompareRequest, resources: Resources
                     ) -> tuple[Predicted, Predicted]:
    """A's and B's outputs on the traffic texts."""
    outs = []
    for name, art in (("A", a), ("B", b)):
        with resources.runner_factory.engine(art) as runner:
            outs.append(task.predict(runner, tokenizer, list(traffic.texts), batch_size=options.batch_size,
                                     progress=resources.progress, task=f"traffic {name} ({art.path.name})"))
    return outs[0], outs[1]


def traffic_fidelity(a: EngineArtifact, b: EngineArtifact, traffic: TrafficEvidence, task: Task,
                     tokenizer: TextTokenizer, options: CompareRequest, resources: Resources) -> TrafficFidelity:
    """A and B on the traffic texts: B's fidelity to A in the task's terms, with the interval of the agreement
    where the task has class decisions (each text is one independent draw from the log)."""
    outs = _traffic_outputs(a, b, traffic, task, tokenizer, options, resources)
    return _traffic_result(traffic, task, outs)


def _traffic_result(traffic: TrafficEvidence, task: Task, outs: tuple[Predicted, Predicted]) -> TrafficFidelity:
    fid = task.fidelity(outs[0], outs[1])
    pa, pb = task.predictions(outs[0]), task.predictions(outs[1])
    ci = flips = kl = None
    if pa is not None and pb is not None and pa.ndim == 1:
        same = np.asarray(pa) == np.asarray(pb)
        ci, flips = Range.of(proportion(same)), int((~same).sum())
    if task.logits_distribution and outs[0].values.ndim == 2 and outs[0].values.size:
        kl = finite(output_error(outs[0].values, outs[1].values).mean_kl)
    evidence = evidence_of(traffic)
    assert evidence is not None
    return TrafficFidelity(evidence, Fidelity(finite(fid.agreement), finite(fid.cosine_mean),
                                              finite(fid.cosine_min), {k: finite(v) for k, v in fid.extra.items()}),
                           ci, flips, kl)


@dataclass(frozen=True, eq=False)
class SensitivityTexts:
    """The texts per-layer sensitivity draws its subset from, and the higher-precision engine's outputs on them
    (the reference every variant is judged against): the labelled eval set of a classifier (accuracy and
    flips), else the traffic when there is some (more texts, the real distribution), else the eval set —
    judged on fidelity alone."""

    source: str  # "eval set" | "traffic"
    texts: Sequence[str]
    reference: Predicted
    strata: Sequence[str]
    labels: np.ndarray | None = None  # class ids (labelled classification only)


def sensitivity_texts(task: Task, runs: Sequence[_EngineRun], texts: Sequence[str], score: TaskScore,
                      traffic: TrafficEvidence | None, traffic_outs: tuple[Predicted, Predicted] | None,
                      options: CompareRequest) -> tuple[SensitivityTexts | None, str]:
    """(the evidence for per-layer sensitivity, "") or (None, why it is not measured)."""
    if not options.layers:
        return None, "per-layer analysis is off (--no-layers)"
    if not options.sensitivity:
        return None, "it was turned off (--no-sensitivity)"
    if not task.per_text:
        return None, (f"per-layer sensitivity is not measured for {task.kind} models (it needs a per-text "
                      f"fidelity, which exists for {', '.join(per_text_kinds())})")
    ordered = sorted(runs, key=lambda e: e.name != "reference")
    fp = next((e for e in ordered if e.artifact.precision is not Precision.INT8), None)
    if fp is None:
        return None, "no higher-precision engine gives the reference outputs (pass --reference FP32.onnx)"
    y = score.class_ids if task.classifies else None
    classes = task.predictions(fp.outputs)
    if y is not None:
        return SensitivityTexts("eval set", texts, fp.outputs, [str(int(v)) for v in y], y), ""
    if traffic is not None and traffic_outs is not None and fp.name in ("A", "B"):
        ref = traffic_outs[0] if fp.name == "A" else traffic_outs[1]
        pred = task.predictions(ref)
        strata = [str(int(v)) for v in pred] if pred is not None and pred.ndim == 1 else [""] * len(traffic)
        return SensitivityTexts("traffic", list(traffic.texts), ref, strata), ""
    if not len(texts):
        return None, "the eval set has no texts"
    strata = [str(int(v)) for v in classes] if classes is not None and classes.ndim == 1 else [""] * len(texts)
    return SensitivityTexts("eval set", texts, fp.outputs, strata), ""


def tokenizer_dir(engines: Sequence[EngineArtifact]) -> str:
    """The tokenizer folder named by the engines' sidecars (the first that names one)."""
    tok_dir = next((e.tokenizer for e in engines if e.tokenizer), None)
    if tok_dir is None:
        raise ModelError(
            "none of the engines' sidecars names a tokenizer folder",
            hint="rebuild the engines with `calibkit build`, which records the tokenizer in the sidecar",
        )
    return tok_dir


def _evaluate_engines(engines: Sequence[EngineArtifact], task: Task, tokenizer: TextTokenizer, texts: list[str],
                      options: CompareRequest, resources: Resources) -> list[_EngineRun]:
    runs = []
    for name, art in zip(["A", "B", "reference"], engines):
        with resources.runner_factory.engine(art) as runner:
            out, lat = _evaluate_task(runner, tokenizer, texts, task, batch_size=options.batch_size,
                                      progress=resources.progress, name=f"evaluate {name} ({art.path.name})")
        runs.append(_EngineRun(name, art, out, lat))
    return runs


def _disagreements(texts: Sequence[str], labels: tuple[str, ...], score: TaskScore, pa: np.ndarray | None,
                   pb: np.ndarray | None, ea: _EngineRun, task: Task, rows: EvalSubset | None, limit: int
                   ) -> tuple[Disagreement, ...]:
    """The first ``limit`` texts whose predicted class differs between A and B (tasks with classes only)."""
    if pa is None or pb is None:
        return ()
    width = int(ea.logits.shape[-1]) if ea.logits.ndim else 0
    names = labels or tuple(str(i) for i in range(width))
    file_row = (lambda i: rows.indices[i]) if rows is not None else (lambda i: i)
    gap = top2_gap(ea.logits) if task.logits_distribution and ea.logits.size else None
    y = score.class_ids
    return tuple(
        Disagreement(int(file_row(int(i))), texts[i], names[int(y[i])] if y is not None else "", names[int(pa[i])],
                     names[int(pb[i])], float(gap[i]) if gap is not None else None)
        for i in np.flatnonzero(pa != pb)[:limit]
    )


@dataclass(frozen=True, eq=False)
class _Layered:
    """The per-layer part of a comparison (internal)."""

    verdicts: tuple[LayerVerdict, ...] = ()
    histograms: dict[str, TensorHistogram] = field(default_factory=dict)
    subset: EvalSubset | None = None
    sensitivity_subset: EvalSubset | None = None  # rows of the eval set (None when the traffic was used)
    sensitivity_samples: int = 0
    evidence: SensitivityEvidence = SensitivityEvidence(False, "per-layer analysis is off (--no-layers)")
    findings: tuple[FindingResult, ...] = ()


def _layers(a: EngineArtifact, b: EngineArtifact, reference: EngineArtifact | None, texts: Sequence[str],
            runs: Sequence[_EngineRun], score: TaskScore, pa: np.ndarray | None, task: Task,
            options: CompareRequest, factory: RunnerFactory, tokenizer: TextTokenizer, tok_dir: str,
            progress: ProgressCallback | None, resources: Resources, evidence: SensitivityTexts | None,
            why_not: str, clock: PhaseClock, graph_a: onnx.ModelProto | None = None) -> _Layered:
    """Per-layer measurements on a stratified subset (by label, else by A's prediction), sensitivity on
    ``evidence`` (every task with per-text fidelity), each layer's flag, and the findings that group them."""
    if not options.layers:
        return _Layered()
    y = score.class_ids
    if y is not None:
        strata = [str(int(v)) for v in y]
    elif pa is not None:
        strata = [str(int(v)) for v in pa]
    else:
        strata = [""] * len(texts)
    with clock.phase("per-layer measurements"):
        lr = _layer_run(a, b, reference, texts, strata, options, factory, tokenizer, progress, resources.budget,
                        graph_a)
    sens: SensitivityAnalysis | None = None
    sens_subset: EvalSubset | None = None
    if evidence is not None:
        if lr.int8_art is None or lr.int8_model is None:
            why_not = ("neither engine is an INT8 ONNX model whose variants can be rebuilt"
                       if lr.int8_art is None else f"{lr.int8_art.path.name} is not an ONNX model")
        else:
            sens_specs = worst_layers(lr.measured.layers, lr.wsqnr, options.sensitivity_layers)
            sens_subset = stratified_subset(evidence.texts, list(evidence.strata), options.sensitivity_samples,
                                            options.seed)
            with clock.phase("per-layer sensitivity"):
                sens, why_not = _sensitivity(lr.int8_art, lr.int8_model, sens_specs, evidence, task, tok_dir, options,
                                             sens_subset, resources)
    verdicts = layer_verdicts(lr.measured.layers, lr.wsqnr, sens, options.thresholds, score.accuracy_diff)
    sens_evidence = _sensitivity_evidence(sens, evidence, task, why_not)
    return _Layered(verdicts, _histograms(lr.measured.layers, lr.measured.ranges, options.histogram_layers),
                    lr.subset, sens_subset if evidence is not None and evidence.source == "eval set" and sens
                    else None, sens.samples if sens else 0, sens_evidence,
                    _findings(verdicts, lr.int8_model, lr.int8_art, options.thresholds))


def _sensitivity_evidence(sens: SensitivityAnalysis | None, evidence: SensitivityTexts | None, task: Task,
                          why_not: str) -> SensitivityEvidence:
    if sens is None or evidence is None:
        return SensitivityEvidence(False, why_not or "it did not run", task=task.kind)
    return SensitivityEvidence(
        True, task=sens.task, source=evidence.source, samples=sens.samples,
        basis=fidelity_basis(sens.task, sens.labelled), layers=len(sens.layers),
        all_int8_agreement=finite(1.0 - sens.all_int8.flip_rate), all_int8_cosine=finite(sens.all_int8.mean_cosine),
        all_int8_accuracy=finite(sens.all_int8.accuracy), reference_accuracy=finite(sens.reference_accuracy),
    )


def _findings(verdicts: Sequence[LayerVerdict], model: onnx.ModelProto | None, int8_art: EngineArtifact | None,
              thresholds: Thresholds) -> tuple[FindingResult, ...]:
    """Flags that one clipped tensor family explains (``evaluate.findings.group_flags``), one finding each."""
    if model is None or not any(v.flag is not Flag.OK for v in verdicts):
        return ()
    families = tensor_families(model)
    methods: dict[str, str] = {}
    cal = int8_art.calibration_json if int8_art is not None else None
    if cal and Path(cal).is_file():
        try:
            methods = {r.tensor: r.method.value for r in load_calibration_table(cal).ranges}
        except CalibkitError as exc:  # the findings are extra: a table that cannot be read loses only the method
            log.warning("findings: cannot read %s: %s", cal, exc)
    items = [FlaggedInput(v.node, v.tensor, LayerFlag(v.flag, v.reasons), families.get(v.tensor),
                          methods.get(v.tensor), v.amax, v.fp_absmax, v.clipped_fraction) for v in verdicts]
    found, _ = group_flags(items, thresholds)
    return tuple(FindingResult(f.cause, f.family, f.method, f.nodes, tuple(m.tensor for m in f.members),
                               tuple(m.tensor for m in f.same_nodes), f.flag_counts, f.fix, f.message)
                 for f in found)


@dataclass(frozen=True, eq=False)
class _LayerRun:
    int8_art: EngineArtifact | None  # the INT8 side, if either is
    int8_model: onnx.ModelProto | None
    measured: LayerMeasurements
    wsqnr: dict[str, Any]  # node -> weight error
    subset: EvalSubset


def _layer_run(a: EngineArtifact, b: EngineArtifact, reference: EngineArtifact | None, texts: Sequence[str],
               strata: Sequence[str], options: CompareRequest, factory: RunnerFactory, tokenizer: TextTokenizer,
               progress: ProgressCallback | None, budget: TokenBudget | None = None,
               graph_a: onnx.ModelProto | None = None) -> _LayerRun:
    """Per-layer measurements of the quantized layers on a stratified subset (``strata``: labels, or A's
    predictions without labels), and the weight errors of the INT8 side."""
    int8_art = b if _is_int8(b) else (a if _is_int8(a) else None)
    model_a, model_b = _onnx_of(a, graph_a), _onnx_of(b)
    int8_model = model_b if int8_art is b else (model_a if int8_art is a else None)
    layer_source = int8_model if int8_model is not None else model_a
    specs = find_layers(layer_source) if layer_source is not None else ()
    ref_model = _reference_model(a, b, reference, model_a, model_b, int8_art)
    subset = stratified_subset(texts, list(strata), options.layer_samples, options.seed)
    measured = measure_layers(
        specs, subset.take(texts), tokenizer, reference=ref_model, baseline=model_a, candidate=model_b,
        runner_factory=factory, batch_size=options.batch_size, progress=progress, budget=budget,
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
    if int8_art is not None and int8_art.extra.smoothed_from_sha256 and src and Path(src).is_file():
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


def worst_layers(measured: Sequence[LayerMeasurement], wsqnr: dict[str, Any], k: int | None) -> list[LayerSpec]:
    """The specs of the ``k`` nodes most likely to hurt: lowest own SQNR of input or weights, or most
    zeroed weights first (all nodes when ``k`` is None)."""
    def badness(m: LayerMeasurement) -> float:
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


def _sensitivity(int8_art: EngineArtifact, int8_model: onnx.ModelProto, specs: Sequence[LayerSpec],
                 evidence: SensitivityTexts, task: Task, tok_dir: str, options: CompareRequest,
                 subset: EvalSubset, resources: Resources) -> tuple[SensitivityAnalysis | None, str]:
    """Per-layer sensitivity on ``subset`` of ``evidence``, judged against the reference outputs there in the
    task's terms: logits, pooled vectors (with those vectors as the neighbour index) or token tags. (None, why)
    when it cannot run."""
    src, cal = int8_art.source_model, int8_art.calibration_json
    if not (src and cal and Path(src).is_file() and Path(cal).is_file()):
        return None, (f"{int8_art.path.name}'s sidecar does not name an existing source_model and "
                      "calibration_json to rebuild its variants from")
    if not len(subset):
        return None, "no texts to run it on"
    idx = subset.array
    mask = evidence.reference.mask
    values = task.row_reference(np.asarray(evidence.reference.values)[idx],
                                None if mask is None else np.asarray(mask)[idx])
    index = rows = None
    if task.neighbour_index:  # the reference vectors of these texts are the index their neighbours come from
        index, rows = values, range(len(idx))
    labels = [int(v) for v in evidence.labels[idx]] if evidence.labels is not None else []
    analysis = analyse_sensitivity(
        [s.node for s in specs], source_model=src, calibration_json=cal, tokenizer=tok_dir,
        texts=subset.take(evidence.texts), labels=labels, reference_logits=values,
        base_keep=int8_art.kept_higher_precision, target=qdq_layout(int8_model) or "tensorrt",
        batch_size=options.batch_size, workers=resources.workers, progress=resources.progress,
        executor=resources.executor,
        output_name=task.output_name, source_model_sha256=int8_art.source_model_sha256,
        calibration_sha256=int8_art.calibration_sha256, task=task.kind,
        pooling=getattr(task, "pooling", None) if task.pools else None, neighbour_index=index,
        index_rows=rows, settles=cost_settles(options.thresholds, task.kind),
    )
    return analysis, ""


def _histograms(
    layers: Sequence[LayerMeasurement], ranges: dict[str, RangeAccumulator], count: int
) -> dict[str, TensorHistogram]:
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

    out: dict[str, TensorHistogram] = {}
    for tensor, m in chosen.items():
        acc = ranges[tensor]
        stats = acc.coarse_stats(MethodParams().num_bins)
        thresholds: dict[str, float | None] = {}
        for method in Method:
            try:
                thresholds[method.value] = finite(compute_amax(stats, method, MethodParams()))
            except Exception as exc:  # a method failing must not lose the whole comparison
                log.warning("method %s failed on %s: %s", method.value, tensor, exc)
                thresholds[method.value] = None
        thresholds["amax"] = finite(m.spec.amax)
        counts = stats.histogram.counts.reshape(HISTOGRAM_BINS, -1).sum(axis=1)
        out[tensor] = TensorHistogram(tuple(int(c) for c in counts), float(stats.histogram.upper), thresholds)
    return out


def build_comparison(*, eval_set: EvalSet, rows: EvalSubset | None, labels: tuple[str, ...],
                     runs: Sequence[_EngineRun], task: Task, score: TaskScore, fidelity: Fidelity,
                     predictions: tuple[np.ndarray | None, np.ndarray | None], disagreements: tuple[Disagreement, ...],
                     layered: _Layered, options: CompareRequest, warnings: tuple[str, ...]) -> Comparison:
    """The typed result from the measured values (no NaN: what does not apply is None)."""
    ea, eb = runs[0], runs[1]
    pa, pb = predictions
    va, vb = ea.logits, eb.logits
    if ea.outputs.mask is not None:  # token outputs: real tokens only
        va, vb = va[ea.outputs.mask], vb[ea.outputs.mask]
    err = np.abs(va.astype(np.float64) - vb) if va.size else np.zeros(1)
    if not task.logits_distribution:  # no class distribution: only the squared error
        kl, mse = None, finite(np.mean(err ** 2))
    elif va.size:
        oe = output_error(va.reshape(-1, va.shape[-1]), vb.reshape(-1, vb.shape[-1]))
        kl, mse = finite(oe.mean_kl), finite(oe.logit_mse)
    else:
        kl, mse = 0.0, 0.0
    agreement = finite(fidelity.agreement)
    classes = pa is not None and pb is not None
    return Comparison(
        calibkit_version=__version__,
        eval_set=Evidence(path=str(eval_set.path), count=len(eval_set), labels=labels,
                          rows=RowSelection.of_subset(rows), labelled=score.labelled),
        engines=tuple(_engine_result(r, score.engines.get(r.name)) for r in runs),
        task=TaskResult(kind=task.kind, output=task.output_name, labelled=score.labelled,
                        fidelity=Fidelity(finite(fidelity.agreement), finite(fidelity.cosine_mean),
                                          finite(fidelity.cosine_min),
                                          {k: finite(v) for k, v in fidelity.extra.items()}),
                        gold=score.gold),
        outputs=OutputStats(finite(fidelity.cosine_mean), finite(fidelity.cosine_min),
                            finite(err.max()) if err.size else None, finite(err.mean()) if err.size else None,
                            kl, mse),
        thresholds=options.thresholds,
        recommendation=recommend(layered.verdicts, layered.evidence, options.thresholds),
        agreement=agreement,
        agreement_ci=Range.of(proportion(np.asarray(pa) == np.asarray(pb))) if classes else None,
        flip_rate=1.0 - agreement if agreement is not None and len(eval_set) else None,
        difference=Differences(Difference.of(score.accuracy_diff), Range.of(score.macro_f1_diff)),
        warnings=warnings,
        seed=options.seed,
        subsets=Subsets(RowSelection.of_subset(layered.subset), RowSelection.of_subset(layered.sensitivity_subset)),
        disagreements=disagreements,
        flips_by_confidence=tuple(ConfidenceBand(b.low, b.high, b.texts, b.flips)
                                  for b in flips_by_confidence(va, vb)) if classes and task.logits_distribution
        and va.size else (),
        layers=layered.verdicts,
        layer_samples=len(layered.subset) if layered.subset is not None else 0,
        sensitivity_samples=layered.sensitivity_samples,
        histograms=layered.histograms,
        sensitivity=layered.evidence,
        findings=layered.findings,
        per_text=PerTextOutputs({r.name: r.logits for r in runs},
                                {r.name: r.outputs.mask for r in runs if r.outputs.mask is not None}),
    )


def _layout(art: EngineArtifact) -> str | None:
    """The Q/DQ layout of an INT8 engine: its sidecar's, else read from an ONNX file's zero points (None for FP32
    and FP16)."""
    if art.precision is not Precision.INT8:
        return None
    target = art.extra.target
    if not target and Path(art.path).suffix == ".onnx":
        with contextlib.suppress(ModelError):
            target = qdq_layout(load_model(art.path, load_external_data=False))
    return str(target) if target else None


def _engine_result(r: _EngineRun, s: EngineScore | None) -> EngineEvaluation:
    lat = r.latency
    m = s.metrics if s else None
    return EngineEvaluation(
        name=r.name, path=str(r.artifact.path), precision=r.artifact.precision.value,
        backend=r.artifact.backend_name,
        latency_ms=Latency(finite(lat.mean_ms), finite(lat.p50_ms), finite(lat.p95_ms)),
        throughput_per_s=finite(lat.throughput_per_s), batch_size=int(lat.batch_size),
        accuracy=finite(m.accuracy) if m else None, accuracy_ci=Range.of(s.accuracy_ci) if s else None,
        macro_f1=finite(m.macro_f1) if m else None, macro_f1_ci=Range.of(s.macro_f1_ci) if s else None,
        confusion_matrix=tuple(tuple(int(c) for c in row) for row in m.confusion_matrix) if m else None,
        labels=tuple(m.labels) if m else (),
        layout=_layout(r.artifact),
    )
