"""What a tuned plan serves as on ONNX Runtime: its model timed beside FP32, and its arithmetic held against the
arithmetic tune certified.

Tune judges plans as exact Q/DQ arithmetic (the switchboard, graph optimizations off); the model a server runs
is the same Q/DQ model with every graph optimization, where ONNX Runtime fuses each pair into its integer
kernels (``MatMulIntegerToFloat``: int32 accumulation, then one scale). The two differ in rounding, so a text
near FP32's decision boundary can fall either way. :func:`served_check` runs the served model on holdout texts
and counts the texts on which it and the certified arithmetic disagree about fidelity, with an upper bound on
their share, so the verdict says how far the claim carries to what is served.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from calibkit.engines.cpu import int8_gemm_saturates
from calibkit.evaluate.speed import SERVED_CHECK_TEXTS, MakeRunner, measure_speed, text_batches
from calibkit.evidence.intervals import mean_interval, proportion
from calibkit.evidence.rowfidelity import TextScores
from calibkit.evidence.sequential import clopper_pearson
from calibkit.progress import ProgressCallback
from calibkit.requests.choices import KeptWeights
from calibkit.results.runs import Range, ServedCheck, Speed, finite

if TYPE_CHECKING:  # pragma: no cover - types only
    import onnx

    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.evidence.split import SplitEvidence
    from calibkit.evidence.subsets import EvalSubset
    from calibkit.tasks import Task
    from calibkit.types import CalibrationTable



def served_model(proto: onnx.ModelProto, table: CalibrationTable, plan: Sequence[str],
                 op_types: Sequence[str], kept_weights: KeptWeights) -> bytes:
    """The onnxruntime-layout Q/DQ model of ``plan`` as ``build`` writes it for ONNX Runtime on this CPU (7-bit
    weights where its int8 GEMM saturates; the weight MatMuls kept out of static INT8 served as
    ``kept_weights`` says)."""
    from calibkit.quantize.keptweights import serve_kept
    from calibkit.quantize.qdq import Target, quantize_model

    q = quantize_model(proto, table, op_types=op_types, keep_nodes=tuple(plan), target=Target.ONNXRUNTIME,
                       reduce_range=int8_gemm_saturates())
    return bytes(serve_kept(q.model, kept_weights).model.SerializeToString())


def time_plans(fp32: Path, served: Mapping[int, bytes], tokenizer: TextTokenizer, input_names: Sequence[str],
               texts: Sequence[str], *, make_runner: MakeRunner, seed: int,
               progress: ProgressCallback | None = None) -> dict[int, Speed]:
    """Each served model (candidate id -> model bytes) timed beside the FP32 model on ``texts``."""
    models: dict[str, Path | bytes] = {"FP32": fp32}
    models.update({f"candidate {i}": m for i, m in served.items()})
    speeds = measure_speed(models, "FP32", text_batches(tokenizer, input_names, texts, seed=seed),
                           make_runner=make_runner, progress=progress)
    return {i: speeds[f"candidate {i}"] for i in served}


def served_check(served: bytes, task: Task, tokenizer: TextTokenizer, evidence: SplitEvidence, rows: EvalSubset,
                 certified: TextScores, *, make_runner: MakeRunner, batch_size: int, seed: int,
                 progress: ProgressCallback | None = None) -> ServedCheck | None:
    """The served model on ``rows`` (the holdout) against the certified arithmetic's per-text values there
    (``certified``, in ``rows``' order): None for tasks without per-text fidelity."""
    if not task.per_text:
        return None
    positions = evidence.agreement_positions(rows)
    if len(positions) > SERVED_CHECK_TEXTS:
        rng = np.random.default_rng(seed)
        positions = np.sort(rng.choice(positions, size=SERVED_CHECK_TEXTS, replace=False))
    if not len(positions):
        return None
    idx = rows.array[positions]
    texts = [evidence.texts[int(i)] for i in idx]
    with make_runner(served, name="the served model") as runner:
        out = task.predict(runner, tokenizer, texts, batch_size=batch_size, progress=progress,
                           task="checking the served model")
    indexed = task.neighbour_index
    rows_f = task.row_fidelity(evidence.reference[idx], out.values, index=evidence.reference if indexed else None,
                               index_rows=idx if indexed else None)
    served_a = np.asarray(rows_f.agreement, dtype=np.float64)
    certified_a = np.asarray(certified.agreement_values, dtype=np.float64)[positions]
    changed = int(np.sum(np.abs(served_a - certified_a) > 1e-9))
    binary = bool(np.all((served_a == 0.0) | (served_a == 1.0)))
    interval = proportion(served_a == 1.0) if binary else mean_interval(served_a)
    cosine = finite(float(rows_f.cosine.mean())) if rows_f.cosine is not None else None
    return ServedCheck(texts=len(idx), served_agreement=finite(float(served_a.mean())),
                       served_agreement_ci=Range.of(interval), certified_agreement=finite(float(certified_a.mean())),
                       changed=changed, changed_upper_share=clopper_pearson(changed, len(idx), 0.05)[1],
                       served_cosine=cosine)
