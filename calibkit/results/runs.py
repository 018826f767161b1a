"""The results calibkit returns: typed, frozen, plain data — the one contract between evaluation and reports.

``compare`` returns a :class:`Comparison`, ``tune`` a :class:`TuneResult`. Each mirrors its JSON document
field by field (``results.codec`` writes and parses them generically from these annotations, so a field added
here is in the document and read back without further code). No value here is NaN: a number that does not
apply is ``None`` (rendered "n/a"). Arrays (per-text outputs) are not part of a result's document; where a
caller wants them they ride in a field marked ``json=False`` (see :data:`NOT_IN_DOCUMENT`), excluded from
equality too.

:class:`Evidence` names where the rows a verdict rests on came from (file, content hash, which rows, what was
excluded, labelled or not): compare's ``eval_set`` block; tune's eval set carries one too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, SupportsFloat, overload

from calibkit.results.flags import Bounds, Flag, PairedEffect, Thresholds

#: field metadata: leave the field out of the JSON document
NOT_IN_DOCUMENT = {"json": False}
#: field metadata: a Mapping field whose entries sit beside the other fields in the JSON object
FLATTEN = {"flatten": True}


def finite(value: SupportsFloat | None) -> float | None:
    """``value`` as a float, or None when it is None or not a finite number (NaN never enters a result)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


# ---------------------------------------------------------------- shared values


class _Interval(Bounds, Protocol):
    """What :meth:`Range.of` reads of an ``evidence.intervals.Interval``."""

    @property
    def level(self) -> float: ...


class _Paired(PairedEffect, Protocol):
    """What :meth:`Difference.of` reads of an ``evidence.intervals.PairedDifference``."""

    @property
    def interval(self) -> _Interval: ...

    @property
    def a_only(self) -> int: ...

    @property
    def b_only(self) -> int: ...

    @property
    def mcnemar_p(self) -> float: ...

    @property
    def verdict(self) -> str: ...


class _Subset(Protocol):
    """What :meth:`RowSelection.of_subset` reads of an ``evidence.subsets.EvalSubset``."""

    @property
    def indices(self) -> Sequence[int]: ...

    @property
    def total(self) -> int: ...

    @property
    def seed(self) -> int: ...

    @property
    def strategy(self) -> str: ...

    @property
    def content_sha256(self) -> str: ...


@dataclass(frozen=True)
class Range:
    """A 95 % interval of a proportion or an estimate (fractions)."""

    estimate: float | None
    low: float | None
    high: float | None
    level: float = 0.95

    @overload
    @classmethod
    def of(cls, iv: _Interval) -> Range: ...
    @overload
    @classmethod
    def of(cls, iv: None) -> None: ...
    @overload
    @classmethod
    def of(cls, iv: _Interval | None) -> Range | None: ...
    @classmethod
    def of(cls, iv: _Interval | None) -> Range | None:
        """From an ``evidence.intervals.Interval`` (None passes through)."""
        if iv is None:
            return None
        return cls(finite(iv.estimate), finite(iv.low), finite(iv.high), float(iv.level))


@dataclass(frozen=True)
class Difference:
    """B − A of a paired 0/1 outcome on the same examples, with its interval, McNemar p and verdict
    ("gain" | "loss" | "not significant")."""

    estimate: float | None
    low: float | None
    high: float | None
    a_only: int
    b_only: int
    n: int
    mcnemar_p: float | None
    significant: bool
    verdict: str
    examples_to_settle: int | None = None
    level: float = 0.95

    @property
    def interval(self) -> Range:
        return Range(self.estimate, self.low, self.high, self.level)

    @overload
    @classmethod
    def of(cls, d: _Paired) -> Difference: ...
    @overload
    @classmethod
    def of(cls, d: None) -> None: ...
    @overload
    @classmethod
    def of(cls, d: _Paired | None) -> Difference | None: ...
    @classmethod
    def of(cls, d: _Paired | None) -> Difference | None:
        """From an ``evidence.intervals.PairedDifference`` (None passes through)."""
        if d is None:
            return None
        iv = d.interval
        return cls(finite(iv.estimate), finite(iv.low), finite(iv.high), int(d.a_only), int(d.b_only), int(d.n),
                   finite(d.mcnemar_p), bool(d.significant), str(d.verdict),
                   None if d.significant else d.examples_to_settle(), float(iv.level))


