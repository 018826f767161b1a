"""calibkit's public API: each command as one function, taking paths or loaded objects and returning typed results.

``import calibkit as ck`` re-exports these lazily (``import calibkit`` stays light). The CLI parses options into
these calls and renders what they return; every check on the inputs happens here (or below), so a Python caller
gets the same validation as a command line. Errors are the :class:`calibkit.errors.CalibkitError` tree
(``UsageError``, ``DataError``, ``ModelError``, ``CalibrationError``, ``BackendError``,
``MissingDependencyError``), each with a message and a hint.

::

    import calibkit as ck
    cs = ck.sample("logs.jsonl", "calibration_sets/logs", size=512)
    r = ck.calibrate("model/", cs, "runs/int8", method="entropy")
    a = ck.build("model/model.onnx", "engines/fp32.onnx", precision="fp32")
    b = ck.build("model/model.onnx", "engines/int8.onnx", qdq=r.model_path)
    c = ck.compare(a.artifact, b.artifact, "test.jsonl")
    c.agreement, c.engines[1].accuracy, [v.node for v in c.flagged]
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calibkit.errors import MissingDependencyError, UsageError
from calibkit.progress import ProgressCallback, no_progress
from calibkit.resources import Resources

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.calibrate.pipeline import CalibrationResult
    from calibkit.calibrate.smoothing import SmoothResult
    from calibkit.data.calibset import CalibrationSet
    from calibkit.data.encode import TokenBudget
    from calibkit.data.evalset import EvalSet
    from calibkit.data.modeldir import ModelDir
    from calibkit.engines.artifact import EngineArtifact
    from calibkit.engines.build import BuildResult
    from calibkit.evaluate.flags import Thresholds
    from calibkit.evaluate.results import Comparison, TuneResult
    from calibkit.evaluate.traffic import TrafficEvidence
    from calibkit.evaluate.tune import TuneRun
    from calibkit.executors import Executor

PathLike = str | os.PathLike[str]

DEFAULT_MEMORY_BUDGET = "1G"


def budget(memory_budget: str | int = DEFAULT_MEMORY_BUDGET, max_batch_tokens: int | None = None) -> TokenBudget:
    """The token budget of batches that tap activations: bytes held at once ("512M", "1G" or a number) and,
    optionally, the most padded tokens per batch."""
    from calibkit.data.encode import TokenBudget, parse_size

    size = memory_budget if isinstance(memory_budget, int) else parse_size(memory_budget)
    if max_batch_tokens is not None and max_batch_tokens < 1:
        raise UsageError(f"--max-batch-tokens must be at least 1, got {max_batch_tokens}")
    return TokenBudget(max_batch_tokens=max_batch_tokens, memory_bytes=size)


def _model_dir(model: PathLike | ModelDir, tokenizer: PathLike | None = None) -> ModelDir:
    from calibkit.data.modeldir import ModelDir

    if isinstance(model, ModelDir):
        return model
    return ModelDir.resolve(Path(model), Path(tokenizer) if tokenizer else None)


def _calibration_set(cset: PathLike | CalibrationSet) -> CalibrationSet:
    from calibkit.data.calibset import CalibrationSet, load_calibration_set

    return cset if isinstance(cset, CalibrationSet) else load_calibration_set(Path(cset))


def _artifact(engine: PathLike | EngineArtifact) -> EngineArtifact:
    from calibkit.engines.artifact import EngineArtifact

    return engine if isinstance(engine, EngineArtifact) else EngineArtifact.load(Path(engine))


# ---------------------------------------------------------------- sample


def sample(
    logs: PathLike,
    out: PathLike | None = None,
    *,
    size: int = 512,
    seed: int = 0,
    text_field: str | None = None,
    label_field: str | None = None,
    tokenizer: PathLike | None = None,
    strict: bool = False,
    redact: bool = True,
    clusters: int = 12,
    progress: ProgressCallback | None = None,
) -> CalibrationSet:
    """Draw a calibration set from production logs (JSONL) and write it to ``out`` (default
    calibration_sets/<log>-n<size>-s<seed>/). Returns the written set (texts, labels, manifest)."""
    from calibkit.data.calibset import write_calibration_set
    from calibkit.data.sample_pipeline import SampleOptions, default_out_dir, draw_sample

    if clusters < 1:
        raise UsageError(f"--clusters must be at least 1 (got {clusters})")
    options = SampleOptions(size=size, seed=seed, text_field=text_field, label_field=label_field,
                            tokenizer=Path(tokenizer) if tokenizer else None, strict=strict, redact=redact,
                            clusters=clusters)
    target = Path(out) if out is not None else default_out_dir(logs, size, seed)
    drawn = draw_sample(logs, options, progress)
    return write_calibration_set(target, drawn.texts, drawn.labels, drawn.manifest)


# ---------------------------------------------------------------- smooth


def smooth(
    model: PathLike | ModelDir,
    calibration_set: PathLike | CalibrationSet,
    out: PathLike,
    *,
    alpha: float | None = None,
    tokenizer: PathLike | None = None,
    batch_size: int = 32,
    memory_budget: str | int = DEFAULT_MEMORY_BUDGET,
    max_batch_tokens: int | None = None,
    progress: ProgressCallback | None = None,
) -> SmoothResult:
    """SmoothQuant-style migration of activation outliers into the weights (``alpha`` None: per layer, chosen
    on the calibration set). Writes a model folder ``out`` with the same FP32 function."""
    from calibkit.calibrate.smoothing import smooth as run_smooth

    if batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {batch_size}")
    return run_smooth(_model_dir(model, tokenizer), _calibration_set(calibration_set), out_dir=Path(out),
                      alpha=alpha, budget=budget(memory_budget, max_batch_tokens), batch_size=batch_size,
                      progress=progress)


# ---------------------------------------------------------------- calibrate

METHODS = ("entropy", "minmax", "percentile", "mse")


def check_calibration_options(*, method: str, target: str, percentile: float, num_bins: int, batch_size: int,
                              op_types: Sequence[str], exclude: Sequence[str]) -> None:
    """UsageError for options calibrate cannot use (each with what to pass instead)."""
    if method not in METHODS:
        raise UsageError(f"unknown --method {method!r}", hint=f"choose one of: {', '.join(METHODS)}")
    if target not in ("tensorrt", "onnxruntime"):
        raise UsageError(f"unknown --target {target!r}", hint="choose tensorrt or onnxruntime")
    if not 0.0 < percentile <= 100.0:
        raise UsageError(f"--percentile must be in (0, 100], got {percentile}", hint="e.g. --percentile 99.99")
    if num_bins < 256 or num_bins & (num_bins - 1):
        raise UsageError(f"--num-bins must be a power of two >= 256, got {num_bins}", hint="the default is 2048")
    if batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {batch_size}")
    if not op_types:
        raise UsageError("--op-types is empty", hint="e.g. --op-types MatMul,Gemm")
    for p in exclude:
        try:
            re.compile(p)
        except re.error as exc:
            raise UsageError(f"--exclude {p!r} is not a valid regular expression ({exc})") from None


def calibrate(
    model: PathLike | ModelDir,
    calibration_set: PathLike | CalibrationSet,
    out: PathLike | None = None,
    *,
    method: str = "mse",
    tokenizer: PathLike | None = None,
    op_types: Sequence[str] = ("MatMul", "Gemm"),
    exclude: Sequence[str] = (),
    target: str = "tensorrt",
    percentile: float = 99.99,
    num_bins: int = 2048,
    batch_size: int = 32,
    use_cache: bool = True,
    cache_dir: PathLike | None = None,
    memory_budget: str | int = DEFAULT_MEMORY_BUDGET,
    max_batch_tokens: int | None = None,
    executor: Executor | None = None,
    progress: ProgressCallback | None = None,
) -> CalibrationResult:
    """Collect activation statistics (reused from the statistics cache), compute the ``method``'s table and
    write ``out``/model.int8.onnx (Q/DQ), calibration.cache and calibration.json."""
    from calibkit.calibrate.pipeline import calibrate as run_calibration
    from calibkit.types import Method, MethodParams

    check_calibration_options(method=method, target=target, percentile=percentile, num_bins=num_bins,
                              batch_size=batch_size, op_types=op_types, exclude=exclude)
    dest = Path(out) if out is not None else Path("runs") / f"calibrate-{method}"
    if dest.resolve() == Path.cwd().resolve():
        raise UsageError("--out is the current directory", hint="calibkit writes into a folder: pass --out DIR")
    cset = _calibration_set(calibration_set)
    return run_calibration(
        _model_dir(model, tokenizer), cset, Method(method), MethodParams(num_bins=num_bins, percentile=percentile),
        out_dir=dest, op_types=list(op_types), exclude=list(exclude), target=target, batch_size=batch_size,
        progress=progress, use_cache=use_cache, budget=budget(memory_budget, max_batch_tokens), executor=executor,
        cache_dir=Path(cache_dir) if cache_dir is not None else None,
    )


# ---------------------------------------------------------------- build


def build(
    model: PathLike,
    output: PathLike,
    *,
    precision: str = "fp32",
    backend: str = "onnxruntime",
    calibration: PathLike | None = None,
    qdq: PathLike | None = None,
    target: str | None = None,
    exclude: Sequence[str] = (),
    tokenizer: PathLike | None = None,
    calibration_set: PathLike | None = None,
    min_seq: int | None = None,
    opt_seq: int | None = None,
    max_seq: int | None = None,
    workspace_mib: int = 4096,
    reduce_range: bool | None = None,
    progress: ProgressCallback | None = None,
    on_missing_tensorrt: Callable[[Any], None] | None = None,
) -> BuildResult:
    """Build an engine (``output`` with its .calibkit.json sidecar) at ``precision`` on ``backend``: FP32/FP16
    from the ONNX model, INT8 from a calibration.json or a Q/DQ model (``qdq``: e.g. calibrate's
    model.int8.onnx). ``on_missing_tensorrt(request)`` is called before the MissingDependencyError of a TensorRT
    build where TensorRT is absent (the CLI prints the equivalent trtexec command there)."""
    from calibkit.engines.build import BuildRequest
    from calibkit.engines.build import build as run_build
    from calibkit.types import Backend, Precision

    try:
        prec = Precision(precision.lower())
    except ValueError:
        raise UsageError(f"unknown --precision {precision!r}", hint="choose fp32, fp16 or int8") from None
    try:
        back = Backend(backend.lower())
    except ValueError:
        raise UsageError(f"unknown --backend {backend!r}", hint="choose onnxruntime or tensorrt") from None

    def p(x: PathLike | None) -> Path | None:
        return Path(x) if x is not None else None

    req = BuildRequest(
        model=Path(model), output=Path(output), precision=prec, backend=back, calibration=p(calibration),
        qdq_model=p(qdq), target=target.lower() if target else None, exclude=tuple(exclude), tokenizer=p(tokenizer),
        calibration_set=p(calibration_set), min_seq=min_seq, opt_seq=opt_seq, max_seq=max_seq,
        workspace_mib=workspace_mib, reduce_range=reduce_range,
    )
    try:
        return run_build(req, progress=progress)
    except MissingDependencyError:
        if back is Backend.TENSORRT and on_missing_tensorrt is not None:
            on_missing_tensorrt(req)
        raise


# ---------------------------------------------------------------- compare


def load_evidence(eval_set: PathLike | EvalSet, *, task: Any = None, limit: int | None = None, seed: int = 0,
                  text_column: str | None = None, label_column: str | None = None, split: str | None = None
                  ) -> tuple[EvalSet, Any]:
    """The eval set (a file or a loaded :class:`EvalSet`), its labels checked against ``task`` over the WHOLE
    file (a bad label is the file's fault whichever rows are drawn), then ``limit`` rows drawn (stratified,
    seeded). Returns (rows to evaluate, the ``EvalSubset`` they are of the file, or None for all)."""
    from calibkit.data.evalset import EvalSet, load_eval_set
    from calibkit.evaluate.subsets import limit_eval_set
    from calibkit.evaluate.tasks import TaskKind

    if isinstance(eval_set, EvalSet):
        full = eval_set
    else:
        label_sets = task is not None and task.kind is TaskKind.MULTI_LABEL
        full = load_eval_set(Path(eval_set), text_column=text_column, label_column=label_column, split=split,
                             label_sets=label_sets)
    if task is not None and task.kind is not TaskKind.TOKEN_CLASSIFICATION:
        task.gold(full)  # validation only; token tags are aligned (and checked) where the tokenizer is at hand
    return limit_eval_set(full, limit, seed)


def compare(
    engine_a: PathLike | EngineArtifact,
    engine_b: PathLike | EngineArtifact,
    eval_set: PathLike | EvalSet,
    *,
    reference: PathLike | EngineArtifact | None = None,
    task: str | None = None,
    limit: int | None = None,
    seed: int = 0,
    text_column: str | None = None,
    label_column: str | None = None,
    split: str | None = None,
    batch_size: int = 32,
    layers: bool = True,
    layer_samples: int | None = 512,
    sensitivity: bool = True,
    sensitivity_samples: int = 256,
    sensitivity_layers: int | None = None,
    thresholds: Thresholds | None = None,
    max_disagreements: int = 50,
    workers: int | None = None,
    executor: Executor | str | None = None,
    memory_budget: str | int = DEFAULT_MEMORY_BUDGET,
    max_batch_tokens: int | None = None,
    progress: ProgressCallback | None = None,
    traffic: PathLike | TrafficEvidence | None = None,
    traffic_size: int = 4000,
    traffic_text_field: str | None = None,
) -> Comparison:
    """Engine A (baseline) against engine B on an eval set: each engine's metrics, B's fidelity to A in the
    task's terms, per-layer measurements, sensitivity and flags. Engines are paths (with their .calibkit.json
    sidecars) or loaded :class:`EngineArtifact` values and must come from the same FP32 model; ``task`` forces
    classification | embedding | token-classification | regression | multi-label. ``executor``: an Executor or
    a spec ("local", "dask://host:port") for the sensitivity variants. ``traffic``: a request log (or
    ``"auto"``: the log of the calibration set B was calibrated on, named in its manifest) whose texts — those
    not in that calibration set — measure B's fidelity to A without labels (``Comparison.traffic``)."""
    import contextlib

    from calibkit.evaluate.compare import CompareOptions, check_same_model, compare_engines, select_task, tokenizer_dir
    from calibkit.evaluate.flags import Thresholds
    from calibkit.executors import from_spec

    if batch_size < 1:
        raise UsageError(f"--batch-size must be positive, got {batch_size}")
    a, b = _artifact(engine_a), _artifact(engine_b)
    ref = _artifact(reference) if reference is not None else None
    engines = [a, b] + ([ref] if ref else [])
    check_same_model(engines)
    chosen = select_task(a, tokenizer_dir(engines), task)
    ev, rows = load_evidence(eval_set, task=chosen, limit=limit, seed=seed, text_column=text_column,
                             label_column=label_column, split=split)
    opts = CompareOptions(
        batch_size=batch_size, layers=layers,
        layer_samples=layer_samples, sensitivity=sensitivity and layers, sensitivity_samples=sensitivity_samples,
        sensitivity_layers=sensitivity_layers, workers=workers, max_disagreements=max_disagreements, seed=seed,
        task=task, thresholds=thresholds or Thresholds(),
    )
    with contextlib.ExitStack() as stack:
        ex = executor
        if ex is None or isinstance(ex, str):
            ex = stack.enter_context(from_spec(ex, workers))
        resources = Resources(executor=ex, budget=budget(memory_budget, max_batch_tokens), workers=workers,
                              progress=progress or no_progress)
        drawn = load_traffic(traffic, _engine_calibration_set(b, a), size=traffic_size, text_field=traffic_text_field,
                             seed=seed, progress=progress)
        return compare_engines(a, b, ev, reference=ref, options=opts, rows=rows, task=chosen, resources=resources,
                               traffic=drawn)


