"""Time up front: how long a run's long part will take on this machine, before it starts, and the one option that
shortens it most.

A long part is counted in texts of three kinds (:class:`Work`) and priced by one measurement made here:
``text_seconds``, the wall seconds of one FP32 text with the run's batching — timed on a small seeded sample of
the run's own texts (:func:`measure_text_seconds`), or read off tune's FP32 reference pass, which runs first
anyway. Relative to an FP32 text (:data:`COSTS`, calibrated on the measured runs of docs/measured.md, "Time
estimates"):

- an FP32 text (an FP32 session: an engine's evaluation, the FP32 reference): 1;
- an exact Q/DQ text (an INT8 variant on the switchboard: sensitivity, tune's tables, search, confirmation,
  holdout; an FP16 or INT8 engine on the CPU): 1 — on the demo embedder 97 sensitivity variants of 256 texts
  each took 10.4 ms a text on the 2-core machine's pool, its FP32 pass 11 ms a text, its INT8 engine 13.8 ms
  (an earlier model priced it 1.5 to 3.5 and every tune and compare it priced ran under its low end);
- a tapped text (one text through a tapped copy of a model, every layer's input and output copied out and
  measured: compare's per-layer measurements, tune's layer probe; a Q/DQ copy counts twice): 5 — the demo
  embedder's 512 texts through its FP32 and Q/DQ copies took 84 s, 55 ms a text and copy. Calibration statistics
  tap only the activations they histogram: about an FP32 text.

The priced time is printed as a range, divided and multiplied by :data:`SPREAD` (the high end twice the low
end): what a shared machine's load and the price's own sample move it by on the runs it was calibrated on.

The texts each step reads follow from the run's options and evidence (:func:`tune_steps`, :func:`compare_steps`);
where a decision rule stops early their likely count is what that rule read on the demo (their worst count,
what it may read, is kept with the step but not priced: a search that reads it runs past the range). Each
option that shrinks the run is priced the same way, and the one saving the most is named (:func:`estimate`),
with the estimate it gives. The run records the estimate and, at its end, what each
step and the whole took (:class:`~calibkit.results.runs.TimeEstimate`), so the two can be compared in its
report.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from calibkit.evaluate.speed import (
    SERVED_CHECK_TEXTS,
    SPEED_LARGE_BATCHES,
    SPEED_ROUNDS,
    SPEED_SECONDS,
    SPEED_SINGLE_TEXTS,
)
from calibkit.evaluate.tune_defaults import (
    TUNE_AUTO_TEXTS,
    TUNE_CONFIRM_CANDIDATES,
    TUNE_SENSITIVITY_SAMPLES,
    all_int8_holdout_texts,
)
from calibkit.progress import ESTIMATE_TASK, ProgressEvent
from calibkit.results.runs import FP32_PHASE, PhaseCost, Shortcut, StepEstimate, TimeEstimate, span_text

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.data.tokenizer import TextTokenizer
    from calibkit.enginefiles.artifact import EngineArtifact
    from calibkit.evidence.split import SplitEvidence
    from calibkit.executors.base import Executor
    from calibkit.requests.compare import CompareRequest
    from calibkit.requests.tune import TuneRequest
    from calibkit.resources import EngineRunnerFactory
    from calibkit.tasks.base import Task
    from calibkit.types import PathLike

#: wall cost of a text of each kind against an FP32 text, calibrated on measured runs (docs/measured.md, "Time
#: estimates"); see the module docstring
#: (taps: 5 on a loaded machine, 16-19 s for 1,536 text-copies where 5 prices 31-69 s on two quiet cores, so 3)
COSTS: Mapping[str, float] = {"fp32": 1.0, "qdq": 1.0, "taps": 3.0}
#: the printed range is the priced time divided and multiplied by this: its high end twice its low end, wide
#: enough for the runs it was calibrated on (docs/measured.md)
SPREAD = math.sqrt(2.0)
#: tune prices a text at its FP32 reference pass's rate, which runs on every worker at once with texts sorted by
#: length: a text of tune's later steps cost about twice that (the demo classifier's tune on 2 cores, quiet,
#: commit 40735dd, per step measured / priced: tables 2.6, flip risk 1.7, search 1.7, confirmation 2.8, holdout
#: numbers 1.8, statistics and smoothing 2.5; docs/measured.md)
TUNE_TEXT_FACTOR = 2.0
#: a served model's text in a speed round against a reference-pass text: batch-1 texts alone and batches padded
#: to their longest (the same run: 73 s for FP32 and four plans, a warm-up and three rounds, builds included)
SPEED_TEXT_COST = 6.7
#: a text of compare's sensitivity variants (the switchboard, on the local pool) against an FP32 text timed on
#: the run's batches: 1.14 on the demo embedder (20,736 texts in 149 s at 6.3 ms), 1.7 on the demo classifier's
#: short texts (2-core machine, quiet, commits 1df1a82 and 3402d7a; docs/measured.md)
SENSITIVITY_TEXT_COST = 1.3
#: a text of compare's speed rounds against the FP32 text it timed on the run's batches (compare times its texts
#: in whole length-sorted batches, tune at its reference pass's rate): 15 s on the demo's eval texts, 32 s on its
#: log texts at twice their tokens, 27-31 s on the embedder's (2-core machine, quiet, commits 3402d7a, 2f20ce0)
COMPARE_SPEED_TEXT_COST = 1.7
#: texts timed by :func:`measure_text_seconds` (at least two of the run's batches), and texts whose lengths say
#: how the run's batches pad
MEASURE_TEXTS = 64
LENGTH_TEXTS = 4096
#: timed passes over the sample, of which the median prices a text: one pass of a second on a shared machine is
#: moved by whatever else runs in it
TIMED_PASSES = 3
#: a shortcut saving less than this share of the likely estimate is not worth naming, nor one for a run likely
#: shorter than this many seconds
MIN_SAVING = 0.15
WORTH_SHORTENING = 60.0


@dataclass(frozen=True)
class Work:
    """One step of a long part, in texts: ``fp32`` texts through an FP32 session, ``qdq`` exact Q/DQ texts
    (likely; ``qdq_worst`` at worst, None: as likely), ``taps`` texts through a tapped model copy (a Q/DQ
    copy's texts counted twice);
    ``on_executor``: its Q/DQ texts are work units of the run's executor (else the driver runs them);
    ``speed_rounds``: per speed measurement, the FP32 texts one of its rounds costs, all its models together
    (evaluate.speed counts as many rounds as :data:`SPEED_SECONDS` holds, within :data:`SPEED_ROUNDS`, after a
    warm-up round)."""

    step: str
    fp32: float = 0.0
    qdq: float = 0.0
    qdq_worst: float | None = None
    taps: float = 0.0
    on_executor: bool = True
    speed_rounds: tuple[float, ...] = ()

    def texts(self, which: int) -> dict[str, float]:
        """Texts of each kind, likely (``which`` 0) or at worst (1)."""
        qdq = self.qdq if which == 0 or self.qdq_worst is None else self.qdq_worst
        return {"fp32": self.fp32, "qdq": qdq, "taps": self.taps}


def price(steps: Sequence[Work], text_seconds: float, lanes: float = 1.0) -> tuple[StepEstimate, ...]:
    """Each step's range of wall seconds at ``text_seconds`` an FP32 text: its likely texts priced by
    :data:`COSTS`, divided and multiplied by :data:`SPREAD` (``likely_seconds`` is the range's low end,
    ``worst_seconds`` its high end). ``lanes``: how many times the machine's own CPUs the executor gives Q/DQ
    work (1 for a local pool; more for remote workers)."""
    lanes = max(1.0, lanes)

    def cost(w: Work) -> float:
        n = w.texts(0)
        spread = lanes if w.on_executor else 1.0
        return (text_seconds * sum(COSTS[k] * n[k] / (spread if k == "qdq" else 1.0) for k in n)
                + sum(speed_seconds(r * text_seconds) for r in w.speed_rounds))

    return tuple(StepEstimate(w.step, cost(w) / SPREAD, cost(w) * SPREAD) for w in steps)


def speed_seconds(round_seconds: float) -> float:
    """Wall seconds of a speed measurement whose rounds take ``round_seconds`` each: a warm-up round, then as many
    counted rounds as :data:`SPEED_SECONDS` holds, within :data:`SPEED_ROUNDS` (evaluate.speed.measure_speed)."""
    if round_seconds <= 0:
        return 0.0
    counted = min(max(SPEED_SECONDS // round_seconds, SPEED_ROUNDS[0]), SPEED_ROUNDS[1])
    return (counted + 1) * round_seconds


def estimate(steps: Sequence[Work], text_seconds: float, measured_texts: int, *,
             shortcuts: Mapping[str, Sequence[Work]] | None = None, lanes: float = 1.0) -> TimeEstimate:
    """The estimate of ``steps`` and, among ``shortcuts`` (an option as typed, with its value -> the steps it
    leaves), the one whose likely estimate is lowest, when it saves at least :data:`MIN_SAVING` of a likely
    estimate of at least :data:`WORTH_SHORTENING` seconds."""
    if not (text_seconds >= 0 and math.isfinite(text_seconds)):
        raise ValueError(f"text_seconds must be a finite number >= 0, got {text_seconds!r}")
    priced = price(steps, text_seconds, lanes)
    likely, worst = (sum(s.likely_seconds for s in priced), sum(s.worst_seconds for s in priced))
    best: Shortcut | None = None
    for option, alt in (shortcuts or {}).items() if likely >= WORTH_SHORTENING else ():
        p = price(alt, text_seconds, lanes)
        cut = Shortcut(option, sum(s.likely_seconds for s in p), sum(s.worst_seconds for s in p))
        if cut.likely_seconds <= likely * (1.0 - MIN_SAVING) and (best is None
                                                                  or cut.likely_seconds < best.likely_seconds):
            best = cut
    return TimeEstimate(text_seconds, measured_texts, likely, worst, priced, best)


def summary(e: TimeEstimate, what: str) -> str:
    """The estimate as one line: how long ``what`` will likely (at worst) take, what the price rests on and the
    option that shortens it."""
    line = (f"{what} will take about {span_text(e.likely_seconds, e.worst_seconds)} on this machine (an FP32 text "
            f"takes {1000 * e.text_seconds:.2g} ms here, timed on {e.measured_texts:,} texts)")
    if e.resumed:
        line += f"; {e.resumed:,} evaluations of an earlier run are reused, so it will likely take less"
    if e.shortcut is not None:
        s = e.shortcut
        saved = 100.0 * (1.0 - s.likely_seconds / e.likely_seconds) if e.likely_seconds > 0 else 0.0
        line += f"; {s.option} shortens it to about {span_text(s.likely_seconds, s.worst_seconds)} (-{saved:.0f} %)"
    return line


def announce(e: TimeEstimate, what: str, progress: Callable[[ProgressEvent], None]) -> None:
    """Send the estimate through the progress channel (the CLI prints it as a line before the long part)."""
    progress(ProgressEvent(ESTIMATE_TASK, 1, 1, message=summary(e, what)))


def finish(e: TimeEstimate, actual_seconds: float, phases: Sequence[PhaseCost] = ()) -> TimeEstimate:
    """The estimate with what the long part took: the whole, and each step that ``phases`` timed by name."""
    took: dict[str, float] = {}
    for p in phases:
        took[p.phase] = took.get(p.phase, 0.0) + p.seconds
    steps = tuple(replace(s, actual_seconds=took.get(s.step, s.actual_seconds)) for s in e.steps)
    return replace(e, steps=steps, actual_seconds=max(0.0, actual_seconds))


def measure_text_seconds(predict: Callable[[list[str]], Any], texts: Sequence[str], *, batch_size: int,
                         seed: int = 0, sample: int = MEASURE_TEXTS,
                         lengths: Callable[[Sequence[str]], np.ndarray] | None = None) -> tuple[float, int]:
    """(wall seconds per text, texts timed): ``predict(texts)`` (an FP32 session with the run's batching) on a
    sample of ``texts`` (at least two batches of ``batch_size``), after one untimed pass over the same sample
    that warms the session up (a batch shape's first run allocates).

    ``lengths(texts)``: their token counts as the model reads them. Given, the sample is whole batches of the
    run's own (length-sorted over all of ``texts``, or a seeded :data:`LENGTH_TEXTS` of them), spread evenly
    over its lengths, and the time is scaled from the sample's padded tokens to the run's. Without them, a seeded
    random sample: a few random texts in two batches pad far more than a whole run does (measured on the demo
    embedder: 23 to 50 ms a text on 64 random texts, 11 ms over its 4,000)."""
    rng = np.random.default_rng(seed)
    if lengths is not None and len(texts) > max(sample, 2 * batch_size):
        return _time_run_batches(predict, texts, batch_size, sample, lengths, rng)
    n = min(len(texts), max(sample, 2 * batch_size))
    if n == 0:
        return 0.0, 0
    chosen = [texts[int(i)] for i in np.sort(rng.choice(len(texts), size=n, replace=False))]
    predict(chosen)
    t0 = time.perf_counter()
    predict(chosen)
    return (time.perf_counter() - t0) / n, n


def _time_run_batches(predict: Callable[[list[str]], Any], texts: Sequence[str], batch_size: int, sample: int,
                      lengths: Callable[[Sequence[str]], np.ndarray], rng: np.random.Generator) -> tuple[float, int]:
    """:func:`measure_text_seconds` on whole batches of the run's own length-sorted batching."""
    from calibkit.evaluate.predict import length_batches

    run = list(texts) if len(texts) <= LENGTH_TEXTS else [texts[int(i)] for i in rng.choice(len(texts),
                                                                                           LENGTH_TEXTS,
                                                                                           replace=False)]
    run_lengths = np.asarray(lengths(run))
    full = [b for b in length_batches(run_lengths, batch_size) if len(b) == batch_size]
    k = max(2, math.ceil(sample / batch_size))
    picked = sorted({int(round(x)) for x in np.linspace(0, len(full) - 1, k)}) if full else []
    rows = np.concatenate([full[i] for i in picked]) if picked else np.arange(min(len(run), sample))
    chosen = [run[int(i)] for i in rows]
    predict(chosen)
    seconds = float(np.median([_timed(predict, chosen) for _ in range(TIMED_PASSES)]))
    per_text = padded_tokens(run_lengths, batch_size) / len(run)
    return seconds * per_text / max(1, padded_tokens(run_lengths[rows], batch_size)), len(chosen)


def _timed(predict: Callable[[list[str]], Any], texts: list[str]) -> float:
    t0 = time.perf_counter()
    predict(texts)
    return time.perf_counter() - t0


def padded_tokens(lengths: np.ndarray, batch_size: int) -> int:
    """Token positions a model computes for texts of ``lengths`` in the length-sorted batches of a run
    (evaluate.predict.length_batches): each batch padded to its longest text."""
    from calibkit.evaluate.predict import length_batches

    lengths = np.asarray(lengths, dtype=np.int64)
    return int(sum(int(lengths[b].max()) * len(b) for b in length_batches(lengths, batch_size) if len(b)))


def fp32_text_seconds(phases: Sequence[PhaseCost]) -> tuple[float, int] | None:
    """(wall seconds per text, texts) of tune's FP32 reference pass, None before it ran."""
    ref = next((p for p in phases if p.phase == FP32_PHASE and p.texts > 0), None)
    return None if ref is None else (ref.seconds / ref.texts, ref.texts)


# ---------------------------------------------------------------- tune

#: share of the layers whose all-but-this variant compare runs: those quantizing alone does not settle (32 of 48
#: on the demo embedder)
KEPT_ALONE_SHARE = 2 / 3
#: share of the search split a candidate's decision reads where it cannot be worked out before the search: the
#: sequential rule stops once decided (an assumption, not a measurement); at worst it reads the whole split
SEQUENTIAL_SHARE = 0.5
#: share of the search split a candidate judged in strata by flip risk reads, where FP32's margins are not known
#: yet (the demo, before its FP32 pass) or cost a pass of their own (embeddings): on the demo classifier 1,363 of
#: 5,778 texts (0.24), at worst half as much again
STRATIFIED_SHARE = (0.25, 0.4)
#: texts of the search split the layer ranking's per-layer SQNR probe runs through tapped copies (tune._rank)
RANK_PROBE_TEXTS = 128
#: share of the ranked nodes the ranking runs again after method auto's one-node runs (those whose inputs mix
#: the two finalists' methods): none on the demo classifier; a tenth allows for models whose inputs mix more
RANK_RERUN_SHARE = 0.1


@dataclass(frozen=True)
class TuneSize:
    """What a tune's long part reads: its splits (texts, and of them from traffic), the layers and tables it
    measures and the options that bound its search (:func:`tune_size` reads them off a run)."""

    search: int
    holdout: int
    sensitivity: int
    nodes: int
    ranked: int  # nodes whose own damage the ranking measures (--sensitivity-layers)
    methods: int  # tables raced per variant (every method with --method auto)
    variants: int  # 1, or 2 where the smoothed model is measured too
    auto_texts: int  # Q/DQ texts of the per-tensor (auto) table's per-layer choice; 0 without method auto
    race: int  # texts the tables are raced on
    calibration: int  # texts of the calibration set (statistics)
    candidate_share: tuple[float, float]  # share of the search split a candidate reads: likely, at worst
    max_evaluations: int
    confirm: bool = True
    risk_strata: bool = True
    search_traffic: int = 0  # rows of the search split drawn from traffic
    holdout_traffic: int = 0
    method: str = "auto"
    speed: bool = False  # the confirmed plans timed beside FP32, and the served model checked (onnxruntime)


def tune_steps(z: TuneSize) -> list[Work]:
    """The long part of a tune, step by step (the names of tune's phases, so each meets its actual time)."""
    race = min(z.race, z.search)
    share, worst_share = z.candidate_share
    # the doubling ladder and the bisection over the ranking, all-INT8 and a few prunes (the demo: 12 of 49 nodes)
    candidates = min(z.max_evaluations, 2 * math.ceil(math.log2(z.nodes + 1)) + 2)
    # method auto's one-node runs serve the ranking where a node's inputs share one method: most of them
    ranked = z.ranked * (RANK_RERUN_SHARE if z.auto_texts and z.sensitivity <= TUNE_AUTO_TEXTS else 1.0)
    steps = [Work("calibration statistics", fp32=z.calibration)]
    if z.variants > 1:  # the per-channel pass, the check of the smoothed copy, its statistics
        steps.append(Work("smoothing", fp32=3 * z.calibration))
    steps += [
        Work("method tables", qdq=z.methods * z.variants * race + (z.auto_texts + race if z.auto_texts else 0)),
        Work("layer ranking", qdq=z.sensitivity * (1 + ranked), qdq_worst=z.sensitivity * (1 + z.ranked),
             taps=3 * min(RANK_PROBE_TEXTS, z.search)),
        Work("flip risk", qdq=z.search if z.risk_strata else 0),
        Work("plan search", qdq=candidates * share * z.search, qdq_worst=z.max_evaluations * worst_share * z.search),
    ]
    if z.confirm and z.holdout:  # the passing candidates tested in order: about two holdout passes, at most four
        steps.append(Work("holdout confirmation", qdq=2 * z.holdout, qdq_worst=TUNE_CONFIRM_CANDIDATES * z.holdout))
    if z.holdout:  # all-INT8 on (a sample of) the holdout, and the plan where the confirmation did not run it all
        steps.append(Work("holdout numbers", qdq=all_int8_holdout_texts(z.holdout) + (0 if z.confirm else z.holdout),
                          qdq_worst=2 * z.holdout))
    if z.speed:
        # rounds of 128 texts (32 alone, 3 batches of 32) through FP32 and up to four served INT8 models: a
        # warm-up and three counted rounds (more where SPEED_SECONDS holds them), each model built first
        per_round = (SPEED_SINGLE_TEXTS + SPEED_LARGE_BATCHES * 32) * (1 + TUNE_CONFIRM_CANDIDATES)
        steps.append(Work("speed", speed_rounds=(per_round * SPEED_TEXT_COST,), on_executor=False))
        checked = min(SERVED_CHECK_TEXTS, z.holdout_traffic or z.holdout)
        steps.append(Work("served check", fp32=0.5 * checked, on_executor=False))
    return steps


def tune_shortcuts(z: TuneSize) -> dict[str, list[Work]]:
    """The options that shrink a tune, each with the steps it leaves."""
    out: dict[str, TuneSize] = {}
    if z.max_evaluations >= 4:
        out[f"--max-evaluations {z.max_evaluations // 2}"] = replace(z, max_evaluations=z.max_evaluations // 2)
    traffic = z.search_traffic + z.holdout_traffic
    if traffic >= 2:
        out[f"--traffic-size {traffic // 2}"] = _fewer_rows(z, z.search_traffic // 2, z.holdout_traffic // 2, True)
    labelled = z.search + z.holdout - traffic
    if labelled >= 2 * traffic and labelled >= 30:
        out[f"--limit {labelled // 2}"] = _fewer_rows(z, (z.search - z.search_traffic) // 2,
                                                      (z.holdout - z.holdout_traffic) // 2, False)
    if z.sensitivity >= 16:
        out[f"--sensitivity-samples {z.sensitivity // 2}"] = replace(z, sensitivity=z.sensitivity // 2)
    if z.ranked >= 4:
        out[f"--sensitivity-layers {z.ranked // 2}"] = replace(z, ranked=z.ranked // 2)
    if z.method == "auto":
        out["--method minmax"] = replace(z, methods=1, auto_texts=0, method="minmax")
    if z.variants > 1:
        out["--no-smooth"] = replace(z, variants=1)
    return {option: tune_steps(size) for option, size in out.items()}


def _fewer_rows(z: TuneSize, search: int, holdout: int, traffic: bool) -> TuneSize:
    """``z`` with ``search`` and ``holdout`` rows fewer, of the traffic's rows or of the eval set's."""
    z = replace(z, search=z.search - search, holdout=z.holdout - holdout)
    if traffic:
        z = replace(z, search_traffic=z.search_traffic - search, holdout_traffic=z.holdout_traffic - holdout)
    return z


def tune_size(evidence: SplitEvidence, config: TuneRequest, nodes: int, calibration_texts: int,
              auto_texts_per_node: int) -> TuneSize:
    """The :class:`TuneSize` of a run: ``evidence`` (evidence.split.SplitEvidence) as drawn, ``config``
    (requests.tune.TuneRequest), the quantizable ``nodes``; ``auto_texts_per_node``: the Q/DQ texts
    method auto measures per node and finalist method."""
    from calibkit.types import Method

    traffic = evidence.traffic
    search, holdout = len(evidence.search), len(evidence.holdout)
    sensitivity = len(evidence.sensitivity)
    ranked = nodes if config.sensitivity_layers is None else min(config.sensitivity_layers, nodes)
    auto = config.method == "auto"
    return TuneSize(
        search=search, holdout=holdout, sensitivity=sensitivity, nodes=nodes, ranked=ranked,
        methods=len(Method) if auto else 1, variants=2 if config.smooth else 1,
        auto_texts=auto_texts_per_node * nodes if auto else 0, race=config.race_texts,
        calibration=calibration_texts, candidate_share=_candidate_share(evidence, config),
        max_evaluations=config.max_evaluations, confirm=config.confirm, risk_strata=config.risk_strata,
        speed=bool(getattr(config, "speed", False)) and str(getattr(config, "target", "")) == "onnxruntime",
        search_traffic=0 if traffic is None else int(traffic[evidence.search.array].sum()),
        holdout_traffic=0 if traffic is None else int(traffic[evidence.holdout.array].sum()),
        method=config.method,
    )


def _candidate_share(evidence: SplitEvidence, config: TuneRequest) -> tuple[float, float]:
    """Share of the search split one candidate's decision reads: for a classifier judged in strata by flip risk,
    the texts its strata evaluate by FP32's margins alone (the all-INT8 model's changes, not known yet, add a
    few: at worst half as many again); for an embedder :data:`STRATIFIED_SHARE`; the sequential rule's
    :data:`SEQUENTIAL_SHARE`; the whole split."""
    from calibkit.evidence.plan_decisions import WHOLE_SPLIT
    from calibkit.evidence.risk import stratify

    n = len(evidence.search)
    if not n:
        return 1.0, 1.0
    if config.risk_strata and evidence.kind.margin_scale == "absolute":
        strata = stratify(evidence, evidence.search, np.ones(n), seed=config.seed)
        if strata is not None:
            share = len(strata.evaluated) / n
            return share, min(1.0, 1.5 * share)
    if config.risk_strata and evidence.kind.margin_scale == "quantile":
        return STRATIFIED_SHARE
    return (1.0, 1.0) if config.decision_rule == WHOLE_SPLIT else (SEQUENTIAL_SHARE, 1.0)


def lanes_of(executor: Executor | None) -> float:
    """How many times this machine's CPUs an executor gives Q/DQ work: 1 for local ones (their workers share
    these CPUs: the process pool, a ``dask-local`` cluster), workers x threads / CPUs for remote ones (whose
    units run the threads the executor sets, ``task_threads``)."""
    from calibkit.cpus import usable_cpus

    threads = getattr(executor, "task_threads", None)
    if not threads or str(getattr(executor, "name", "")).startswith("dask-local"):
        return 1.0
    return max(1.0, int(getattr(executor, "workers", 1)) * int(threads) / max(1, usable_cpus()))


def estimate_tune(evidence: SplitEvidence, config: TuneRequest, nodes: int, calibration_texts: int,
                  phases: Sequence[PhaseCost], executor: Executor | None, auto_texts_per_node: int,
                  ledger: Path | None = None) -> TimeEstimate:
    """tune's estimate from its FP32 reference pass (``phases``), made right after it; ``ledger``: the run's
    ledger file, whose evaluations an earlier run left (counted in the estimate, said in its summary)."""
    from calibkit.evaluate.ledger import Ledger

    z = tune_size(evidence, config, nodes, calibration_texts, auto_texts_per_node)
    text_seconds, texts = fp32_text_seconds(phases) or (0.0, 0)
    shortcuts = {k: _at_tune_rate(v) for k, v in tune_shortcuts(z).items()}
    e = estimate(_at_tune_rate(tune_steps(z)), text_seconds, texts, shortcuts=shortcuts, lanes=lanes_of(executor))
    return replace(e, resumed=Ledger(ledger).loaded if ledger is not None and ledger.is_file() else 0)


def _at_tune_rate(steps: Sequence[Work]) -> list[Work]:
    """tune's steps priced against its reference pass's rate (:data:`TUNE_TEXT_FACTOR`; tapped texts and the
    speed rounds, priced on their own, as they are)."""
    return [w if w.step == "speed" else
            replace(w, fp32=w.fp32 * TUNE_TEXT_FACTOR, qdq=w.qdq * TUNE_TEXT_FACTOR,
                    qdq_worst=None if w.qdq_worst is None else w.qdq_worst * TUNE_TEXT_FACTOR) for w in steps]


# ---------------------------------------------------------------- compare


@dataclass(frozen=True)
class CompareSize:
    """What a compare's long part reads: each engine's kind of text ("fp32" or, for FP16 and INT8 engines on the
    CPU, "qdq"; A, B, then the reference), the eval and traffic texts, the per-layer subsets."""

    texts: int
    engines: tuple[str, ...]
    traffic: int = 0  # texts A and B also evaluate (0: none, or the eval set itself)
    layer_samples: int = 0  # texts through the tapped copies (0: no per-layer analysis)
    tapped: int = 3  # copies tapped, a Q/DQ one counted twice: A and B, and the reference when given
    sensitivity: int = 0  # texts of the sensitivity subset (0: not measured)
    sensitivity_layers: int = 0  # nodes measured alone and all-but-alone
    speed: bool = False  # B timed against A as a server runs them (ONNX Runtime engines)
    traffic_scale: float = 1.0  # a traffic text's padded tokens against an eval text's (the texts timed)
    sensitivity_on_traffic: bool = False  # the sensitivity subset is drawn from the traffic


class _EngineTexts(TypedDict):
    """A step's texts through engines A and B, by kind of session (:class:`Work`'s ``fp32`` and ``qdq``)."""

    fp32: float
    qdq: float


def compare_steps(z: CompareSize) -> list[Work]:
    """The long part of a compare, step by step."""
    def engines(n: int, which: Sequence[str]) -> _EngineTexts:
        return {"fp32": n * sum(k == "fp32" for k in which), "qdq": n * sum(k != "fp32" for k in which)}

    steps = [Work("evaluate engines", **engines(z.texts, z.engines), on_executor=False)]
    if z.traffic:
        steps.append(Work("traffic", **engines(round(z.traffic * z.traffic_scale), z.engines[:2]),
                          on_executor=False))
    if z.layer_samples:
        steps.append(Work("per-layer measurements", taps=z.tapped * z.layer_samples))
    if z.sensitivity:  # all-INT8 and each layer alone; all but it where quantizing it alone does not settle it
        alone = z.sensitivity_layers * (1 + KEPT_ALONE_SHARE)
        texts = z.sensitivity * SENSITIVITY_TEXT_COST * (z.traffic_scale if z.sensitivity_on_traffic else 1.0)
        steps.append(Work("per-layer sensitivity", qdq=texts * (1 + alone),
                          qdq_worst=texts * (1 + 2 * z.sensitivity_layers)))
    if z.speed:  # rounds of 128 texts (32 alone, 3 batches of 32) through A and B, a warm-up first; of the
        # traffic when there is traffic
        per_round = (SPEED_SINGLE_TEXTS + SPEED_LARGE_BATCHES * 32) * (z.traffic_scale if z.traffic else 1.0)
        steps.append(Work("speed", speed_rounds=(2 * per_round * COMPARE_SPEED_TEXT_COST,), on_executor=False))
    return steps


def compare_shortcuts(z: CompareSize) -> dict[str, list[Work]]:
    """The options that shrink a compare, each with the steps it leaves."""
    out: dict[str, CompareSize] = {}
    if z.texts >= 30:
        half = z.texts // 2
        out[f"--limit {half}"] = replace(z, texts=half, layer_samples=min(z.layer_samples, half))
    if z.traffic >= 2:
        out[f"--traffic-size {z.traffic // 2}"] = replace(z, traffic=z.traffic // 2)
    if z.layer_samples >= 16:
        out[f"--layer-samples {z.layer_samples // 2}"] = replace(z, layer_samples=z.layer_samples // 2)
    if z.sensitivity >= 16:
        out[f"--sensitivity-samples {z.sensitivity // 2}"] = replace(z, sensitivity=z.sensitivity // 2)
    if z.sensitivity and z.sensitivity_layers >= 4:
        k = z.sensitivity_layers // 2
        out[f"--sensitivity-layers {k}"] = replace(z, sensitivity_layers=k)
    return {option: compare_steps(size) for option, size in out.items()}


def compare_size(engines: Sequence[EngineArtifact], texts: int, traffic: int, options: CompareRequest, *,
                 labelled: bool, row_task: bool, traffic_scale: float = 1.0) -> CompareSize:
    """The :class:`CompareSize` of a run: ``engines`` (A, B and the reference, enginefiles.artifact.EngineArtifact),
    ``texts`` in the eval set, ``traffic`` texts beside them, ``options`` (evaluate.compare.CompareOptions);
    ``labelled``: a labelled classifier (its sensitivity reads the eval set; others the traffic, when given);
    ``row_task``: a task with per-text fidelity (whose sensitivity is measured); ``traffic_scale``: a traffic
    text's padded tokens against an eval text's."""
    from calibkit.types import Backend, Precision

    kinds = tuple("fp32" if e.precision is Precision.FP32 else "qdq" for e in engines)
    layers = min(texts, options.layer_samples or texts) if options.layers else 0
    int8 = next((e for e in engines[:2] if e.precision is Precision.INT8 and e.backend is Backend.ONNXRUNTIME), None)
    pool = traffic if traffic and not labelled else texts
    sensitivity = (min(options.sensitivity_samples, pool)
                   if options.layers and options.sensitivity and row_task and int8 is not None else 0)
    k = options.sensitivity_layers
    if sensitivity and k is None:
        assert int8 is not None  # sensitivity is 0 without an INT8 engine
        k = _quantized_nodes(int8.path)
    tapped = sum(1 if kind == "fp32" else 2 for kind in kinds)
    served = bool(getattr(options, "speed", False)) and all(e.backend is Backend.ONNXRUNTIME for e in engines[:2])
    return CompareSize(texts=texts, engines=kinds, traffic=traffic, layer_samples=layers, tapped=tapped,
                       sensitivity=sensitivity, sensitivity_layers=k or 0, speed=served, traffic_scale=traffic_scale,
                       sensitivity_on_traffic=bool(traffic) and not labelled)


def _quantized_nodes(path: PathLike) -> int:
    """Nodes of a Q/DQ model whose inputs are quantized (its weights not loaded)."""
    from calibkit.evaluate.layers import find_layers
    from calibkit.graph import load_model

    return len({spec.node for spec in find_layers(load_model(path, load_external_data=False))})


def estimate_compare(engines: Sequence[EngineArtifact], z: CompareSize, open_runner: EngineRunnerFactory,
                     tokenizer: TextTokenizer, task: Task, texts: Sequence[str], options: CompareRequest,
                     executor: Executor | None = None) -> TimeEstimate:
    """compare's estimate, priced by the FP32 engine (else A) timed on a sample of ``texts``."""
    from calibkit.types import Precision

    fp32 = next((e for e in engines if e.precision is Precision.FP32), engines[0])
    with open_runner(fp32) as runner:
        seconds, n = measure_text_seconds(
            lambda xs: task.predict(runner, tokenizer, xs, batch_size=options.batch_size), texts,
            batch_size=options.batch_size, seed=options.seed, lengths=lambda xs: token_counts(tokenizer, xs))
    if fp32.precision is not Precision.FP32:  # an FP16 or INT8 engine on the CPU costs about a Q/DQ text
        seconds /= COSTS["qdq"]
    return estimate(compare_steps(z), seconds, n, shortcuts=compare_shortcuts(z), lanes=lanes_of(executor))


# ---------------------------------------------------------------- demo run


@dataclass(frozen=True)
class DemoSize:
    """What ``calibkit demo run`` reads after its assets and calibration set exist (demo.workflow fills it from
    its options): the eval and calibration texts, the model's quantizable nodes and the options of its steps."""

    eval_texts: int
    calibration: int
    nodes: int
    methods: int
    smooth: bool
    traffic: int  # tune's traffic texts (0: none)
    embedder_traffic: int  # the embedder's tune (0: skipped)
    sensitivity_samples: int  # compare's
    sensitivity_layers: int | None
    layer_samples: int
    max_evaluations: int  # tune's
    tune_method: str
    auto_texts_per_node: int  # Q/DQ texts method auto measures per node (tune's finalists x texts)
    tune_sensitivity_samples: int = TUNE_SENSITIVITY_SAMPLES
    compare_traffic: int | None = None  # compare's traffic texts (None: tune's)
    traffic_scale: float = 1.0  # a log text's padded tokens against an eval text's (the texts timed)
    served: bool = True  # tunes for ONNX Runtime (their plans timed, the served model checked) and compares timed
    deploy_texts: int = 0  # texts deploy measures the served model on beside FP32 (0: no deploy step)


def demo_steps(d: DemoSize) -> list[Work]:
    """The demo's steps after sampling, named as its timings are (each a sum of the work inside it)."""
    variants = 2 if d.smooth else 1
    sens = min(d.sensitivity_samples, d.eval_texts)
    layers = min(d.layer_samples, d.eval_texts)
    vs_fp32 = CompareSize(d.eval_texts, ("fp32", "qdq"), d.traffic if d.compare_traffic is None else d.compare_traffic,
                          layers, 3, sens,
                          min(d.sensitivity_layers or d.nodes, d.nodes), speed=d.served,
                          traffic_scale=d.traffic_scale)
    vs_fp16 = CompareSize(d.eval_texts, ("qdq", "qdq", "fp32"), 0, layers, 5, speed=d.served)
    steps = [Work("smooth", fp32=3 * d.calibration)] if d.smooth else []
    steps += [
        Work("calibrate", fp32=variants * d.calibration),
        Work("method accuracy", fp32=d.eval_texts, qdq=d.methods * variants * d.eval_texts),
        _merged("compare", compare_steps(vs_fp32) + compare_steps(vs_fp16)),
        _merged("tune", _demo_tune(d, d.eval_texts, d.traffic)),
    ]
    if d.embedder_traffic:
        steps.append(_merged("embedder (tune + compare)", _demo_tune(d, 0, d.embedder_traffic)
                             + compare_steps(CompareSize(d.eval_texts, ("fp32", "qdq"), 0, layers, 3,
                                                         speed=d.served))))
    if d.deploy_texts:  # the served model and FP32 on traffic texts, then timed beside each other
        per_round = SPEED_SINGLE_TEXTS + SPEED_LARGE_BATCHES * 32
        steps.append(Work("deploy", fp32=2 * d.deploy_texts * d.traffic_scale,
                          speed_rounds=(2 * per_round * COMPARE_SPEED_TEXT_COST,), on_executor=False))
    return steps


def _demo_tune(d: DemoSize, labelled: int, traffic: int) -> list[Work]:
    """A tune of the demo's options on ``labelled`` eval texts and ``traffic`` log texts, its FP32 pass included."""
    from calibkit.requests.tune import TuneRequest

    defaults = TuneRequest(model="", calibration_set="")

    texts = labelled + round(traffic * d.traffic_scale)  # in eval texts' worth of tokens: the texts timed
    share = defaults.holdout_fraction
    holdout = round(texts * share)
    auto = d.tune_method == "auto"
    z = TuneSize(search=texts - holdout, holdout=holdout, sensitivity=min(d.tune_sensitivity_samples, texts - holdout),
                 nodes=d.nodes, ranked=d.nodes, methods=d.methods if auto else 1, variants=2,
                 auto_texts=d.auto_texts_per_node * d.nodes if auto else 0, race=defaults.race_texts,
                 calibration=d.calibration, candidate_share=STRATIFIED_SHARE, max_evaluations=d.max_evaluations,
                 search_traffic=round(traffic * (1 - share)), holdout_traffic=round(traffic * share),
                 method=d.tune_method, speed=d.served)
    return [Work(FP32_PHASE, fp32=texts), *_at_tune_rate(tune_steps(z))]


def _merged(step: str, works: Sequence[Work]) -> Work:
    """One step doing all of ``works`` (on the executor where any of them is)."""
    return Work(step, fp32=sum(w.fp32 for w in works), qdq=sum(w.qdq for w in works),
                qdq_worst=sum(w.texts(1)["qdq"] for w in works), taps=sum(w.taps for w in works),
                on_executor=any(w.on_executor for w in works),
                speed_rounds=tuple(r for w in works for r in w.speed_rounds))


def token_counts(tokenizer: TextTokenizer, texts: Sequence[str]) -> np.ndarray:
    """Tokens a model reads of each text: ``tokenizer`` (data.tokenizer.TextTokenizer) counts, truncated."""
    return np.minimum(tokenizer.token_lengths(texts), tokenizer.max_length)