@dataclass(frozen=True)
class RowSelection:
    """Rows of a file of ``of`` rows: ``indices`` into it in canonical (hash) order (left out past 5,000 rows),
    drawn by ``strategy`` from ``seed``; ``content_sha256`` is the same for the same rows in any file order."""

    count: int
    of: int
    seed: int
    strategy: str
    content_sha256: str
    indices: tuple[int, ...] | None = None

    @classmethod
    def of_subset(cls, sub: _Subset | None, max_indices: int = 5000) -> RowSelection | None:
        """From an ``evidence.subsets.EvalSubset`` (None passes through)."""
        if sub is None:
            return None
        return cls(len(sub.indices), int(sub.total), int(sub.seed), str(sub.strategy), str(sub.content_sha256),
                   tuple(int(i) for i in sub.indices) if len(sub.indices) <= max_indices else None)


@dataclass(frozen=True)
class Evidence:
    """Where the rows a verdict rests on came from.

    ``path``: the file (or folder) read; ``count``: rows evaluated; ``labels``: the class names the labels
    map to (empty without labels, or for tasks without classes); ``rows``: which rows of the file (None: all
    of them, in file order); ``labelled``: whether labels were scored (else fidelity to the reference alone);
    ``exclusions``: rows left out and why (e.g. texts that are also in the calibration set)."""

    path: str
    count: int
    labels: tuple[str, ...] = ()
    rows: RowSelection | None = None
    labelled: bool = False
    exclusions: tuple[str, ...] = ()


# ---------------------------------------------------------------- compare


@dataclass(frozen=True)
class Latency:
    """Per-batch inference time in milliseconds."""

    mean: float | None
    p50: float | None
    p95: float | None


@dataclass(frozen=True)
class EngineEvaluation:
    """One engine on the evidence: what it is, its label metrics (None without labels or for tasks without
    classes) and its latency."""

    name: str  # "A" | "B" | "reference"
    path: str
    precision: str
    backend: str
    latency_ms: Latency
    throughput_per_s: float | None
    batch_size: int
    accuracy: float | None = None
    accuracy_ci: Range | None = None
    macro_f1: float | None = None
    macro_f1_ci: Range | None = None
    confusion_matrix: tuple[tuple[int, ...], ...] | None = None
    labels: tuple[str, ...] = ()
    # INT8: the Q/DQ layout measured ("tensorrt" | "onnxruntime"), what `build` and `deploy` must ship to serve it
    layout: str | None = None


@dataclass(frozen=True)
class BatchSpeed:
    """One batch size of a speed measurement (:class:`Speed`): ``batches`` batches of ``batch_size`` texts each
    round; ``reference_ms`` and ``model_ms``, the median over rounds of a round's time, per batch;
    ``speedup``, the ratio of those medians (above 1: the model is faster than the reference);
    ``speedup_low``/``speedup_high``, the lowest and highest ratio of one round's times (the spread)."""

    batch_size: int
    batches: int
    reference_ms: float
    model_ms: float
    speedup: float
    speedup_low: float
    speedup_high: float


@dataclass(frozen=True)
class Speed:
    """How fast ``model`` serves against ``reference`` (both through ``backend`` with ``threads`` intra-op
    threads, every graph optimization, as a server runs them), measured as a benchmark is: the same batches of
    real texts (``texts`` of them, padded per batch) for both, in ``rounds`` interleaved rounds (each batch run
    by every model back to back, their order rotated), a warm-up round not counted; ``cpu``: the processor and
    the instruction sets that decide ONNX Runtime's int8 kernels (``isa``)."""

    model: str
    reference: str
    backend: str
    threads: int
    rounds: int
    texts: int
    cpu: str
    isa: str
    at: tuple[BatchSpeed, ...]

    def at_batch(self, batch_size: int) -> BatchSpeed | None:
        return next((b for b in self.at if b.batch_size == batch_size), None)

    @property
    def slowest(self) -> BatchSpeed:
        """The batch size at which the model gains least: what "at least this fast" rests on."""
        return min(self.at, key=lambda b: b.speedup)

    @property
    def words(self) -> str:
        """``1.93x FP32 at batch 1 [1.88-1.99], 2.10x at batch 32 [...]`` (spread: lowest and highest round)."""
        parts = [f"{b.speedup:.2f}x{f' {self.reference}' if i == 0 else ''} at batch {b.batch_size} "
                 f"[{b.speedup_low:.2f}-{b.speedup_high:.2f}]" for i, b in enumerate(self.at)]
        return ", ".join(parts)


@dataclass(frozen=True)
class OutputStats:
    """B's outputs against A's: cosine per text, absolute error, KL divergence of the softmax (None where the
    outputs are no distribution) and mean squared error."""

    cosine_mean: float | None
    cosine_min: float | None
    max_abs_error: float | None
    mean_abs_error: float | None
    mean_kl: float | None
    logit_mse: float | None


@dataclass(frozen=True)
class Disagreement:
    index: int  # row in the file
    text: str
    label: str  # "" without labels
    pred_a: str
    pred_b: str
    confidence_a: float | None = None  # A's top-2 probability gap on this text (classification)