def _engine_calibration_set(*engines: EngineArtifact) -> CalibrationSet | None:
    """The calibration set an INT8 engine was calibrated on (its sidecar's calibration.json names it), when it
    is still there: its texts are excluded from traffic evidence, and its manifest names the default log."""
    from calibkit._io import read_json
    from calibkit.data.calibset import load_calibration_set
    from calibkit.errors import CalibkitError

    for e in engines:
        if not e.calibration_json or not Path(e.calibration_json).is_file():
            continue
        try:
            doc = read_json(Path(e.calibration_json))
            cs = doc.get("calibration_set") if isinstance(doc, dict) else None
            path = cs.get("path") if isinstance(cs, dict) else cs
            if isinstance(path, str) and Path(path).is_dir():
                return load_calibration_set(Path(path))
        except (CalibkitError, OSError, ValueError):
            continue
    return None


# ---------------------------------------------------------------- tune


def check_tune_options(*, method: str, target: str, decision_rule: str = "sequential") -> None:
    """UsageError for a --method, --target or --decision-rule tune does not know."""
    from calibkit.types import Method

    if method != "auto" and method not in {m.value for m in Method}:
        raise UsageError(f"unknown --method {method!r}", hint="use auto, entropy, minmax, percentile or mse")
    if target not in ("tensorrt", "onnxruntime"):
        raise UsageError(f"unknown --target {target!r}", hint="use tensorrt or onnxruntime")
    if decision_rule not in ("sequential", "whole-split"):
        raise UsageError(f"unknown --decision-rule {decision_rule!r}", hint="use sequential or whole-split")


