"""The model deploy writes, measured against FP32 on the traffic it will serve, in the same run.

Both models run in this process through ONNX Runtime with the same session options (all graph optimizations, as
Triton's ONNX Runtime backend runs them; the same intra-op threads), on the same texts in the same batches
(sorted by length, so each batch pads little, as bucketed requests do). Agreement is each task's per-text
fidelity (:mod:`calibkit.evidence.rowfidelity`) with its 95 % interval (:mod:`calibkit.evidence.intervals`);
latency is the per-batch wall time, its median per model and the median of the per-batch ratios.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calibkit.data.modeldir import ModelDir
from calibkit.progress import ProgressCallback
from calibkit.results.documents import ServedLatency, ServedMeasurement
from calibkit.results.runs import Range, finite


@dataclass(frozen=True)
class MeasureTexts:
    """The texts to measure on: a seeded sample of the traffic, calibration texts left out."""

    texts: tuple[str, ...]
    left_out: int
    seed: int


def pick_texts(traffic: Sequence[str], calibration: Sequence[str], size: int, seed: int) -> MeasureTexts:
    """Up to ``size`` traffic texts drawn without replacement (seeded), none of them a calibration text: the
    ranges were computed on those, so agreement there would flatter the model."""
    seen = set(calibration)
    pool = [t for t in traffic if t not in seen]
    rng = np.random.default_rng(seed)
    n = min(size, len(pool))
    pick = np.sort(rng.choice(len(pool), size=n, replace=False)) if n else np.zeros(0, dtype=np.int64)
    return MeasureTexts(tuple(pool[i] for i in pick), len(traffic) - len(pool), seed)


class _Timed:
    """A runner whose every ``infer`` is timed (milliseconds, in call order)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.ms: list[float] = []

    @property
    def input_specs(self) -> Any:
        return self.runner.input_specs

    @property
    def output_names(self) -> Any:
        return self.runner.output_names

    def infer(self, feeds: Any) -> Any:
        start = time.perf_counter()
        out = self.runner.infer(feeds)
        self.ms.append(1e3 * (time.perf_counter() - start))
        return out


def _run(path: Path, task: Any, md: ModelDir, texts: Sequence[str], *, threads: int | None, batch: int,
         what: str, progress: ProgressCallback | None, make_runner: Any) -> tuple[Any, list[float]]:
    from calibkit.data.tokenizer import TextTokenizer

    tok = TextTokenizer(md.tokenizer_path, max_length=md.max_length)
    with make_runner(path, threads=threads, name=what) as runner:
        task.predict(runner, tok, list(texts[:batch]), batch_size=batch)  # warm-up, untimed
        timed = _Timed(runner)
        out = task.predict(timed, tok, texts, batch_size=batch, progress=progress, task=what)  # type: ignore[arg-type]
    return out, timed.ms


def measure_served(fp32: Path, served: Path, md: ModelDir, picked: MeasureTexts, *, threads: int | None,
                   batch: int, progress: ProgressCallback, make_runner: Any) -> ServedMeasurement:
    """``served`` against ``fp32`` on ``picked`` texts (at least one), each run by a runner from ``make_runner``
    (the run's :class:`~calibkit.resources.RunnerFactory`)."""
    from calibkit.evaluate.tasks import choose_task, model_outputs
    from calibkit.graph import load_model

    task = choose_task(model_outputs(load_model(fp32, load_external_data=False)),
                       {"id2label": {str(k): v for k, v in md.id2label.items()}})
    texts = list(picked.texts)
    served_out, served_ms = _run(served, task, md, texts, threads=threads, batch=batch,
                                 what="measuring the served model", progress=progress, make_runner=make_runner)
    ref_out, ref_ms = _run(fp32, task, md, texts, threads=threads, batch=batch, what="measuring FP32",
                           progress=progress, make_runner=make_runner)
    agreement, interval, cosine = _agreement(task.kind.value, ref_out, served_out)
    ratios = np.asarray(ref_ms) / np.maximum(np.asarray(served_ms), 1e-9)
    latency = ServedLatency(batch_size=batch, batches=len(ref_ms), threads=threads,
                            fp32_median_ms=float(np.median(ref_ms)), served_median_ms=float(np.median(served_ms)),
                            speedup=float(np.median(ratios)))
    return ServedMeasurement(texts=len(texts), task=task.kind.value, agreement=agreement, agreement_ci=interval,
                             latency=latency, seed=picked.seed, calibration_texts_left_out=picked.left_out,
                             cosine=cosine)


def _agreement(kind: str, ref: Any, cand: Any) -> tuple[float | None, Range | None, float | None]:
    """Per-text agreement with FP32 (the task's fidelity) and its 95 % interval: Wilson's for 0/1 outcomes, the
    normal one for token shares; None for tasks without a per-text fidelity (regression, multi-label)."""
    from calibkit.evidence.intervals import mean_interval, proportion
    from calibkit.evidence.rowfidelity import ROW_TASKS, TOKEN_CLASSIFICATION, reference_tags, row_fidelity

    if kind not in ROW_TASKS:
        return None, None, None
    reference = reference_tags(ref.values, ref.mask) if kind == TOKEN_CLASSIFICATION else ref.values
    rows = row_fidelity(kind, reference, cand.values)
    a = rows.agreement
    binary = bool(np.all((a == 0.0) | (a == 1.0)))
    interval = proportion(a == 1.0) if binary else mean_interval(a)
    cosine = finite(rows.cosine.mean()) if rows.cosine is not None and len(rows.cosine) else None
    return float(a.mean()), Range.of(interval), cosine
