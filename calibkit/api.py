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

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calibkit._requestapi import open_resources, request_api, run
from calibkit.errors import UsageError
from calibkit.evaluate.inputs import (
    load_evidence,
    load_traffic,
    not_an_input,
)
from calibkit.progress import ProgressCallback
from calibkit.requests.build import BuildRequest
from calibkit.requests.calibrate import CalibrateRequest
from calibkit.requests.checks import (
    COUNT_OR_NONE,
    check_numbers,
    check_paths,
)
from calibkit.requests.compare import CompareRequest, check_targets
from calibkit.requests.deploy import DeployRequest
from calibkit.requests.export import ExportRequest
from calibkit.requests.resources import DEFAULT_MEMORY_BUDGET, MEMORY_BYTES, ResourceOptions
from calibkit.requests.sample import SampleRequest
from calibkit.requests.smooth import SmoothRequest
from calibkit.requests.tune import TuneRequest
from calibkit.resources import Resources
from calibkit.types import PathLike

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.building import BuildResult
    from calibkit.calibrate.methods import ActivationHistogram
    from calibkit.calibrate.pipeline import CalibrationResult
    from calibkit.calibrate.smoothing import SmoothResult
    from calibkit.data.calibset import CalibrationSet
    from calibkit.data.encode import TokenBudget
    from calibkit.data.evalset import EvalSet
    from calibkit.evaluate.tune import TuneRun
    from calibkit.executors import Executor
    from calibkit.exporter import ExportResult
    from calibkit.report.render import ReportPaths
    from calibkit.results.documents import DeployResult, PlanDocument
    from calibkit.results.runs import Comparison, TuneResult


__all__ = ["CalibrateRequest", "CompareRequest", "DeployRequest", "ExportRequest", "ResourceOptions", "SmoothRequest",
           "TuneRequest", "build", "budget", "calibrate",
           "compare", "deciding_digits", "export", "histogram", "load_evidence", "load_report", "load_traffic",
           "missed_targets", "render_report", "resources", "run", "sample", "save_per_text_outputs", "smooth",
           "tune"]


def budget(memory_budget: str | int = DEFAULT_MEMORY_BUDGET, max_batch_tokens: int | None = None) -> TokenBudget:
    """The token budget of batches that tap activations: bytes held at once ("512M", "1G" or a number) and,
    optionally, the most padded tokens per batch."""
    from calibkit.data.encode import TokenBudget, parse_size

    check_numbers({"--max-batch-tokens": (max_batch_tokens, COUNT_OR_NONE)})
    if not isinstance(memory_budget, str):
        check_numbers({"--memory-budget": (memory_budget, MEMORY_BYTES)})
    size = parse_size(memory_budget)
    return TokenBudget(max_batch_tokens=max_batch_tokens, memory_bytes=size)


@contextlib.contextmanager
def resources(executor: Executor | str | None = None, *, workers: int | None = None,
              memory_budget: str | int = DEFAULT_MEMORY_BUDGET, max_batch_tokens: int | None = None,
              progress: ProgressCallback | None = None, pool_by_default: bool = False) -> Iterator[Resources]:
    """The one :class:`Resources` value of a call, built here at the edge (see
    :func:`calibkit._requestapi.open_resources`), its options checked as they are made."""
    options = ResourceOptions(workers=workers, executor=executor, memory_budget=memory_budget,
                              max_batch_tokens=max_batch_tokens)
    with open_resources(options, progress, pool_by_default=pool_by_default) as res:
        yield res


# ---------------------------------------------------------------- sample


@request_api(SampleRequest, resources=())
def sample(request: SampleRequest, resources: Resources) -> CalibrationSet:
    """Draw a calibration set from production logs (JSONL) and write it to ``out``.

    One streaming pass parses each line (broken lines are counted and skipped, or refused with ``strict``),
    redacts personal data and drops duplicate texts; ``size`` texts are then drawn over (length bucket, label,
    topic cluster) strata. The same log, options and seed draw the same texts in the same order.

    Returns:
        The calibration set written: its texts, labels and manifest (the log, the options, the counts).

    Raises:
        UsageError: An option out of range (``clusters`` below 1, ``size`` below 1).
        DataError: The log is missing, holds no usable text, or has broken lines under ``strict``.

    Examples:
        >>> import calibkit as ck
        >>> cs = ck.sample("logs.jsonl", "calibration_sets/logs", size=64, tokenizer="model/")
        >>> len(cs.texts), cs.path.name
        (64, 'logs')
    """
    from calibkit.data.sample_pipeline import sample_log

    not_an_input(request.out_dir, [request.logs, request.tokenizer])
    return sample_log(request, resources.progress)