@dataclass(frozen=True)
class ConfidenceBand:
    """Texts whose top-2 probability gap under A lies in [low, high), and how many of them B flipped."""

    low: float
    high: float
    texts: int
    flips: int


@dataclass(frozen=True)
class SensitivityRun:
    """One variant of the INT8 model on the sensitivity subset: its accuracy, the change it makes (points as a
    fraction), its output error and, with a paired interval, whether the change is significant."""

    accuracy: float | None
    delta: float | None
    logit_mse: float | None
    mean_kl: float | None
    flip_rate: float | None = None
    delta_low: float | None = None
    delta_high: float | None = None
    significant: bool | None = None
    examples_to_settle: int | None = None
    agreement: float | None = None  # mean per-text agreement with the reference (evidence.rowfidelity)
    cosine: float | None = None  # embeddings: mean cosine to the reference


@dataclass(frozen=True)
class LayerSensitivity:
    """A layer's measured effect: quantizing only it, and keeping only it in higher precision. The ``delta``
    of each run is accuracy (only with labels); fidelity is always measured: ``flips_removed`` is the agreement
    with the reference that keeping only this layer in higher precision recovers, ``agreement_cost`` what
    quantizing only it loses (negative), and for embeddings ``cosine_recovered`` / ``cosine_cost`` the same in
    mean cosine (paired over the per-text values; McNemar only for 0/1 values)."""

    only_this_int8: SensitivityRun
    all_but_this: SensitivityRun
    flips_removed: Difference | None = None
    agreement_cost: Difference | None = None
    cosine_recovered: Difference | None = None
    cosine_cost: Difference | None = None


@dataclass(frozen=True)
class LayerVerdict:
    """One quantized layer input: where it is, what was measured on it, its sensitivity and the flag with the
    reasons that set it."""

    index: int
    node: str
    op_type: str
    tensor: str
    flag: Flag
    reasons: tuple[str, ...] = ()
    module: str = ""
    output: str = ""
    amax: float | None = None
    fp_min: float | None = None
    fp_max: float | None = None
    fp_absmax: float | None = None
    p99: float | None = None
    p9999: float | None = None
    clipped_fraction: float | None = None
    outlier_ratio: float | None = None
    nonfinite: int = 0
    sqnr_db: float | None = None  # the layer's output against the reference's
    quant_sqnr_db: float | None = None  # its own INT8 error: input against its fake-quantized copy
    weight_sqnr_db: float | None = None
    weight_zeroed_fraction: float | None = None
    cosine: float | None = None
    sensitivity: LayerSensitivity | None = None

    @property
    def label(self) -> str:
        """What a reader sees: the module path with the ONNX node name, or the node name alone."""
        return f"{self.module} ({self.node})" if self.module and self.module not in self.node else self.node

    @property
    def flagged(self) -> bool:
        return self.flag in (Flag.KEEP_FP16, Flag.KEEP_FP32)


@dataclass(frozen=True)
class Recommendation:
    """Which nodes to keep in higher precision, whether per-layer sensitivity measured it (``measured``), and
    the ``verdict`` in words: never "no layer needs higher precision" without per-layer evidence."""

    keep_in_higher_precision: tuple[str, ...]
    precision: str  # "fp16" | "fp32"
    measured: bool = False
    verdict: str = ""


@dataclass(frozen=True)
class Gate:
    """compare's CI gate: the targets the request named (``min_agreement`` a percentage of A's predictions B
    keeps, ``max_drop`` accuracy points B may lose) and what the comparison misses of them, one line each
    (empty: every target met)."""

    min_agreement: float | None = None
    max_drop: float | None = None
    missed: tuple[str, ...] = ()

    @property
    def met(self) -> bool:
        return not self.missed


@dataclass(frozen=True)
class SensitivityEvidence:
    """What per-layer sensitivity ran on and judged by: ``source`` ("eval set" | "traffic"), ``samples``
    texts, ``basis`` (e.g. "accuracy and agreement", "nearest-neighbour agreement and cosine"), the all-INT8
    variant's fidelity on them; or, when it did not run, ``measured`` False and ``why_not``."""

    measured: bool
    why_not: str = ""
    task: str = ""  # evidence.rowfidelity task the fidelity is measured in
    source: str = ""
    samples: int = 0
    basis: str = ""
    layers: int = 0
    all_int8_agreement: float | None = None
    all_int8_cosine: float | None = None
    all_int8_accuracy: float | None = None
    reference_accuracy: float | None = None


