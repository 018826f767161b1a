"""Sensitivity and tuning work units: a frozen, picklable :class:`SensitivityJob` (one variant of the INT8 model
on some texts) and its :class:`SensitivityResult`. :func:`run_sensitivity_job` is pure: everything it needs is in
the job. ``evaluate.sensitivity`` schedules them, ``evaluate.shipping`` packs them for remote executors; both
import this module and neither imports the other's internals.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calibkit._io import read_json
from calibkit.errors import CalibkitError, CalibrationError
from calibkit.evaluate.metrics import output_error
from calibkit.types import CalibrationTable

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
    from calibkit.quantize.tablefile import load_calibration_json

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
    from calibkit.engines.registry import model_runner
    from calibkit.evaluate.predict import predict_logits

    start = time.perf_counter()
    try:
        model = build_variant(job.source_model, job.calibration_json, job.keep_nodes, job.target)
        tok = TextTokenizer(job.tokenizer, max_length=job.max_length)
        with model_runner(model, threads=job.threads, name=f"{job.mode}:{job.node}", layout=job.target) as runner:
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