# ---------------------------------------------------------------- export


@request_api(ExportRequest, resources=())
def export(request: ExportRequest, resources: Resources) -> ExportResult:
    """Export your own model to the model folder every other function reads.

    FP32 ONNX with dynamic batch and sequence axes, the task recorded, its outputs checked against the source's.
    Every option is a field of :class:`~calibkit.requests.export.ExportRequest`.

    Returns:
        The folder written, its model, the task, the inputs and output, and the parity check (None for an
        ONNX source).

    Raises:
        UsageError: A tolerance that is not a positive number, or a task the model cannot serve.
        ModelError: The source is unreadable, has no dynamic axes, or differs from the export past
            ``tolerance``.
        MissingDependencyError: A PyTorch source without the ``export`` extra (torch, onnxscript).

    Examples:
        >>> import calibkit as ck
        >>> ex = ck.export("model/model.onnx", "runs/exported", tokenizer="model/")
        >>> ex.model_path.name, ex.parity is None
        ('model.onnx', True)
    """
    from calibkit.exporter import export_model

    return export_model(request, resources.progress)


# ---------------------------------------------------------------- smooth


@request_api(SmoothRequest, resources=("memory_budget", "max_batch_tokens"))
def smooth(request: SmoothRequest, resources: Resources) -> SmoothResult:
    """SmoothQuant-style migration of activation outliers into the weights, written as a new model folder.

    The smoothed model computes the same FP32 function (checked on calibration texts), so it goes through
    calibrate, build, compare and tune unchanged. Every option is a field of
    :class:`~calibkit.requests.smooth.SmoothRequest`; ``memory_budget`` and ``max_batch_tokens`` bound the
    batches whose activations are measured.

    Returns:
        The smoothed folder, its model, and the choice made for each group of weight MatMuls.

    Raises:
        UsageError: ``alpha`` outside [0, 1], ``batch_size`` below 1 or an unreadable ``memory_budget``.
        CalibrationError: The calibration set is empty.
        ModelError: The model is already smoothed, has no weight MatMul to smooth into, or the smoothed model
            does not compute the same function.

    Examples:
        >>> sm = ck.smooth("model/", cs, "runs/smoothed")
        >>> sm.model_path.name, sm.groups > 0
        ('model.onnx', True)
    """
    from calibkit.calibrate.smoothing import smooth as run_smooth

    not_an_input(request.out, [request.model, request.calibration_set, request.tokenizer])
    return run_smooth(request, resources)


# ---------------------------------------------------------------- calibrate

@request_api(CalibrateRequest)
def calibrate(request: CalibrateRequest, resources: Resources) -> CalibrationResult:
    """Calibrate a model: activation statistics, the method's ranges, and the INT8 Q/DQ model.

    Statistics are collected once per (model, calibration set, tensors, bins) and reused from the statistics
    cache, so another ``method`` on the same set does not run the model again. Every option is a field of
    :class:`~calibkit.requests.calibrate.CalibrateRequest`; ``executor`` (an Executor or a spec: "local",
    "local:N", "dask://host:port") collects the statistics in shards on its workers (None: this process).

    Returns:
        The files written, the calibration table, the quantized and kept nodes, and any warnings about
        ranges that clip softmax or GELU outputs.

    Raises:
        UsageError: An unknown method or target, an option out of range, both or neither of
            ``calibration_set`` and ``from_cache``, or ``out`` the current directory.
        DataError: The calibration set is missing or unreadable.
        ModelError: The model folder is incomplete or its graph cannot be tapped.
        CalibrationError: A range cannot become a scale (empty or non-finite statistics).

    Examples:
        >>> cal = ck.calibrate("model/", cs, "runs/mse", method="mse")
        >>> cal.model_path.name, cal.table.method.value
        ('model.int8.onnx', 'mse')
        >>> ck.calibrate("model/", cs, "runs/minmax", method="minmax").reused_stats
        True
    """
    from calibkit.calibrate.pipeline import calibrate as run_calibration

    not_an_input(request.out_dir, [request.model, request.calibration_set, request.tokenizer, request.from_cache])
    return run_calibration(request, resources)


