"""What a request names, loaded: the model folder, the calibration set, the engines, the eval rows, the traffic.

``resolve_compare`` and ``resolve_tune`` turn a validated request into the loaded inputs its pipeline runs on,
before any inference: outputs apart from inputs (by provenance), labels checked against the model over the whole
eval file, the ``--limit`` rows drawn, the eval set's texts left out of the traffic before its draw.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calibkit.data.calibset import CalibrationSet, load_calibration_set
from calibkit.data.evalset import EvalSet, load_eval_set
from calibkit.data.modeldir import ModelDir
from calibkit.enginefiles.artifact import EngineArtifact
from calibkit.errors import UsageError
from calibkit.evaluate.traffic import (
    TrafficEvidence,
    TrafficOptions,
    draw_default_traffic,
    draw_traffic,
    shortfall_warning,
)
from calibkit.evidence.subsets import EvalSubset, stratified_subset
from calibkit.progress import ProgressCallback
from calibkit.requests.checks import TRAFFIC_SIZE, check_numbers
from calibkit.requests.traffic import Traffic
from calibkit.types import PathLike, check_seed

if TYPE_CHECKING:  # pragma: no cover - types only
    import onnx

    from calibkit.requests.tune import TuneRequest
    from calibkit.tasks.base import Task


def model_dir(model: PathLike | ModelDir, tokenizer: PathLike | None = None) -> ModelDir:
    if isinstance(model, ModelDir):
        return model
    return ModelDir.resolve(Path(model), Path(tokenizer) if tokenizer else None)


def calibration_set(cset: PathLike | CalibrationSet) -> CalibrationSet:
    return cset if isinstance(cset, CalibrationSet) else load_calibration_set(Path(cset))


def artifact(engine: PathLike | EngineArtifact) -> EngineArtifact:
    return engine if isinstance(engine, EngineArtifact) else EngineArtifact.load(Path(engine))


def not_an_input(out: PathLike | None, inputs: Sequence[object], option: str = "out") -> None:
    """Before any work: ``out`` is none of the inputs, nor anything their documents name (calibkit.provenance)."""
    from calibkit.outdirs import check_not_input

    if out is not None:
        check_not_input(out, inputs, option=option)


def load_evidence(eval_set: PathLike | EvalSet, *, task: Task | None = None, limit: int | None = None, seed: int = 0,
                  text_column: str | None = None, label_column: str | None = None, split: str | None = None
                  ) -> tuple[EvalSet, Any]:
    """The eval set (a file or a loaded :class:`EvalSet`), its labels checked against ``task`` over the WHOLE
    file (a bad label is the file's fault whichever rows are drawn), then ``limit`` rows drawn (stratified,
    seeded). Returns (rows to evaluate, the ``EvalSubset`` they are of the file, or None for all)."""
    if isinstance(eval_set, EvalSet):
        full = eval_set
    else:
        label_sets = task is not None and task.label_sets
        full = load_eval_set(Path(eval_set), text_column=text_column, label_column=label_column, split=split,
                             label_sets=label_sets)
    if task is not None and not task.word_tags:
        task.gold(full)  # validation only; token tags are aligned (and checked) where the tokenizer is at hand
    return limit_eval_set(full, limit, seed)


def limit_eval_set(eval_set: EvalSet, limit: int | None, seed: int = 0) -> tuple[EvalSet, EvalSubset | None]:
    """``--limit``: a stratified random subset of ``limit`` rows (the set itself, and None, when it is smaller)."""
    if limit is None or limit >= len(eval_set):
        return eval_set, None
    if not eval_set.has_labels:  # an unlabeled set: one stratum
        sub = stratified_subset(eval_set.texts, [""] * len(eval_set), limit, seed)
        return eval_set.take(sub.indices), sub  # with its word labels, where it has them
    sub = stratified_subset(eval_set.texts, eval_set.labels, limit, seed)
    return eval_set.take(sub.indices), sub


def engine_calibration_set(*engines: EngineArtifact) -> CalibrationSet | None:
    """The calibration set an INT8 engine was calibrated on (its sidecar's calibration.json names it), when it
    is still there: its texts are excluded from traffic evidence, and its manifest names the default log."""
    from calibkit._io import read_json
    from calibkit.errors import CalibkitError
    from calibkit.provenance import document_path

    for e in engines:
        if not e.calibration_json or not Path(e.calibration_json).is_file():
            continue
        try:
            doc = read_json(Path(e.calibration_json))
            cs = doc.get("calibration_set") if isinstance(doc, dict) else None
            path = document_path(e.calibration_json, cs.get("path") if isinstance(cs, dict) else cs,
                                 doc if isinstance(doc, dict) else {})
            if path is not None and path.is_dir():
                return load_calibration_set(path)
        except (CalibkitError, OSError, ValueError):
            continue
    return None


def model_task(md: ModelDir, task: str | None = None, graph: onnx.ModelProto | None = None) -> Task | None:
    """The task of a model folder (``task`` forces one), from its outputs and config.json's id2label; None for
    a model without class names and no ``task`` (tune then finds it from the outputs and judges fidelity).
    ``graph``: the model, when the caller has loaded it (else its graph is read here)."""
    from calibkit.graph import load_model
    from calibkit.tasks import choose_task, model_outputs

    cfg = md.id2label
    if not cfg and task is None:
        return None
    graph = graph if graph is not None else load_model(md.onnx_path, load_external_data=False)
    return choose_task(model_outputs(graph), {"id2label": {str(k): v for k, v in cfg.items()}}, task)


def load_traffic(traffic: Traffic | PathLike | TrafficEvidence | None, calibration_set: CalibrationSet | None, *,
                 size: int = 4000, text_field: str | None = None, seed: int = 0, model: ModelDir | None = None,
                 progress: ProgressCallback | None = None, exclude: Sequence[str] = (),
                 tokenizer: PathLike | None = None, holdout_fraction: float | None = None
                 ) -> TrafficEvidence | None:
    """Traffic evidence from ``traffic`` (read by :meth:`Traffic.parse`): None (none), drawn evidence (as it
    is), ``Traffic.AUTO`` (the calibration
    set's own log, named in its manifest; refused when it is gone or changed), ``Traffic.DEFAULT`` (that log when it
    is still there unchanged, else none, with a warning when the manifest names one) or a log path.
    Calibration texts and ``exclude`` (the eval set's texts: traffic is evidence independent of it) are
    excluded before the draw, also where they differ only in what the model's tokenizer (``model``'s, or
    ``tokenizer``) does not see; a log that holds nothing else is refused. Fewer texts drawn than ``size`` are
    warned about on the ``calibkit`` logger, with why and what it costs (``holdout_fraction``: tune's holdout,
    :func:`calibkit.evaluate.traffic.shortfall_warning`)."""
    drawn = _draw(traffic, calibration_set, size=size, text_field=text_field, seed=seed, model=model,
                  progress=progress, exclude=exclude, tokenizer=tokenizer)
    fresh = drawn is not None and not isinstance(traffic, TrafficEvidence)  # evidence given was warned about
    short = shortfall_warning(drawn, holdout_fraction) if fresh and drawn is not None else None
    if short is not None:
        logging.getLogger("calibkit.evaluate.traffic").warning("%s", short)
    return drawn


def _draw(traffic: Traffic | PathLike | TrafficEvidence | None, calibration_set: CalibrationSet | None, *,
          size: int, text_field: str | None, seed: int, model: ModelDir | None, progress: ProgressCallback | None,
          exclude: Sequence[str], tokenizer: PathLike | None) -> TrafficEvidence | None:
    """:func:`load_traffic`'s draw."""
    traffic = Traffic.parse(traffic)
    if traffic is None or isinstance(traffic, TrafficEvidence):
        return traffic
    check_numbers({"--traffic-size": (size, TRAFFIC_SIZE)})
    check_seed(seed)
    tok = model.tokenizer_path if model is not None else Path(tokenizer) if tokenizer is not None else None
    opts = TrafficOptions(size=size, seed=seed, text_field=text_field, tokenizer=tok,
                          max_length=model.max_length if model is not None else None)
    if traffic is Traffic.DEFAULT:
        return default_traffic(calibration_set, opts, progress, exclude)
    if traffic is Traffic.AUTO:
        if calibration_set is None:
            raise UsageError("--traffic auto needs a calibration set whose manifest names its log",
                             hint="pass the log itself: --traffic requests.jsonl")
        return draw_default_traffic(calibration_set, opts, progress, exclude_texts=exclude)
    return draw_traffic(traffic, opts, calibration_set=calibration_set, progress=progress, exclude_texts=exclude)


def default_traffic(calibration_set: CalibrationSet | None, opts: TrafficOptions, progress: ProgressCallback | None,
                    exclude: Sequence[str]) -> TrafficEvidence | None:
    """The calibration set's own log when it is still there unchanged, else None (with a warning when its
    manifest names a log that is gone or changed)."""
    from calibkit.errors import DataError
    from calibkit.evaluate.traffic import default_traffic_log, draw_default_traffic

    if calibration_set is None:
        return None
    try:
        default_traffic_log(calibration_set)
    except DataError as exc:
        m = calibration_set.manifest
        if m is not None and m.sample is not None:  # it names a log that is gone or changed
            logging.getLogger("calibkit").warning("no traffic evidence: %s (%s)", exc.message, exc.hint)
        return None
    return draw_default_traffic(calibration_set, opts, progress, exclude_texts=exclude)


@dataclass(frozen=True, eq=False)
class TuneInputs:
    """What a tune request names, loaded: ``eval_set`` holds the rows to judge on (empty when traffic alone
    gives the texts), ``rows`` which rows of the eval file they are (None: all)."""

    model: ModelDir
    graph: onnx.ModelProto  # the FP32 model, weights included, loaded once for the run
    calibration_set: CalibrationSet
    eval_set: EvalSet
    rows: EvalSubset | None
    traffic: TrafficEvidence | None
    out: Path
    report: Path | None


def resolve_tune(request: TuneRequest, progress: ProgressCallback | None = None) -> TuneInputs:
    """The inputs of a validated tune request, loaded in the order that keeps --traffic-size: the eval set (its
    labels checked against the model's classes over the whole file, then --limit drawn) first, so its texts are
    left out of the traffic before the draw."""
    md = model_dir(request.model, request.tokenizer)
    dest = Path(request.out) if request.out is not None else Path("runs") / f"tune-{default_name(md)}"
    traffic = None if isinstance(request.traffic, Traffic) else request.traffic
    for written, option in ((dest, "out"), (request.report, "report")):
        not_an_input(written, [md.onnx_path, md.tokenizer_path, request.calibration_set, request.eval_set, traffic],
                     option)
    from calibkit.graph import check_float_source, load_model

    graph = check_float_source(load_model(md.onnx_path), md.onnx_path)  # the one load of the run's FP32 model
    kind = model_task(md, request.task, graph)
    cset = calibration_set(request.calibration_set)
    loaded = (load_evidence(request.eval_set, task=kind, limit=request.limit, seed=request.seed)
              if request.eval_set is not None else None)
    drawn = load_traffic(request.traffic, cset, size=request.traffic_size, text_field=request.traffic_text_field,
                         seed=request.seed, model=md, progress=progress,
                         exclude=loaded[0].texts if loaded is not None else (),
                         holdout_fraction=request.holdout_fraction)
    if loaded is None:
        if drawn is None or not len(drawn):
            raise UsageError("tune needs texts to judge plans on: an eval set, or traffic",
                             hint="pass --eval-set test.jsonl, or --traffic LOG (or 'auto': the calibration set's "
                                  "own log)")
        ev, rows = EvalSet(Path(drawn.source.path), (), ()), None
    else:
        ev, rows = loaded
    return TuneInputs(md, graph, cset, ev, rows, drawn, dest,
                      Path(request.report) if request.report is not None else None)


def default_name(md: ModelDir) -> str:
    """The name of a model in default output folders: its folder's (an .onnx file's folder), else its stem."""
    return md.onnx_path.parent.name or md.onnx_path.stem
