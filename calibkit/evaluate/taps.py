"""Per-layer measurements on eval inputs, streamed batch by batch through tapped copies of the models.

The reference (FP) model is tapped on each layer's input tensor for ranges and percentiles; the baseline (A)
and candidate (B) models are tapped on each layer's output for SQNR and cosine. Padding positions are masked.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from calibkit.calibrate.collect import probe_cost
from calibkit.data.encode import DEFAULT_MEMORY_BUDGET, BatchCost, TokenBudget
from calibkit.data.tokenizer import TextTokenizer
from calibkit.enginefiles.registry import ModelRunnerFactory, model_runner
from calibkit.engines.base import BaseRunner
from calibkit.evaluate.layers import LayerSpec, graph_tensors
from calibkit.evaluate.predict import length_batches
from calibkit.evaluate.streaming import ErrorAccumulator, RangeAccumulator, valid_mask
from calibkit.graph import add_outputs, tap_name
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress

log = logging.getLogger("calibkit.evaluate.taps")

RunnerFactory = Callable[[bytes, Sequence[str]], BaseRunner]


def ort_runner_factory(intra_op_threads: int | None = None,
                       factory: ModelRunnerFactory | None = None) -> RunnerFactory:
    """Runners for tapped copies, made by ``factory`` (``Resources.runner_factory``; default: the registry's
    :func:`~calibkit.enginefiles.registry.model_runner`)."""
    make_runner = factory or model_runner

    def make(model: bytes, outputs: Sequence[str]) -> BaseRunner:
        return make_runner(model, output_names=outputs, threads=intra_op_threads, name="tapped")

    return make


@dataclass(frozen=True)
class LayerMeasurement:
    spec: LayerSpec
    fp_min: float | None
    fp_max: float | None
    fp_absmax: float | None
    p99: float | None
    p9999: float | None
    clipped_fraction: float | None
    outlier_ratio: float | None
    nonfinite: int
    sqnr_db: float | None  # output of the node, B against A: includes what earlier layers did
    cosine: float | None
    quant_sqnr_db: float | None = None  # input of the node against its own fake-quantized copy: this layer only


@dataclass(frozen=True)
class LayerMeasurements:
    layers: tuple[LayerMeasurement, ...]
    ranges: dict[str, RangeAccumulator]  # by reference tensor name, for histograms
    samples: int


def _tapped_cost(
    runners: dict[str, tuple[BaseRunner, dict[str, str]]], tokenizer: TextTokenizer, texts: Sequence[str]
) -> BatchCost | None:
    """Bytes per batch of every tapped output of every runner (they are alive together), from probe runs."""
    enc = tokenizer.encode([texts[0]])
    total = BatchCost()
    for runner, names in runners.values():
        feeds = enc.feeds([s.name for s in runner.input_specs])
        _, cost = probe_cost(runner, feeds, enc.attention_mask, list(names.values()))
        if cost is None:
            return None
        total = BatchCost(total.per_token + cost.per_token, total.per_pair + cost.per_pair, total.fixed + cost.fixed)
    return total


def _none(v: float) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def measure_layers(
    layers: Sequence[LayerSpec],
    texts: Sequence[str],
    tokenizer: TextTokenizer,
    *,
    reference: onnx.ModelProto | None,
    baseline: onnx.ModelProto | None,
    candidate: onnx.ModelProto | None,
    runner_factory: RunnerFactory,
    batch_size: int = 32,
    progress: ProgressCallback | None = None,
    budget: TokenBudget | None = None,
) -> LayerMeasurements:
    """Stream ``texts`` through tapped copies of the models; ``reference`` may be the same object as
    ``baseline`` (then one pass serves both). Batches hold at most ``batch_size`` texts and fit ``budget``
    (default :data:`calibkit.data.encode.DEFAULT_MEMORY_BUDGET` bytes of tapped outputs, all models together).
    """
    clips, quants = _clip_ranges(layers)
    ranges = _range_accumulators(layers, reference, clips, quants)
    errors: dict[str, ErrorAccumulator] = {}
    if baseline is not None and candidate is not None:
        both = graph_tensors(baseline) & graph_tensors(candidate)
        errors = {t: ErrorAccumulator() for t in dict.fromkeys(s.output for s in layers) if t in both}
    runners: _Runners = {}
    try:
        for role, model, tensors in _run_plans(reference, baseline, candidate, list(ranges), list(errors)):
            runners[role] = _tapped(model, tensors, runner_factory)
        ref_role = "baseline" if (reference is baseline and "baseline" in runners) else "reference"
        _stream_layers(runners, texts, tokenizer, ranges, errors, ref_role, batch_size=batch_size,
                       budget=budget if budget is not None else TokenBudget(memory_bytes=DEFAULT_MEMORY_BUDGET),
                       progress=progress or no_progress)
    finally:
        for runner, _ in runners.values():
            runner.deactivate()
    result = tuple(_measurement(spec, ranges.get(spec.tensor), errors.get(spec.output), clips) for spec in layers)
    return LayerMeasurements(layers=result, ranges=ranges, samples=len(texts))


# role -> (its active runner, tensor -> the tap name the runner outputs it under)
_Runners = dict[str, tuple[BaseRunner, dict[str, str]]]


def _clip_ranges(layers: Sequence[LayerSpec]) -> tuple[dict[str, list[tuple[float, float]]], dict[str, list[Any]]]:
    """tensor -> the clipping ranges seen for it (one tensor may feed several quantized nodes), and tensor ->
    the quantizer of each of those ranges."""
    clips: dict[str, list[tuple[float, float]]] = {}
    quants: dict[str, list[Any]] = {}
    for spec in layers:
        if spec.clip_low is not None and spec.clip_high is not None:
            r = (spec.clip_low, spec.clip_high)
            if r not in clips.setdefault(spec.tensor, []):
                clips[spec.tensor].append(r)
                quants.setdefault(spec.tensor, []).append(spec.quantizer)
            continue
        clips.setdefault(spec.tensor, [])
    return clips, quants


def _range_accumulators(layers: Sequence[LayerSpec], reference: onnx.ModelProto | None,
                        clips: dict[str, list[tuple[float, float]]], quants: dict[str, list[Any]]
                        ) -> dict[str, RangeAccumulator]:
    """One range accumulator per layer input the reference model holds (none without a reference)."""
    if reference is None:
        return {}
    present = graph_tensors(reference)
    missing = [s.tensor for s in layers if s.tensor not in present]
    if missing:
        log.warning("%d layer inputs are not in the reference model (no FP ranges for them): %s",
                    len(missing), missing[:3])
    return {t: RangeAccumulator(t, clips.get(t, ()), quantizers=quants.get(t, ()))
            for t in dict.fromkeys(s.tensor for s in layers) if t in present}


def _run_plans(reference: onnx.ModelProto | None, baseline: onnx.ModelProto | None,
               candidate: onnx.ModelProto | None, ref_tensors: list[str], out_tensors: list[str]
               ) -> list[tuple[str, onnx.ModelProto, list[str]]]:
    """(role, model, the tensors tapped from it) for each model to run: the baseline also serves the reference
    when they are the same model."""
    plans: list[tuple[str, onnx.ModelProto, list[str]]] = []
    if baseline is not None and out_tensors:
        extra = ref_tensors if reference is baseline else []
        plans.append(("baseline", baseline, list(dict.fromkeys(out_tensors + extra))))
        plans.append(("candidate", candidate, list(out_tensors)))  # type: ignore[arg-type]
    if reference is not None and ref_tensors and not (reference is baseline and out_tensors):
        plans.append(("reference", reference, ref_tensors))
    return plans


def _tapped(model: onnx.ModelProto, tensors: list[str], runner_factory: RunnerFactory
            ) -> tuple[BaseRunner, dict[str, str]]:
    """An active runner of ``model`` tapped on ``tensors``, and the tap name of each tensor."""
    tapped = add_outputs(model, tensors)
    names = {t: tap_name(t, model) for t in tensors}
    runner = runner_factory(tapped.SerializeToString(), list(names.values()))
    runner.activate()
    return runner, names


def _stream_layers(runners: _Runners, texts: Sequence[str], tokenizer: TextTokenizer,
                   ranges: dict[str, RangeAccumulator], errors: dict[str, ErrorAccumulator], ref_role: str, *,
                   batch_size: int, budget: TokenBudget, progress: ProgressCallback) -> None:
    """Run every batch of ``texts`` through all the runners together: ``ranges`` observe the ``ref_role``
    runner's taps, ``errors`` the candidate's against the baseline's."""
    lengths = np.minimum(tokenizer.token_lengths(texts), tokenizer.max_length)
    cost = _tapped_cost(runners, tokenizer, texts) if budget.memory_bytes is not None and texts else None
    first = next(iter(runners.values()))[0]
    batches = length_batches(lengths, batch_size, budget=budget, cost=cost,
                             input_names=[s.name for s in first.input_specs])
    progress(ProgressEvent("layer statistics", 0, len(texts)))
    done = 0
    for idx in batches:
        enc = tokenizer.encode([texts[i] for i in idx])
        outs: dict[str, dict[str, np.ndarray]] = {}
        for role, (runner, names) in runners.items():
            got = runner.infer(enc.feeds([s.name for s in runner.input_specs]))
            outs[role] = {t: got[n] for t, n in names.items()}
        for t, acc in ranges.items():
            x = outs.get(ref_role, {}).get(t)
            if x is not None:
                acc.update(x, valid_mask(np.shape(x), enc.attention_mask))
        for t, err in errors.items():
            x, y = outs["baseline"][t], outs["candidate"][t]
            if np.shape(x) != np.shape(y):
                log.warning("tensor %s has shape %s in A but %s in B: skipped", t, np.shape(x), np.shape(y))
                continue
            err.update(x, y, valid_mask(np.shape(x), enc.attention_mask))
        done += len(idx)
        progress(ProgressEvent("layer statistics", done, len(texts)))