def histogram(calibration: CalibrationResult | PathLike, tensor: str | None = None) -> ActivationHistogram:
    """One tensor's |x| histogram from a calibration's saved statistics, with the amax every method picks on it.

    Args:
        calibration: A calibration result, its folder or its stats.npz.
        tensor: A tensor name, or text a name contains (the first such tensor, in the table's order); None: the
            first tensor.

    Returns:
        The occupied bins' centres and counts, the bin width, and each method's amax on this tensor.

    Raises:
        UsageError: No statistics there (a calibration built from a cache has none), or no tensor matches.

    Examples:
        >>> h = ck.histogram(cal)  # the first tensor; ck.histogram(cal, "attention") the first one so named
        >>> sorted(m.value for m in h.amax), h.count > 0
        (['entropy', 'minmax', 'mse', 'percentile'], True)
    """
    from calibkit.calibrate.methods import tensor_histogram
    from calibkit.calibrate.pipeline import STATS_FILE, CalibrationResult
    from calibkit.calibrate.stats import StatsStore
    from calibkit.types import MethodParams

    if isinstance(calibration, CalibrationResult):
        if calibration.stats_path is None:
            raise UsageError("this calibration has no statistics (it was built --from-cache)",
                             hint="calibrate on a calibration set to see histograms")
        path, params = calibration.stats_path, calibration.table.params
    else:
        path, params = Path(calibration), MethodParams()
        path = path / STATS_FILE if path.is_dir() else path
    if not path.is_file():
        raise UsageError(f"no statistics at {path}", hint="pass calibrate's output folder or its stats.npz")
    store = StatsStore.load(path)
    names = list(store)
    if not names:
        raise UsageError(f"{path} holds no tensors")
    chosen = names[0] if tensor is None else tensor if tensor in names else next(
        (t for t in names if tensor in t), None)
    if chosen is None:
        raise UsageError(f"no tensor of {path.name} is or contains {tensor!r}",
                         hint=f"names look like {names[0]!r}")
    return tensor_histogram(store[chosen], params)


# ---------------------------------------------------------------- build


@request_api(BuildRequest, resources=())
def build(request: BuildRequest, resources: Resources) -> BuildResult:
    """Build an engine file with its .calibkit.json sidecar (what was built from what, with which versions).

    FP32 and FP16 come from the ONNX model; INT8 from a calibration.json or a Q/DQ model.

    Returns:
        The engine artifact (file and sidecar), every file written, and the nodes quantized.

    Raises:
        UsageError: An unknown precision or backend, or options that do not fit together.
        ModelError: The model is missing or unreadable, or the calibration is of another model.
        MissingDependencyError: A TensorRT build where TensorRT is not installed.

    Examples:
        >>> fp32 = ck.build("model/", "engines/fp32.onnx")
        >>> int8 = ck.build("model/", "engines/int8.onnx", precision="int8", qdq=cal.model_path)
        >>> int8.artifact.precision.value, int8.sidecar.name
        ('int8', 'int8.onnx.calibkit.json')
    """
    from calibkit.building import build as run_build

    return run_build(request, progress=resources.progress)


# ---------------------------------------------------------------- compare


@request_api(CompareRequest, pool_by_default=True)
def compare(request: CompareRequest, resources: Resources) -> Comparison:
    """Engine A (baseline) against engine B: each engine's metrics, B's fidelity to A, per-layer measurements,
    sensitivity and flags, every difference with its paired 95 % interval.

    Every option is a field of :class:`~calibkit.requests.compare.CompareRequest` (``min_agreement`` and
    ``max_drop``, the CI gate, are checked against the result: ``Comparison.gate`` says what it misses);
    ``workers``, ``executor``, ``memory_budget`` and ``max_batch_tokens`` say what the call may use (they run the
    sensitivity variants and bound the layer taps' batches). ``traffic``'s texts outside B's calibration set
    measure B's fidelity to A without labels (``Comparison.traffic``) and are what sensitivity runs on unless the
    eval set has class labels; without an eval set they are the (unlabeled) eval set too. With ``save_outputs``,
    every evaluated text's outputs from each engine are written there (:func:`save_per_text_outputs`), so a flip
    can be reproduced.

    Returns:
        The comparison: per-engine evaluations, agreement with its interval, the layers' verdicts, the
        sensitivity evidence, the findings and the recommendation.

    Raises:
        UsageError: An option out of range, engines of different source models, or no texts to compare on.
        DataError: The eval set is unreadable, or a label is not one of the model's classes.
        ModelError: An engine or its sidecar is missing or unreadable.

    Examples:
        >>> c = ck.compare(fp32.artifact, int8.artifact, "test.jsonl", traffic=None, sensitivity_samples=32)
        >>> len(c.engines), 0.0 <= c.agreement <= 1.0, c.engine_a.accuracy is not None
        (2, True, True)
    """
    from calibkit.evaluate.compare import compare_loaded, resolve_compare

    inputs = resolve_compare(request, resources.progress)
    result = compare_loaded(inputs, request, resources)
    if request.save_outputs is not None:
        rows = inputs.rows
        save_per_text_outputs(result, inputs.eval_set, Path(request.save_outputs),
                              rows=[int(i) for i in rows.indices] if rows is not None else None)
    return result


