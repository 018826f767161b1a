"""Sensitivity and tuning work units: a frozen, picklable :class:`SensitivityJob` (one variant of the INT8 model
on some texts) and its :class:`SensitivityResult`. :func:`run_sensitivity_job` is pure: everything it needs is in
the job. ``evaluate.sensitivity`` schedules them, ``evaluate.shipping`` packs them for remote executors; both
import this module and neither imports the other's internals.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from calibkit._io import read_json
from calibkit.errors import CalibkitError, CalibrationError
from calibkit.tasks import task_class
from calibkit.types import CalibrationTable

ONLY_THIS = "only_this_int8"
ALL_BUT_THIS = "all_but_this"
ALL_INT8 = "all_int8"


@dataclass(frozen=True)
class SensitivityJob:
    """Build one variant (``keep_nodes`` stay in higher precision, every other placed node is INT8), run it
    on ``texts`` and score it against ``labels`` and the reference, per text (``evidence.rowfidelity``).

    ``reference_logits``: what the reference gave for ``texts`` in ``task``'s terms: logits per text
    (classification), the vector per text (embedding, ``pooling`` as the task pools), or the tag id per token
    position with ``rowfidelity.NO_TAG`` past the text (token classification); a nested tuple or an array.
    ``neighbour_index`` / ``index_rows`` (embedding): the FP32 vectors neighbours are looked up among, and each
    text's own row there (-1: not in it); without them the job's own reference vectors are the index."""

    source_model: str
    calibration_json: str
    tokenizer: str
    texts: tuple[str, ...]
    labels: tuple[int, ...]
    reference_logits: np.ndarray
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
    task: str = "classification"  # a calibkit.tasks kind with per-text fidelity
    pooling: str | None = None
    neighbour_index: np.ndarray | None = None
    index_rows: tuple[int, ...] | None = None


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
    flip_rate: float = float("nan")  # 1 - mean agreement: the share of examples whose output changed
    predictions: tuple[int, ...] = ()  # argmax per example, in the order of the job's texts (classification)
    # per example, in the order of the job's texts (evidence.rowfidelity): agreement with the reference in
    # [0, 1] for every task, cosine to the reference for embeddings
    agreement_values: tuple[float, ...] = ()
    cosine_values: tuple[float, ...] = ()
    cpu_seconds: float = 0.0  # CPU time of the process(es) that ran it, every thread (0: not measured)

    @property
    def mean_cosine(self) -> float:
        return float(np.mean(self.cosine_values)) if self.cosine_values else float("nan")

    def correct(self, labels: np.ndarray) -> np.ndarray:
        return np.asarray(self.predictions, dtype=np.int64) == np.asarray(labels, dtype=np.int64)

    def flips(self, reference_predictions: np.ndarray) -> np.ndarray:
        return np.asarray(self.predictions, dtype=np.int64) != np.asarray(reference_predictions, dtype=np.int64)


def load_calibration_table(path: str | Path) -> CalibrationTable:
    """The CalibrationTable of a calibration.json (calibkit-calibration/1), or of a bare table document."""
    from calibkit.quantize.tablefile import load_calibration_json

    p = Path(path)
    if p.is_file():
        d = read_json(p)
        if isinstance(d, dict) and "ranges" in d and "format" not in d:
            return _bare_table(p, d)
    return load_calibration_json(p).table


def _bare_table(p: Path, d: dict[str, object]) -> CalibrationTable:
    """A bare table document (what tune writes for each candidate table), checked as calibration.json's table
    is: usable ranges, extremes consistent with their amax."""
    from calibkit.quantize.rangecheck import check_extremes, check_ranges

    hint = "re-run `calibkit tune` or `calibkit calibrate` to write the table again (calibkit never writes these)"
    try:
        ranges = d["ranges"]
        if not isinstance(ranges, list) or not all(isinstance(r, dict) for r in ranges):
            raise TypeError("ranges is not a list of objects")
        check_ranges(((str(r.get("tensor")), r.get("amax")) for r in ranges), source=str(p), hint=hint)
        table = CalibrationTable.from_dict(d)
    except CalibrationError:
        raise
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise CalibrationError(f"{p} is not a calibkit calibration table ({exc})", hint=hint) from exc
    check_extremes(((r.tensor, r.amax, r.observed_min, r.observed_max) for r in table.ranges), source=str(p),
                   stats=None, hint=hint)
    return table


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
    from calibkit.enginefiles.registry import model_runner
    from calibkit.evaluate.predict import predict_outputs

    start, cpu = time.perf_counter(), time.process_time()
    try:
        model = build_variant(job.source_model, job.calibration_json, job.keep_nodes, job.target)
        tok = TextTokenizer(job.tokenizer, max_length=job.max_length)
        with model_runner(model, threads=job.threads, name=f"{job.mode}:{job.node}", layout=job.target) as runner:
            out = predict_outputs(runner, tok, job.texts, batch_size=job.batch_size, output_name=job.output_name,
                                  pooling=job.pooling if task_class(job.task).pools else None).values
    except CalibkitError as exc:
        return SensitivityResult(job.mode, job.node, float("nan"), float("nan"), float("nan"),
                                 time.perf_counter() - start, error=exc.message, error_hint=exc.hint)
    return replace(score_outputs(job, out, time.perf_counter() - start), cpu_seconds=time.process_time() - cpu)


def score_outputs(job: SensitivityJob, outputs: np.ndarray, seconds: float) -> SensitivityResult:
    """A variant's ``outputs`` for ``job.texts`` against the job's reference and labels."""
    ref = np.asarray(job.reference_logits, dtype=np.float64)
    index = None if job.neighbour_index is None else np.asarray(job.neighbour_index, dtype=np.float64)
    rows = None if job.index_rows is None else np.asarray(job.index_rows, dtype=np.int64)
    kind = task_class(job.task)
    fid = kind.row_fidelity(ref, outputs, index=index, index_rows=rows)
    agree = fid.agreement
    flip = float(1.0 - agree.mean()) if len(agree) else float("nan")
    acc = float("nan")
    if kind.classifies:
        pred = fid.predictions if fid.predictions is not None else np.zeros(0, dtype=np.int64)
        if len(job.labels) == len(pred):
            acc = float(np.mean(pred == np.asarray(job.labels))) if len(pred) else float("nan")
    mse, kl = kind.variant_error(ref, outputs)
    return SensitivityResult(
        job.mode, job.node, acc, mse, kl, seconds, flip_rate=flip,
        predictions=tuple(int(v) for v in fid.predictions) if fid.predictions is not None else (),
        agreement_values=tuple(float(v) for v in agree),
        cosine_values=tuple(float(v) for v in fid.cosine) if fid.cosine is not None else (),
    )