def tune(
    model: PathLike | ModelDir,
    calibration_set: PathLike | CalibrationSet,
    eval_set: PathLike | EvalSet,
    out: PathLike | None = None,
    *,
    tokenizer: PathLike | None = None,
    max_drop: float = 0.5,
    relative: bool = False,
    min_agreement: float | None = None,
    agreement_confidence: float = 0.9,
    method: str = "auto",
    target: str = "tensorrt",
    holdout: float = 0.3,
    sensitivity_samples: int = 256,
    sensitivity_layers: int | None = None,
    max_evaluations: int = 40,
    limit: int | None = None,
    seed: int = 0,
    percentile: float = 99.99,
    workers: int | None = None,
    executor: Executor | str | None = None,
    memory_budget: str | int = DEFAULT_MEMORY_BUDGET,
    max_batch_tokens: int | None = None,
    report: PathLike | None = None,
    progress: ProgressCallback | None = None,
    traffic: PathLike | TrafficEvidence | None = None,
    traffic_size: int = 4000,
    traffic_text_field: str | None = None,
    smooth: bool = True,
    decision_rule: str = "sequential",
) -> TuneRun:
    """The mixed-precision plan with the most INT8 work that keeps accuracy within ``max_drop`` points of FP32
    (and, with ``min_agreement``, that percentage of FP32's predictions). Writes ``out`` (model.int8.onnx,
    calibration.cache, calibration.json, plan.json, tune.json) and, with ``report``, a report folder. Returns
    the files written and the typed :class:`TuneResult` (``.result``).

    ``traffic``: a request log (the formats and ``traffic_text_field`` option of ``sample``), ``"auto"`` for the
    log named in the calibration set's manifest, or drawn :class:`TrafficEvidence`: up to ``traffic_size``
    texts not in the calibration set, split into search and holdout parts like the eval set; agreement with
    FP32 is then judged on them and the eval set carries accuracy alone.

    ``decision_rule``: ``"sequential"`` judges each candidate on growing chunks of the search split and stops
    once its decision is settled at ``agreement_confidence`` (a betting confidence sequence, valid however
    often it looks: evaluate.sequential); ``"whole-split"`` evaluates every candidate on the whole split."""
    import contextlib

    from calibkit._io import write_json
    from calibkit.evaluate.tasks import choose_task, model_outputs
    from calibkit.evaluate.tune import TuneConfig, run_tune
    from calibkit.executors import from_spec
    from calibkit.graph import load_model
    from calibkit.report.codec import to_document
    from calibkit.types import MethodParams

    check_tune_options(method=method, target=target, decision_rule=decision_rule)
    md = _model_dir(model, tokenizer)
    dest = Path(out) if out is not None else Path("runs") / f"tune-{md.onnx_path.parent.name or md.onnx_path.stem}"
    cfg = md.id2label
    task = choose_task(model_outputs(load_model(md.onnx_path, load_external_data=False)),
                       {"id2label": {str(k): v for k, v in cfg.items()}}) if cfg else None
    ev, rows = load_evidence(eval_set, task=task, limit=limit, seed=seed)
    cset = _calibration_set(calibration_set)
    drawn = load_traffic(traffic, cset, size=traffic_size, text_field=traffic_text_field, seed=seed, model=md,
                         progress=progress)
    config = TuneConfig(
        max_drop=max_drop, relative=relative, min_agreement=min_agreement, agreement_confidence=agreement_confidence,
        method=method, holdout_fraction=holdout, sensitivity_samples=sensitivity_samples,
        sensitivity_layers=sensitivity_layers, max_evaluations=max_evaluations, workers=workers, seed=seed,
        target=target, params=MethodParams(percentile=percentile), smooth=smooth, decision_rule=decision_rule,
    )
    render = None
    if report is not None:
        from calibkit.report.render import render_report

        def render(result: TuneResult, folder: Path) -> None:
            render_report(result, folder)

    def write_document(result: TuneResult, path: Path) -> None:
        write_json(path, to_document(result))

    with contextlib.ExitStack() as stack:
        ex = executor
        if isinstance(ex, str):
            ex = stack.enter_context(from_spec(ex, workers))
        resources = Resources(executor=ex, budget=budget(memory_budget, max_batch_tokens), workers=workers,
                              progress=progress or no_progress)
        return run_tune(md, cset, ev, dest, config, render=render,
                        report_dir=Path(report) if report is not None else None, resources=resources,
                        write_document=write_document, rows=rows, traffic=drawn)