@dataclass(frozen=True)
class FindingResult:
    """Flagged layer inputs that one cause explains (``evaluate.findings.Finding``), with the one fix."""

    cause: str
    family: str
    method: str | None
    nodes: tuple[str, ...]
    tensors: tuple[str, ...]
    same_node_tensors: tuple[str, ...]
    flags: Mapping[str, int]
    fix: str
    message: str


@dataclass(frozen=True)
class TensorHistogram:
    """|x| histogram of a layer input (``counts`` over [0, ``upper``]) and each method's clipping threshold."""

    counts: tuple[int, ...]
    upper: float
    thresholds: Mapping[str, float | None]


@dataclass(frozen=True)
class Fidelity:
    """How close B's outputs are to A's in the task's own terms.

    ``agreement``: classification, same argmax per text; token classification, same argmax per real token;
    embedding, same nearest neighbour among the eval texts; regression, within tolerance; multi-label, same
    label set. ``cosine_*``: per text between the two output vectors. ``extra``: task-specific numbers
    (``retrieval_overlap_at_k``, ``k``, ``entity_f1``, label scores such as ``A_mae_vs_labels``), None where
    one does not apply."""

    agreement: float | None
    cosine_mean: float | None
    cosine_min: float | None
    extra: Mapping[str, float | None] = field(default_factory=dict, metadata=FLATTEN)

    def to_dict(self) -> dict[str, float | None]:
        return {"agreement": self.agreement, "cosine_mean": self.cosine_mean, "cosine_min": self.cosine_min,
                **dict(self.extra)}


@dataclass(frozen=True)
class GoldResult:
    """One engine against gold word tags: per-word accuracy and entity-level scores (BIO label sets)."""

    token_accuracy: float | None
    token_accuracy_ci: Range | None
    entity_f1: float | None
    entity_precision: float | None
    entity_recall: float | None
    words: int
    unscored_words: int
    entities: int


@dataclass(frozen=True)
class GoldScores:
    engines: Mapping[str, GoldResult]
    words: int
    unscored_words: int
    entities: int
    convention: str = "one BIO tag per word; a word's prediction is its first token's"


@dataclass(frozen=True)
class TaskResult:
    """Which task compare judged the outputs as, whether labels were scored, and B's fidelity to A."""

    kind: str  # calibkit.tasks kind name
    output: str
    labelled: bool
    fidelity: Fidelity | None = None
    gold: GoldScores | None = None


@dataclass(frozen=True)
class Differences:
    accuracy: Difference | None = None
    macro_f1: Range | None = None


@dataclass(frozen=True)
class Subsets:
    """The rows each measurement used (layer statistics, sensitivity variants)."""

    layers: RowSelection | None = None
    sensitivity: RowSelection | None = None


@dataclass(frozen=True, eq=False)
class PerTextOutputs:
    """Each engine's raw outputs per text (numpy arrays, same order as the evidence rows), for callers that
    want them; never written to a document."""

    by_engine: Mapping[str, Any]
    masks: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrafficFidelity:
    """B's fidelity to A on unlabeled traffic texts (``--traffic``): what the production log says, with no
    labels needed. ``agreement_ci``: 95 % interval of the share of texts whose decision is unchanged (tasks with
    class decisions); ``flips``: texts whose decision changed; ``mean_kl``: KL divergence of the softmax."""

    evidence: Evidence
    fidelity: Fidelity
    agreement_ci: Range | None = None
    flips: int | None = None
    mean_kl: float | None = None


@dataclass(frozen=True)
class Comparison:
    """Everything ``calibkit compare`` reports: engine A against engine B (and a reference) on evidence."""

    calibkit_version: str
    eval_set: Evidence
    engines: tuple[EngineEvaluation, ...]
    task: TaskResult
    outputs: OutputStats
    thresholds: Thresholds
    recommendation: Recommendation
    agreement: float | None = None
    agreement_ci: Range | None = None
    flip_rate: float | None = None
    difference: Differences = Differences()
    warnings: tuple[str, ...] = ()
    seed: int = 0
    subsets: Subsets = Subsets()
    disagreements: tuple[Disagreement, ...] = ()
    flips_by_confidence: tuple[ConfidenceBand, ...] = ()
    layers: tuple[LayerVerdict, ...] = ()
    layer_samples: int = 0
    sensitivity_samples: int = 0
    histograms: Mapping[str, TensorHistogram] = field(default_factory=dict)
    traffic: TrafficFidelity | None = None
    sensitivity: SensitivityEvidence | None = None
    findings: tuple[FindingResult, ...] = ()
    time_estimate: TimeEstimate | None = None  # the long part's estimate before it started, and its actual time
    speed: Speed | None = None  # B served beside A (reference "A"); None: ``speed_note`` says why
    speed_note: str | None = None
    gate: Gate | None = None  # the CI gate of the request's targets; None: it named none
    per_text: PerTextOutputs | None = field(default=None, compare=False, repr=False, metadata=NOT_IN_DOCUMENT)

    @property
    def engine_a(self) -> EngineEvaluation:
        return self.engines[0]

    @property
    def engine_b(self) -> EngineEvaluation:
        return self.engines[1]

    @property
    def keep_in_higher_precision(self) -> tuple[str, ...]:
        return self.recommendation.keep_in_higher_precision

    @property
    def accuracy_diff(self) -> Difference | None:
        return self.difference.accuracy

    @property
    def flagged(self) -> tuple[LayerVerdict, ...]:
        return tuple(v for v in self.layers if v.flag is not Flag.OK)

    def layer(self, node: str) -> LayerVerdict | None:
        return next((v for v in self.layers if v.node == node), None)


