"""The model deploy writes, measured against FP32 on the traffic it will serve, in the same run.

Both models run in this process through ONNX Runtime with the same session options (all graph optimizations, as
Triton's ONNX Runtime backend runs them; the same intra-op threads), on the same texts in the same batches
(sorted by length, so each batch pads little, as bucketed requests do). Agreement is each task's per-text
fidelity (:mod:`calibkit.evidence.rowfidelity`) with its 95 % interval (:mod:`calibkit.evidence.intervals`);
speed is measured as a benchmark is (:mod:`calibkit.evaluate.speed`): the same batches for both models at batch 1
and at the measurement's batch size, interleaved rounds, the ratio of medians with the spread of single rounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from calibkit.data.modeldir import ModelDir
from calibkit.enginefiles.registry import ModelRunnerFactory
from calibkit.progress import ProgressCallback
from calibkit.results.documents import ServedLatency, ServedMeasurement
from calibkit.results.runs import Range, finite

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.data.tokenizer import TextTokenizer

#: texts per batch of the agreement pass (batches padded to their longest text, so memory stays small)
AGREEMENT_BATCH = 8

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


def _predict(path: Path, task: Any, tok: TextTokenizer, texts: Sequence[str], *, threads: int | None, batch: int,
             what: str, progress: ProgressCallback | None, make_runner: ModelRunnerFactory) -> Any:
    with make_runner(path, threads=threads, name=what) as runner:
        return task.predict(runner, tok, texts, batch_size=batch, progress=progress, task=what)


def measure_served(fp32: Path, served: Path, md: ModelDir, picked: MeasureTexts, *, threads: int | None,
                   batch: int, progress: ProgressCallback, make_runner: ModelRunnerFactory,
                   bucket: tuple[int, int] | None = None) -> ServedMeasurement:
    """``served`` against ``fp32`` on ``picked`` texts (at least one), each run by a runner from ``make_runner``
    (the run's :class:`~calibkit.resources.RunnerFactory`): agreement on every picked text (in batches of
    :data:`AGREEMENT_BATCH`), speed at batch 1 and at ``batch`` (:mod:`calibkit.evaluate.speed`: interleaved
    rounds, the ratio of medians), its batches drawn from the texts of ``bucket`` tokens (shortest, longest)
    when given: the requests a server batches that many of."""
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.evaluate.speed import measure_speed, text_batches
    from calibkit.graph import load_model, model_input_names
    from calibkit.tasks import choose_task, model_outputs

    proto = load_model(fp32, load_external_data=False)
    task = choose_task(model_outputs(proto), {"id2label": {str(k): v for k, v in md.id2label.items()}})
    tok = TextTokenizer(md.tokenizer_path, max_length=md.max_length)
    texts = list(picked.texts)
    served_out = _predict(served, task, tok, texts, threads=threads, batch=AGREEMENT_BATCH,
                          what="measuring the served model", progress=progress, make_runner=make_runner)
    ref_out = _predict(fp32, task, tok, texts, threads=threads, batch=AGREEMENT_BATCH, what="measuring FP32",
                       progress=progress, make_runner=make_runner)
    agreement, interval, cosine = _agreement(task, ref_out, served_out)
    sizes = tuple(sorted({1, batch}))
    within = {batch: bucket} if bucket is not None and batch > 1 else None
    speed = measure_speed({"FP32": fp32, "served": served}, "FP32",
                          text_batches(tok, model_input_names(proto), texts, seed=picked.seed, batch_sizes=sizes,
                                       within=within),
                          make_runner=make_runner, threads=threads, progress=progress)["served"]
    at = speed.at_batch(batch) or speed.slowest
    latency = ServedLatency(batch_size=at.batch_size, batches=at.batches, threads=threads,
                            fp32_median_ms=at.reference_ms, served_median_ms=at.model_ms, speedup=at.speedup,
                            shortest=bucket[0] if within and bucket else None,
                            longest=bucket[1] if within and bucket else None)
    return ServedMeasurement(texts=len(texts), task=task.kind, agreement=agreement, agreement_ci=interval,
                             latency=latency, seed=picked.seed, calibration_texts_left_out=picked.left_out,
                             cosine=cosine, speed=speed, agreement_batch=AGREEMENT_BATCH)


def _agreement(task: Any, ref: Any, cand: Any) -> tuple[float | None, Range | None, float | None]:
    """Per-text agreement with FP32 (the task's fidelity) and its 95 % interval: Wilson's for 0/1 outcomes, the
    normal one for token shares; None for tasks without a per-text fidelity (regression, multi-label)."""
    from calibkit.evidence.intervals import mean_interval, proportion

    if not task.per_text:
        return None, None, None
    rows = task.row_fidelity(task.row_reference(ref.values, ref.mask), cand.values)
    a = rows.agreement
    binary = bool(np.all((a == 0.0) | (a == 1.0)))
    interval = proportion(a == 1.0) if binary else mean_interval(a)
    cosine = finite(rows.cosine.mean()) if rows.cosine is not None and len(rows.cosine) else None
    return float(a.mean()), Range.of(interval), cosine