def load_traffic(traffic: PathLike | TrafficEvidence | None, calibration_set: CalibrationSet | None, *,
                 size: int = 4000, text_field: str | None = None, seed: int = 0, model: ModelDir | None = None,
                 progress: ProgressCallback | None = None) -> TrafficEvidence | None:
    """Traffic evidence from ``traffic``: None (none), drawn evidence (as it is), ``"auto"`` (the calibration
    set's own log, named in its manifest) or a log path; calibration texts are excluded."""
    from calibkit.evaluate.traffic import TrafficEvidence, TrafficOptions, draw_default_traffic, draw_traffic

    if traffic is None or isinstance(traffic, TrafficEvidence):
        return traffic
    if size < 1:
        raise UsageError(f"--traffic-size must be at least 1, got {size}", hint="e.g. --traffic-size 4000")
    opts = TrafficOptions(size=size, seed=seed, text_field=text_field,
                          tokenizer=model.tokenizer_path if model is not None else None,
                          max_length=model.max_length if model is not None else None)
    if str(traffic) == "auto":
        if calibration_set is None:
            raise UsageError("--traffic auto needs a calibration set whose manifest names its log",
                             hint="pass the log itself: --traffic requests.jsonl")
        return draw_default_traffic(calibration_set, opts, progress)
    return draw_traffic(traffic, opts, calibration_set=calibration_set, progress=progress)


# ---------------------------------------------------------------- reports


def load_report(path: PathLike) -> Comparison | TuneResult:
    """A compare or tune JSON document (report.json, tune.json, compare --json) as its typed result."""
    from calibkit.report.codec import load_result

    return load_result(Path(path))


def render_report(result: Comparison | TuneResult, out: PathLike) -> Any:
    """Write a result as a report folder (report.json, report.md, report.html, plots/)."""
    from calibkit.report.render import render_report as _render

    return _render(result, Path(out))