#: the files of ``compare --save-outputs DIR``
OUTPUTS_JSONL = "outputs.jsonl"
OUTPUTS_NPZ = "outputs.npz"


def save_per_text_outputs(result: Comparison, eval_set: EvalSet, out: Path, *,
                          rows: Sequence[int] | None = None) -> Path:
    """Write each evaluated text's outputs from every engine into the folder ``out`` (atomically):
    outputs.npz holds the raw outputs (``A``, ``B``, ``reference``: one row per text in evaluation order;
    ``<name>_mask``: token masks of token outputs), outputs.jsonl one line per text: ``row`` (its line in the
    eval set), ``text``, ``label`` and, for per-text class scores, each engine's predicted class and whether B
    flipped A's. Re-running one text through both engines reproduces a flip."""
    import json

    import numpy as np

    from calibkit._io import atomic_dir

    per_text = result.per_text
    if per_text is None or not per_text.by_engine:
        raise UsageError("this comparison kept no per-text outputs", hint="compare again with save_outputs=DIR")
    arrays = {name: np.asarray(v) for name, v in per_text.by_engine.items()}
    n = len(eval_set)
    if any(len(v) != n for v in arrays.values()):
        raise UsageError(f"per-text outputs cover {sorted({len(v) for v in arrays.values()})} texts, the eval set "
                         f"{n}", hint="pass the eval set rows the comparison was run on")
    row_of = list(rows) if rows is not None else list(range(n))
    decide = {k: v.argmax(axis=-1) for k, v in arrays.items() if v.ndim == 2 and v.shape[-1] > 1}
    lines = []
    for i in range(n):
        line: dict[str, Any] = {"row": row_of[i], "text": eval_set.texts[i]}
        if eval_set.has_labels:
            line["label"] = eval_set.labels[i]
        for name, d in decide.items():
            line[f"{name}_class"] = int(d[i])
        if "A" in decide and "B" in decide:
            line["flipped"] = bool(decide["A"][i] != decide["B"][i])
        lines.append(json.dumps(line, ensure_ascii=True))  # escapes keep lone surrogates valid UTF-8
    payload: dict[str, Any] = {**arrays, **{f"{k}_mask": np.asarray(v) for k, v in per_text.masks.items()}}
    with atomic_dir(out, what="compare --save-outputs", legacy_names=(OUTPUTS_JSONL, OUTPUTS_NPZ)) as tmp:
        np.savez_compressed(tmp / OUTPUTS_NPZ, **payload)
        (tmp / OUTPUTS_JSONL).write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return out


def missed_targets(result: Comparison, *, min_agreement: float | None = None,
                   max_drop: float | None = None) -> tuple[str, ...]:
    """What a comparison misses of the stated targets (empty: all met), one line each: ``min_agreement``, the
    percentage of A's predictions B keeps (the point estimate, as printed); ``max_drop``, the most accuracy
    points B may lose against A (needs labels). A compare request's own targets are applied by compare itself
    (``Comparison.gate``); this checks a comparison against others."""
    from calibkit.evaluate.decisions import missed_targets as missed

    check_targets(min_agreement=min_agreement, max_drop=max_drop)
    return missed(result, min_agreement=min_agreement, max_drop=max_drop)


def deciding_digits(value: float, limit: float, digits: int = 2) -> tuple[str, str]:
    """``value`` printed with the fewest decimals (at least ``digits``) that tell it from ``limit``, and
    ``limit`` as given or at those decimals (``evaluate.decisions.deciding_digits``)."""
    from calibkit.evaluate.decisions import deciding_digits as digits_of

    return digits_of(value, limit, digits)


# ---------------------------------------------------------------- tune


