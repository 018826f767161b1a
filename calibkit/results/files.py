"""The typed values of the documents calibkit writes beside the compare and tune reports: ``calibration.json``
(:class:`CalibrationDocument`), a smoothed model folder's ``smoothing.json`` (:class:`SmoothingRecord`), an
engine's sidecar (:class:`EngineSidecar`), a TensorRT repository's ``trt_profiles.json`` (:class:`TrtProfiles`)
and the demo's ``summary.json`` (:class:`DemoSummary`). Like the results of
:mod:`calibkit.results.runs`, each mirrors its JSON document field by field, and :mod:`calibkit.results.codec`
writes and parses it from these annotations, with its own format tag.

A field made with :func:`absent` is left out of the document while it is None: the writers of one document
kind do not all know the same things (``calibrate --from-cache`` has no statistics, ``tune`` no per-tensor
summaries), and an older document may lack a newer field; both read back as None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from calibkit.results.runs import (
    ConfidenceBand,
    Difference,
    Evidence,
    HoldoutVerdict,
    PlanEvidence,
    Range,
    SmoothingChoice,
    Speed,
    TimeEstimate,
)
from calibkit.types import CalibrationTable, Precision

#: field metadata: leave the field out of the JSON document while its value is None
OMIT_IF_NONE = {"omit_if_none": True}
#: field metadata: the field is in the document (null when None) exactly when the ``tokenizer`` field is not None
WRITTEN_WITH_TOKENIZER = {"written_with": "tokenizer"}


def absent() -> Any:
    """A field that is None, and then not in the document, unless its writer knows it."""
    return field(default=None, metadata=OMIT_IF_NONE)


# ---------------------------------------------------------------- calibration.json


@dataclass(frozen=True)
class TensorRecord:
    """One calibrated tensor: its range, and (from ``calibrate``, not from a TensorRT cache) the statistics
    summary it was computed from (:meth:`calibkit.calibrate.stats.ActivationStats.summary`)."""

    amax: float
    scale: float
    method: str
    count: int | None = absent()
    nan: int | None = absent()
    posinf: int | None = absent()
    neginf: int | None = absent()
    min: float | None = absent()
    max: float | None = absent()
    absmax: float | None = absent()
    p99_99: float | None = absent()


@dataclass(frozen=True)
class CalibrationSetRecord:
    """The calibration set the statistics came from (``path``: relative to the document's folder on disk)."""

    id: str
    path: str
    manifest_sha256: str
    texts: int
    truncated: int
    max_length: int | None


@dataclass(frozen=True)
class StatisticsRecord:
    """Where the statistics came from: reused from the cache or collected, their bins, and what the collection
    recorded (texts, batches, padding, seconds per phase, the set key: ``collected``, beside the two)."""

    reused: bool
    num_bins: int
    collected: Mapping[str, Any] = field(default_factory=dict, metadata={"flatten": True})


@dataclass(frozen=True)
class TrtCacheRecord:
    """The TensorRT calibration cache: the algorithm and version written, or (``calibrate --from-cache``) the
    cache read, with its entries that matched no quantized tensor, held scale 0 or were not finite."""

    algorithm: str
    version: int
    source: str | None = absent()
    unmatched: tuple[str, ...] | None = absent()
    zero: tuple[str, ...] | None = absent()
    non_finite: tuple[str, ...] | None = absent()


@dataclass(frozen=True)
class ClipRecord:
    """Tensors of one family whose range cuts them far below the largest |x| observed
    (:class:`calibkit.quantize.rangecheck.ClipWarning`)."""

    family: str
    method: str
    tensors: tuple[str, ...]
    amax: tuple[float, ...]
    observed_absmax: tuple[float, ...]
    of: int
    threshold: float
    suggestion: str
    message: str


@dataclass(frozen=True)
class TuneRecord:
    """The target of the tune run that wrote the table."""

    max_drop: float
    relative: bool


@dataclass(frozen=True)
class DocumentDigests:
    """The sha256 of every file the document names, as written: the source model, the tokenizer files and
    label names, the files beside the document (by their key in ``files``)."""

    source_model: str | None = absent()
    tokenizer: str | None = absent()
    labels: str | None = field(default=None, metadata=WRITTEN_WITH_TOKENIZER)  # null: no label names
    files: Mapping[str, str] | None = absent()


@dataclass(frozen=True)
class CalibrationDocument:
    """``calibration.json``: the calibration table and everything needed to trust and reproduce it.

    Every field but the table is written by those that know it: ``calibrate`` writes them all but ``tune``,
    ``calibrate --from-cache`` has no statistics, ``tune`` no per-tensor summaries or warnings, and a bare
    table document (tune's per-method tables) only its ``target`` (None: ``tensorrt``).
    ``source_model``, ``tokenizer`` and ``calibration_set.path`` are relative to the document's folder when
    ``paths`` says so (documents written before that rule: relative to the folder their run ran in); ``files``
    names the files written beside it (``model``, ``cache``, ``stats``, ``plan``)."""

    table: CalibrationTable
    target: str | None = absent()
    op_types: tuple[str, ...] | None = absent()
    exclude: tuple[str, ...] | None = absent()
    quantized_nodes: tuple[str, ...] | None = absent()
    kept_nodes: tuple[str, ...] | None = absent()
    missing_ranges: tuple[str, ...] | None = absent()
    files: Mapping[str, str] | None = absent()
    zero_ranges: tuple[str, ...] | None = absent()
    fused_fp32: tuple[str, ...] | None = absent()
    tensors: Mapping[str, TensorRecord] | None = absent()
    calibration_set: CalibrationSetRecord | None = absent()
    statistics: StatisticsRecord | None = absent()
    trt_cache: TrtCacheRecord | None = absent()
    warnings: tuple[str, ...] | None = absent()
    clipping: tuple[ClipRecord, ...] | None = absent()
    source_model: str | None = absent()
    tokenizer: str | None = absent()
    tune: TuneRecord | None = absent()
    timings: Mapping[str, float] | None = absent()
    paths: str | None = absent()
    sha256: DocumentDigests | None = absent()


# ---------------------------------------------------------------- the demo's summary.json
# What `calibkit demo run` measured, for its index page and the README's measured block. Its parts that are
# results (intervals, differences, plan evidence, verdicts) are the result types themselves.


@dataclass(frozen=True)
class MethodFidelity:
    """One calibration method's INT8 model against FP32 on the eval texts, with 95 % intervals."""

    accuracy: Range
    accuracy_minus_fp32: Difference
    agreement: Range
    flips: int
    n: int
    mean_kl: float


@dataclass(frozen=True)
class DemoSmoothing:
    """The smoothed copy of the model the demo calibrated too."""

    model: str
    alpha: str
    groups: int
    smoothed: int
    max_output_deviation: float
    gain_db: tuple[float, ...]


@dataclass(frozen=True)
class DemoCompare:
    """FP32 against the best method's INT8 engine on the whole eval split."""

    agreement: float | None
    agreement_ci: Range | None
    accuracy_difference: Difference | None
    keep_in_higher_precision: tuple[str, ...]
    insufficient_evidence: tuple[str, ...]
    flips_by_confidence: tuple[ConfidenceBand, ...]
    warnings: tuple[str, ...]
    engines: Mapping[str, float | None]


@dataclass(frozen=True)
class DemoCompareFp16:
    """FP16 against the INT8 engine."""

    agreement: float | None
    engines: Mapping[str, float | None]


@dataclass(frozen=True)
class DemoTune:
    """The tuned mixed-precision plan on the model as the user has it."""

    met_target: bool
    max_drop_points: float
    kept_nodes: tuple[str, ...]
    int8_flops_fraction: float
    fp32_accuracy_holdout: float | None
    accuracy_holdout: float | None
    accuracy_search: float | None
    fp32_accuracy_search: float | None
    min_agreement_percent: float | None
    method: str
    agreement_search: float | None
    agreement_holdout: float | None
    holdout_evidence: PlanEvidence | None
    holdout_verdict: HoldoutVerdict | None
    holdout_examples: int
    evaluations_reused: int
    out: str
    model: str
    smoothing: SmoothingChoice | None
    traffic: Evidence | None
    traffic_search: int
    traffic_holdout: int
    layout: str | None = absent()  # the Q/DQ layout tuned (the target it is served on)
    speed: Speed | None = absent()  # the plan served beside FP32 on this machine
    speed_note: str | None = absent()


@dataclass(frozen=True)
class DemoMethodTune:
    """The same search restricted to one calibration method."""

    met_target: bool
    kept_nodes: tuple[str, ...]
    int8_flops_fraction: float
    accuracy_holdout: float | None
    all_int8_accuracy_holdout: float | None
    accuracy_search: float | None
    candidates: int
    fp32_accuracy_search: float | None
    fp32_accuracy_holdout: float | None


@dataclass(frozen=True)
class DemoEmbedder:
    """The same weights as a sentence embedder, tuned from the log alone, then compared with FP32."""

    model: str
    met_target: bool
    min_agreement_percent: float | None
    min_cosine: float | None
    int8_flops_fraction: float
    kept_nodes: tuple[str, ...]
    method: str
    smoothed: bool
    traffic_search: int
    traffic_holdout: int
    agreement_holdout: float | None
    cosine_holdout: float | None
    all_int8_agreement_holdout: float | None
    all_int8_cosine_holdout: float | None
    holdout_verdict: HoldoutVerdict | None
    compare_texts: int
    compare_top1: float | None
    compare_overlap_at_k: float | None
    compare_cosine_mean: float | None
    holdout_evidence: PlanEvidence | None = absent()  # the plan against FP32 on the holdout, with intervals


@dataclass(frozen=True)
class DemoEngine:
    layout: str
    path: str


@dataclass(frozen=True)
class DemoDeploy:
    """The Triton model repository of the tuned plan (``link``: its README, relative to the index page)."""

    repository: str
    name: str
    bucket_maxes: tuple[int, ...]
    waste: float
    waste_one_profile: float
    preferred_batch_size: tuple[int, ...]
    link: str
    layout: str | None = absent()  # the INT8 layout shipped (the one measured)
    agreement_with_fp32: float | None = absent()  # deploy's measurement of what it wrote, on the traffic
    agreement_ci: Range | None = absent()
    agreement_texts: int | None = absent()
    speed: Speed | None = absent()  # deploy's measurement: the served model beside FP32


@dataclass(frozen=True)
class DemoSummary:
    """``summary.json`` of `calibkit demo run`: every step's measurements (``timings_s``: seconds per step)."""

    calibkit_version: str
    variant: str
    model_accuracy_recorded: float | None
    eval_examples: int
    calibration_set: str
    calibration_texts: int
    fp32_accuracy: float
    method_accuracy: Mapping[str, float]
    method_fidelity: Mapping[str, MethodFidelity]
    best_method: str
    best_method_by: str
    statistics_reused: Mapping[str, bool]
    smoothing: DemoSmoothing | None
    compare_fp32_vs_int8: DemoCompare
    compare_fp16_vs_int8: DemoCompareFp16
    tune: DemoTune
    tune_by_method: Mapping[str, DemoMethodTune]
    embedder: DemoEmbedder | None
    int8_engine: DemoEngine
    deploy: DemoDeploy | None
    timings_s: Mapping[str, float]
    time_estimate: TimeEstimate | None = absent()  # what the demo said its steps would take, and what they took


@dataclass(frozen=True)
class TrtProfiles:
    """A TensorRT repository's ``NAME/trt_profiles.json``: what ``python -m calibkit.deploy.engine`` builds the
    plan from (the ONNX and plan paths, relative to the file's folder; the workspace; each optimization
    profile's ``SeqProfile`` fields)."""

    onnx: str
    plan: str
    workspace_mib: int
    profiles: tuple[dict[str, int], ...]


# ---------------------------------------------------------------- smoothing.json


@dataclass(frozen=True)
class SmoothedActivation:
    """One activation feeding MatMul/Gemm weights: the alpha chosen (None: left as it was, smoothing would not
    reduce the error), the relative squared error of its fake-quantized product before and after, and the range
    of the per-channel scale applied (None when not smoothed)."""

    tensor: str
    alpha: float | None
    error_before: float | None
    error_after: float | None
    gain_db: float
    scale_min: float | None
    scale_max: float | None


@dataclass(frozen=True)
class SmoothingRecord:
    """A smoothed model folder's ``smoothing.json`` (``calibkit smooth``'s, and the copy tune smooths into
    ``OUT/smoothed-model``): the model it was smoothed from (``source_model``, relative to the file's folder,
    and its sha256), the calibration set's id, what the statistics read, and per activation what was done."""

    alpha: str | float  # "auto", or the --alpha given
    source_sha256: str
    calibration_set_id: str
    calibkit: str
    paths: str  # provenance.PATHS_RELATIVE: its relative paths are relative to its own folder
    source_model: str
    texts: int
    tokens: int
    sampled_rows: Mapping[str, int]
    groups: int
    smoothed: int
    not_smoothed_layout: tuple[str, ...]
    max_output_deviation: float
    layers: tuple[SmoothedActivation, ...]
    timings: Mapping[str, float]


# ---------------------------------------------------------------- an engine's sidecar


@dataclass(frozen=True)
class EngineBuildFacts:
    """What ``calibkit build`` adds to a sidecar of what it made, each field present only where it applies: the
    Q/DQ layout of an INT8 model (``target``, the layout its ranges were measured in, its 7- or 8-bit weights,
    nodes quantized and tensors with no or a zero range), the FP16 nodes of an FP16 model, the Q/DQ file an
    engine was built from, the model a smoothed copy was smoothed from, and TensorRT's build outputs."""

    target: str | None = absent()
    measured_layout: str | None = absent()
    quantized_nodes: int | None = absent()
    missing_ranges: tuple[str, ...] | None = absent()
    zero_ranges: tuple[str, ...] | None = absent()
    weight_bits: int | None = absent()
    fp16_nodes: int | None = absent()
    qdq_source: str | None = absent()
    smoothed_from_sha256: str | None = absent()
    profile: Mapping[str, int] | None = absent()
    timing_cache: str | None = absent()
    layers_json: str | None = absent()
    tensorrt_version: str | None = absent()


@dataclass(frozen=True)
class EngineSidecar:
    """``ENGINE.calibkit.json``, beside every engine file ``calibkit build`` writes: what the file holds
    (precision, the backend it runs in, the nodes kept out of INT8/FP16), what it was built from (the source
    model, calibration.json and tokenizer folder, relative to the sidecar's folder, each with its sha256), the
    versions that built it, and :class:`EngineBuildFacts`. ``engine_fingerprint`` tells this build's file from
    another one written under the same name (``enginefiles.artifact.fingerprint``)."""

    path: str  # the engine file's name, in the sidecar's folder
    precision: Precision
    backend: str
    source_model_sha256: str
    calibration_sha256: str | None
    tokenizer: str | None
    kept_higher_precision: tuple[str, ...]
    source_model: str | None
    calibration_json: str | None
    tokenizer_sha256: str | None
    labels_sha256: str | None
    versions: Mapping[str, str]
    extra: EngineBuildFacts
    engine_fingerprint: str | None = None