# ---------------------------------------------------------------- tune


@dataclass(frozen=True)
class TuneEvalSet:
    """The eval set tune judged on: the evidence and how it was split (search, holdout, sensitivity subset)."""

    path: str
    count: int
    search: int
    holdout: int
    sensitivity_samples: int
    labels: str  # "given" | "FP32 predictions (the eval set has none)"
    evidence: Evidence | None = None
    # unlabeled traffic texts judged for agreement with FP32 (--traffic), and how many fell in each split
    traffic: Evidence | None = None
    traffic_search: int = 0
    traffic_holdout: int = 0


# what a result's agreement counts, per task (evidence.rowfidelity): words for documents and the terminal
AGREEMENT_NOUNS: Mapping[str, str] = {"classification": "FP32's predictions",
                                      "embedding": "texts' nearest neighbours in the FP32 index",
                                      "token-classification": "FP32's token tags"}


@dataclass(frozen=True)
class TuneTarget:
    """What the plan must keep: accuracy within ``max_drop`` points of FP32 (None: fidelity alone) and, with
    ``min_agreement``, that percentage of FP32's predictions."""

    relative: bool
    fp32_accuracy: float | None  # on the search split
    fp32_accuracy_holdout: float | None
    threshold: float | None  # the lowest accepted accuracy on the search split
    met: bool
    max_drop: float | None = None
    min_agreement: float | None = None
    agreement_confidence: float = 0.9
    # embeddings: the mean cosine to FP32 the plan must keep; task: what agreement means (evidence.rowfidelity)
    min_cosine: float | None = None
    task: str = "classification"

    @property
    def target_accuracy(self) -> float | None:
        return self.threshold


@dataclass(frozen=True)
class MethodChoice:
    """The calibration tables measured all-INT8 on the search split (on its texts most at risk of flipping:
    ``chosen_by`` says how many) and the one the search started from."""

    requested: str
    chosen: str
    all_int8_accuracy_search: Mapping[str, float | None] = field(default_factory=dict)
    all_int8_flip_rate_search: Mapping[str, float | None] = field(default_factory=dict)
    all_int8_mean_kl_search: Mapping[str, float | None] = field(default_factory=dict)
    all_int8_cosine_search: Mapping[str, float | None] = field(default_factory=dict)
    per_tensor_counts: Mapping[str, int] = field(default_factory=dict)
    chosen_by: str = "fewest flips of FP32's predictions on the search split (then KL divergence)"


@dataclass(frozen=True)
class Candidate:
    """One plan the search measured on the search split (``kept_nodes`` stay in higher precision)."""

    id: int
    stage: str
    kept_nodes: tuple[str, ...]
    int8_flops_fraction: float
    accuracy_search: float | None
    method: str
    accepted: bool
    meets_target: bool
    accuracy_holdout: float | None = None
    agreement_search: float | None = None
    cosine_search: float | None = None
    # search rows its decision rested on (a sequential rule stops early); the accepted plan's numbers above are
    # over the whole search split all the same (its remaining rows are evaluated after the search)
    texts_search: int | None = None


@dataclass(frozen=True)
class SpeedChoice:
    """How tune chose among the plans the holdout confirmed (every one of them carries the claim: fixed-sequence
    testing rejects each hypothesis before the first failure with the family's error kept at alpha): each
    ``candidates``' served model timed beside FP32 (``speeds``, in the same order), the fastest at its slowest
    batch size written (``chosen``), a plan within ``tie`` of it counting as as fast, and then the most faithful
    on the search split; ``most_int8``: the one confirmation alone would have written."""

    candidates: tuple[int, ...]
    speeds: tuple[Speed, ...]
    chosen: int
    most_int8: int
    tie: float