@request_api(TuneRequest)
def tune(request: TuneRequest, resources: Resources) -> TuneRun:
    """The mixed-precision plan with the most INT8 work that keeps accuracy within ``max_drop`` points of FP32
    (and, with ``min_agreement``, that percentage of FP32's predictions), confirmed on a holdout split.

    Embedding and token-classification models are tuned on fidelity alone (``min_agreement``: the share of
    texts whose nearest neighbour in the FP32 index stays, or of tokens whose tag stays; ``min_cosine``: the
    mean cosine to FP32's vectors). Every option is a field of :class:`~calibkit.requests.tune.TuneRequest`;
    ``workers`` and ``executor`` say where the evaluations run (default: a local pool of one process per usable
    CPU; a given executor also shards the statistics). ``traffic``'s texts, not in the calibration set, are split
    like the eval set; agreement with FP32 is then judged on them and the eval set carries accuracy alone.

    Returns:
        The files written and the typed result (``.result``): the target, the candidates measured, the final
        plan and its holdout verdict. An interrupted run resumes from its ledger.

    Raises:
        UsageError: An unknown method, target or decision rule, an option out of range, or no texts to judge
            plans on.
        DataError: The eval set or the calibration set is unreadable, or a label is not one of the model's
            classes.
        ModelError: The model folder is incomplete or unreadable.

    Examples:
        >>> run = ck.tune("model/", cs, "test.jsonl", "runs/tune", max_drop=5.0, traffic=None, smooth=False,
        ...               max_evaluations=4, sensitivity_samples=32)
        >>> run.plan_path.name, 0.0 <= run.result.final.int8_flops_fraction <= 1.0
        ('plan.json', True)
    """
    from calibkit.evaluate.tune import run_tune

    return run_tune(request, replace(resources, writer=_ReportWriter()))


class _ReportWriter:
    """The report layer's writer of tune.json and the report folder, for the tune pipeline (below it)."""

    def document(self, result: TuneResult | PlanDocument, path: Path) -> None:
        from calibkit._io import write_json
        from calibkit.results.codec import to_document

        write_json(path, to_document(result))

    def report(self, result: TuneResult, folder: Path) -> None:
        from calibkit.report.render import render_report

        render_report(result, folder)


# ---------------------------------------------------------------- reports


def load_report(path: PathLike) -> Comparison | TuneResult:
    """A compare or tune JSON document (report.json, tune.json, compare --json) as its typed result.

    Args:
        path: The document.

    Returns:
        The ``Comparison`` or ``TuneResult`` it holds, equal to the one it was written from.

    Raises:
        DataError: The file is missing, not JSON, or not a calibkit document of a known format.

    Examples:
        >>> ck.load_report("reports/fp32-vs-int8/report.json") == c
        True
    """
    from calibkit.results.codec import load_result

    check_paths({"path": path})
    return load_result(Path(path))


def render_report(result: Comparison | TuneResult, out: PathLike) -> ReportPaths:
    """Write a result as a report folder (report.json, report.md, report.html, plots/), atomically.

    Args:
        result: A comparison or a tune result.
        out: The folder to write.

    Returns:
        The paths written: report.json, report.md, report.html and the plots.

    Raises:
        UsageError: ``out`` exists and holds something other than a previous report.

    Examples:
        >>> folder = ck.render_report(c, "reports/fp32-vs-int8")
        >>> sorted(p.name for p in Path("reports/fp32-vs-int8").glob("report.*"))
        ['report.html', 'report.json', 'report.md']
    """
    from calibkit.report.render import render_report as _render

    check_paths({"out": out})

    return _render(result, Path(out))


# ---------------------------------------------------------------- deploy


@request_api(DeployRequest, resources=())
def deploy(request: DeployRequest, resources: Resources) -> DeployResult:
    """Write a Triton Inference Server model repository for a tune or calibrate folder or an engine, shaped by
    the traffic it will serve, and measure the model it writes (ONNX Runtime) against FP32 on that traffic.

    The INT8 layout shipped is the one ``source`` was measured in (tune's plan, the calibration's target, the
    engine's own) unless ``layout`` names another, which is shipped with a warning in the result, deploy.json
    and the README. Every option is a field of :class:`~calibkit.requests.deploy.DeployRequest`.

    Returns:
        The typed ``DeployResult`` (deploy.json, field by field): every choice, the layout shipped and the one
        measured, and ``measurement``: agreement with FP32 with its 95 % interval and latency against FP32.

    Raises:
        UsageError: An option out of range, a ``source`` that is not a calibkit output, or ``out`` that is an
            input or holds files calibkit did not write.
        DataError: The traffic log is missing or holds no usable text.
        ModelError: The model has fixed batch or sequence axes, or its files changed since they were written.

    Examples:
        >>> served = ck.deploy("runs/tune", "serving", measure_texts=100)
        >>> served.layout.shipped == served.layout.measured, served.measurement.texts <= 100
        (True, True)
        >>> m = served.measurement
        >>> m.agreement_ci.low <= m.agreement <= m.agreement_ci.high, served.model_path.name
        (True, 'model.onnx')
    """
    from calibkit.deploy.pipeline import deploy as run_deploy

    return run_deploy(request, resources)