def _measurement(spec: LayerSpec, acc: RangeAccumulator | None, err: ErrorAccumulator | None,
                 clips: Mapping[str, Sequence[tuple[float, float | None]]]) -> LayerMeasurement:
    """One layer's measurement from its input's ranges (``acc``) and its output's errors (``err``)."""
    fp: dict[str, float | None] = dict(fp_min=None, fp_max=None, fp_absmax=None, p99=None, p9999=None,
                                       clipped_fraction=None, outlier_ratio=None, quant_sqnr_db=None)
    if acc is not None and acc.count:
        p9999 = acc.percentile(99.99)
        ci = clips[spec.tensor].index((spec.clip_low, spec.clip_high)) if spec.clip_low is not None else None
        fp = dict(
            fp_min=acc.min,
            fp_max=acc.max,
            fp_absmax=acc.absmax,
            p99=acc.percentile(99.0),
            p9999=p9999,
            clipped_fraction=acc.clipped_fraction(ci) if ci is not None else None,
            outlier_ratio=(acc.absmax / p9999) if p9999 > 0 else None,
            quant_sqnr_db=acc.quant_sqnr_db(ci) if ci is not None else None,
        )
    nonfinite = (acc.nonfinite if acc is not None else 0) + (err.nonfinite if err is not None else 0)
    return LayerMeasurement(
        spec=spec,
        **{k: _none(v) if v is not None else None for k, v in fp.items()},
        nonfinite=nonfinite,
        sqnr_db=_none(err.sqnr_db) if err is not None else None,
        cosine=_none(err.cosine) if err is not None else None,
    )