@dataclass(frozen=True)
class ServedCheck:
    """The served model (ONNX Runtime's fused integer kernels, every graph optimization) against the arithmetic
    tune certified (exact Q/DQ) on ``texts`` holdout texts whose agreement counts: the agreement with FP32 of
    each, and ``changed`` texts on which the two disagree about the text's fidelity, with the one-sided 95 %
    upper bound of that share (Clopper-Pearson)."""

    texts: int
    served_agreement: float | None
    served_agreement_ci: Range | None
    certified_agreement: float | None
    changed: int
    changed_upper_share: float
    served_cosine: float | None = None


@dataclass(frozen=True)
class EvidenceCost:
    """What the plan search paid for its decisions (evidence.plan_decisions): texts of the search split
    evaluated per candidate under ``rule`` ("sequential" | "whole-split"); ``completion_texts``: rows evaluated
    after the search so the accepted plan's numbers rest on the whole split."""

    rule: str
    split_texts: int
    candidates: int
    texts_median: float
    texts_total: int
    completion_texts: int = 0
    confirm_texts: int = 0  # holdout texts the fixed-sequence confirmation evaluated, every candidate it judged


FP32_PHASE = "FP32 reference"  # the phase that is one FP32 pass over the evidence


@dataclass(frozen=True)
class PhaseCost:
    """Where a run's time went, one step at a time: wall ``seconds``, ``texts`` evaluated (FP32 or a variant;
    read back from a resumed run's ledger: not counted), ``cpu_seconds`` of every process (the driver's threads
    and the workers'), ``utilisation`` = CPU / (wall x ``cpus``), and the wall time as a multiple of one FP32
    pass over the evidence (``fp32_passes``; the FP32 reference phase is that pass)."""

    phase: str
    seconds: float
    texts: int = 0
    cpu_seconds: float = 0.0
    utilisation: float | None = None
    fp32_passes: float | None = None


# ---------------------------------------------------------------- time up front


@dataclass(frozen=True)
class StepEstimate:
    """One step of a run's long part: its estimated wall time (likely and worst, seconds) and, once the run is
    over, the time it took (None where that step is not timed on its own)."""

    step: str
    likely_seconds: float
    worst_seconds: float
    actual_seconds: float | None = None


@dataclass(frozen=True)
class Shortcut:
    """The one option that shortens a run the most (``option``: as typed on the command line, with its value)
    and the estimate of the run with it."""

    option: str
    likely_seconds: float
    worst_seconds: float


@dataclass(frozen=True)
class TimeEstimate:
    """How long a run's long part was expected to take before it started, and how long it took. Priced from
    ``text_seconds``, the wall seconds one FP32 text cost on this machine with the run's batching, measured on
    ``measured_texts`` of the run's texts (``evaluate.estimate``)."""

    text_seconds: float
    measured_texts: int
    likely_seconds: float
    worst_seconds: float
    steps: tuple[StepEstimate, ...] = ()
    shortcut: Shortcut | None = None
    actual_seconds: float | None = None  # the long part's wall time, set when it ends
    resumed: int = 0  # evaluations an earlier run left in the ledger, reused (the estimate counts them as to do)


def _duration(seconds: float) -> tuple[str, str]:
    if seconds < 90:
        return str(max(1, round(seconds))), "s"
    if seconds < 90 * 60:
        return str(round(seconds / 60)), "min"
    return f"{seconds / 3600:.1f}", "h"


def duration_text(seconds: float) -> str:
    """``40 s``, ``12 min``, ``1.5 h``: a duration as a person reads an estimate (``1 s`` at the least)."""
    return " ".join(_duration(seconds))


def span_text(likely: float, worst: float) -> str:
    """``4-7 min``, ``50 s to 2 min``: a likely-worst range, one value where the two round alike."""
    (a, ua), (b, ub) = _duration(likely), _duration(worst)
    if (a, ua) == (b, ub):
        return f"{a} {ua}"
    return f"{a}-{b} {ub}" if ua == ub else f"{a} {ua} to {b} {ub}"


@dataclass(frozen=True)
class ConfirmStep:
    """One candidate tested on the holdout split by the confirmation (``candidate``: its Candidate.id):
    whether the search's decision rule says it meets the target there, on how many holdout texts that was
    decided, and the agreement and cosine those texts gave."""

    candidate: int
    int8_flops_fraction: float
    meets: bool
    texts: int
    agreement: float | None = None
    cosine: float | None = None


@dataclass(frozen=True)
class Confirmation:
    """How the holdout split confirmed the plan (evidence.confirm: fixed-sequence testing). The candidates that
    met the target on the search split (when many did, the one with the least INT8 and those with the most:
    TuneRequest.confirm_candidates) were tested on the holdout from the least INT8 up, with the search's
    decision ``rule`` at ``confidence`` (its final test at ``final_test_confidence``), stopping at the first
    that failed. ``chosen``: the candidate written, the last one confirmed (None: the holdout confirmed none,
    and the search's own choice is written); ``search_choice``: the candidate the search alone chose."""

    rule: str
    confidence: float
    final_test_confidence: float
    holdout_texts: int
    chosen: int | None
    search_choice: int | None
    steps: tuple[ConfirmStep, ...] = ()


@dataclass(frozen=True)
class PlanEvidence:
    """The final plan against FP32 on one split: paired accuracy difference, agreement, flips."""

    accuracy_minus_fp32: Difference
    agreement: Range
    flips: int
    n: int  # rows whose accuracy counts
    agreement_n: int | None = None  # rows whose agreement counts (the traffic's), when they are others
    cosine: Range | None = None  # embeddings: mean cosine to FP32's vectors, 95 % interval


@dataclass(frozen=True)
class HoldoutVerdict:
    """Whether the holdout split supports the claim: True, False, or None (no holdout / nothing to verify);
    per constraint 'supported' | 'not confirmed' | 'contradicted' | 'not checked (no texts in the holdout)'."""

    supported: bool | None
    text: str
    by_constraint: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TunePlan:
    """The plan tune chose: the nodes kept in higher precision (with why), its INT8 share of the linear FLOPs,
    its measurements on both splits and the holdout verdict."""

    kept_nodes: tuple[str, ...]
    int8_flops_fraction: float
    method: str
    accuracy_search: float | None
    accuracy_holdout: float | None = None
    all_int8_accuracy_holdout: float | None = None
    all_int8_agreement_holdout: float | None = None
    agreement_search: float | None = None
    agreement_holdout: float | None = None
    cosine_search: float | None = None
    cosine_holdout: float | None = None
    all_int8_cosine_holdout: float | None = None
    # the holdout texts all-INT8's numbers were measured on: a random sample once a plan is confirmed
    all_int8_texts_holdout: int | None = None
    search_evidence: PlanEvidence | None = None
    holdout_evidence: PlanEvidence | None = None
    holdout_verdict: HoldoutVerdict | None = None
    reasons: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    kept_modules: Mapping[str, str] = field(default_factory=dict)
    # how fast the plan serves on its target beside FP32 (None: not measured, ``speed_note`` says why)
    speed: Speed | None = None
    speed_note: str | None = None
    served: ServedCheck | None = None  # the served arithmetic against the certified one
    # onnxruntime target: how the served model runs the weight MatMuls the plan keeps (blockwise | fp32)
    kept_weights: str | None = None

    def reasons_for(self, node: str) -> tuple[str, ...]:
        return tuple(self.reasons.get(node, ()))

    def label(self, node: str) -> str:
        """A kept node as compare's layers name it (:attr:`LayerVerdict.label`): its module path with the node."""
        module = self.kept_modules.get(node, "")
        return f"{module} ({node})" if module and module not in node else node


@dataclass(frozen=True)
class TuneSplit:
    search: RowSelection
    holdout: RowSelection
    sensitivity: RowSelection
    seed: int


@dataclass(frozen=True)
class LinearFlops:
    """How much of the model's linear work the plans choose among: ``plain_share`` of the MatMul/Gemm FLOPs
    (the rest is inside fused ops that stay FP32)."""

    plain_share: float
    fused_fp32: tuple[str, ...] = ()
    uncounted: tuple[str, ...] = ()


@dataclass(frozen=True)
class Peer:
    name: str
    accuracy: float | None


@dataclass(frozen=True)
class SmoothingChoice:
    """Whether tune also measured the model smoothed (SmoothQuant, alpha auto, its FP32 function checked) and
    searched the plan on it: its tables carry the ``+smooth`` suffix in :class:`MethodChoice`. ``model``: the
    smoothed model folder in OUT when the plan is built on it; ``note``: why it was not tried."""

    tried: bool
    chosen: bool = False
    model: str | None = None
    activations_smoothed: int | None = None
    max_output_deviation: float | None = None
    note: str | None = None


@dataclass(frozen=True)
class TuneResult:
    """Everything ``calibkit tune`` reports: the target, the tables, every candidate measured, the final plan
    and its verdict."""

    calibkit_version: str
    eval_set: TuneEvalSet
    target: TuneTarget
    methods: MethodChoice
    final: TunePlan
    candidates: tuple[Candidate, ...] = ()
    split: TuneSplit | None = None
    linear_flops: LinearFlops | None = None
    warnings: tuple[str, ...] = ()
    peers: tuple[Peer, ...] = ()
    statistics_reused: bool = False
    evaluations_reused: int = 0
    seconds: float = 0.0
    smoothing: SmoothingChoice | None = None
    evidence_cost: EvidenceCost | None = None
    confirmation: Confirmation | None = None
    phases: tuple[PhaseCost, ...] = ()  # where the time went, step by step
    cpus: int = 0  # CPUs the run could use
    time_estimate: TimeEstimate | None = None  # the long part's estimate before it started, and its actual time
    speed_choice: SpeedChoice | None = None  # the fastest confirmed plan, measured

    @property
    def speed_lines(self) -> tuple[str, ...]:
        """What the run measured of the plan's serving speed, the choice among the confirmed plans, and the
        served model against the certified arithmetic, in words (the terminal and the report say them)."""
        f, lines = self.final, []
        if f.speed is not None:
            sp = f.speed
            lines.append(f"served speed (ONNX Runtime, every graph optimization, {sp.threads} threads, {sp.rounds} "
                         f"interleaved rounds on {sp.texts} holdout texts; {sp.cpu}: {sp.isa}): {sp.words}")
        elif f.speed_note:
            lines.append(f"served speed {f.speed_note}")
        sc = self.speed_choice
        if sc is not None:
            share = {c.id: c.int8_flops_fraction for c in self.candidates}
            each = "; ".join(f"candidate {i} ({100 * share.get(i, 0.0):.1f} % INT8) {s.words}"
                             for i, s in zip(sc.candidates, sc.speeds))
            why = ("the one with the most INT8 work" if sc.chosen == sc.most_int8 else
                   f"not candidate {sc.most_int8}, the one with the most INT8 work")
            lines.append(f"fastest confirmed plan: candidate {sc.chosen}, {why} (speed at the slowest batch size; "
                         f"within {100 * sc.tie:g} % the fastest at the other, then the most faithful) — {each}")
        sv = f.served
        if sv is not None and sv.served_agreement is not None:
            ci = sv.served_agreement_ci
            band = (f" [{100 * ci.low:.2f}, {100 * ci.high:.2f}]" if ci is not None and ci.low is not None
                    and ci.high is not None else "")
            lines.append(f"served model against the certified arithmetic, {sv.texts:,} holdout texts: agreement with "
                         f"FP32 {100 * sv.served_agreement:.2f} %{band} served, "
                         f"{100 * (sv.certified_agreement or 0.0):.2f} % certified; {sv.changed} texts differ "
                         f"(at most {100 * sv.changed_upper_share:.2f} % at 95 %)")
        return tuple(lines)

    @property
    def fp32_passes(self) -> float | None:
        """The whole run's wall time in FP32 passes over its evidence (None when not measured)."""
        ref = next((p for p in self.phases if p.phase == FP32_PHASE), None)
        if ref is None or not ref.seconds:
            return None
        return sum(p.seconds for p in self.phases) / ref.seconds

    @property
    def met_target(self) -> bool:
        return self.target.met

    @property
    def claim(self) -> str:
        """One line on what the written plan may claim: confirmed (met on the search split, confirmed on the
        holdout and supported by it), or why not."""
        conf = self.confirmation
        verdict = self.final.holdout_verdict
        if not self.target.met:
            return "target NOT met: no plan met it on the search split (the plan measured closest to FP32 is written)"
        if conf is not None and conf.chosen is None:
            return "plan NOT confirmed: the holdout confirmed no candidate (the search's choice is written)"
        if verdict is not None and verdict.supported is False:
            return "plan NOT supported: the holdout does not support the claim"
        if conf is not None:
            return "target met and the plan confirmed on the holdout"
        return "target met on the search split"

    @property
    def holdout_says(self) -> str | None:
        """What the holdout's verdict says of the written plan, in the claim's terms (None: no verdict): an
        estimate that meets the target on a holdout that confirmed no plan supports nothing."""
        verdict = self.final.holdout_verdict
        if verdict is None or verdict.supported is None:
            return None
        if not verdict.supported:
            return "the holdout does NOT support the claim"
        if self.confirmation is not None and self.confirmation.chosen is None:
            return "the holdout's estimate meets the target, but the holdout confirmed no plan"
        return "the holdout supports the claim"

    @property
    def claim_holds(self) -> bool:
        """Met on the search split, confirmed on the holdout when tune confirms, and not refused by the holdout's
        verdict: what ``tune --fail-if-missed`` requires."""
        conf = self.confirmation
        verdict = self.final.holdout_verdict
        return (self.target.met and (conf is None or conf.chosen is not None)
                and not (verdict is not None and verdict.supported is False))

    @property
    def kept_nodes(self) -> tuple[str, ...]:
        return self.final.kept_nodes

    @property
    def all_int8(self) -> Candidate | None:
        return next((c for c in self.candidates if not c.kept_nodes), None)


Result = Comparison | TuneResult
