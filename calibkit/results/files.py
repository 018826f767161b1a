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
    kept_weights: str | None = absent()  # how kept weight MatMuls are served: blockwise | fp32
    blockwise_nodes: tuple[str, ...] | None = absent()  # those served as 8-bit blockwise MatMulNBits
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


# ---------------------------------------------------------------- a calibration set's manifest.json
# What `calibkit sample` recorded about the set it drew (SampleRecord), beside the two facts every set's manifest
# holds (CalibrationSetManifest: the sha256 of texts.jsonl and the count). A set written without a sample (the
# library's write_calibration_set with no record) has only those two. Fields that earlier versions did not write
# read as absent: the warnings, a label field's stratification record, the oversized-text counts, ``paths``.


@dataclass(frozen=True)
class ManifestSource:
    """The log a set was drawn from: its path (relative to the manifest's folder when the manifest's ``paths``
    says so, else as given), its size and sha256 when it was read, and whether it was gzip-compressed. An empty
    path or sha256 names no log."""

    path: str
    size_bytes: int | None
    sha256: str
    gzip: bool


@dataclass(frozen=True)
class ManifestTextField:
    """The log's text field paths (fallbacks in order), and whether they were auto-detected."""

    paths: tuple[str, ...]
    auto_detected: bool


@dataclass(frozen=True)
class BrokenLines:
    """Lines of one broken kind: how many, and the first few line numbers."""

    count: int
    first_lines: tuple[int, ...]


@dataclass(frozen=True)
class OversizedTexts:
    """Texts longer than ``max_chars`` characters, cut to that length before processing."""

    count: int
    first_lines: tuple[int, ...]
    max_chars: int


@dataclass(frozen=True)
class ManifestLines:
    """How the log read (:meth:`calibkit.data.logs.ReadStats.record`): lines read and usable, broken lines by
    kind (only kinds that occurred), texts cut, and whether a gzip stream ended early."""

    gzip_truncated: bool
    read: int
    usable: int
    broken_total: int
    broken: Mapping[str, BrokenLines]
    oversized: OversizedTexts | None = absent()


@dataclass(frozen=True)
class ManifestCleanup:
    """What cleanup removed: ``<script>``/``<style>`` blocks, and texts that held nothing else."""

    policy: str
    script_blocks_removed: int
    texts_emptied_by_cleanup: int


@dataclass(frozen=True)
class ManifestRedaction:
    """Whether personal data was redacted (a manifest that does not say: it was), and how often, by kind."""

    counts: Mapping[str, int]
    enabled: bool = True


@dataclass(frozen=True)
class HotText:
    """One of the texts seen most often: its count, and its first 80 characters."""

    seen: int
    text: str


@dataclass(frozen=True)
class ManifestDedup:
    """De-duplication over normalized texts: distinct texts, duplicate lines (exact and after normalization),
    groups seen more than once and the hottest texts."""

    normalization: str
    distinct_texts: int
    duplicate_lines: int
    exact_duplicates: int
    normalized_duplicates: int
    groups_seen_more_than_once: int
    hottest: tuple[HotText, ...]


@dataclass(frozen=True)
class OverMax:
    """Texts over the maximum length: estimated in the log (weighted), counted in the sample, and which."""

    population_estimated: int
    sample: int
    sample_indices: tuple[int, ...]


@dataclass(frozen=True)
class LogHistogram:
    """The estimated token lengths of every distinct text in the log, per bin (``edges``: each bin's start)."""

    edges: tuple[int, ...]
    counts: tuple[int, ...]
    over_max: int


@dataclass(frozen=True)
class ManifestLength:
    """How lengths were measured (the tokenizer's, or the word-piece estimate), the maximum length, the texts
    over it, and the log's estimated histogram."""

    measure: str
    max_length: int
    over_max: OverMax
    log_histogram_estimated: LogHistogram


@dataclass(frozen=True)
class Representativeness:
    """The sample's token lengths against the log's: the share of each in every bin, PSI, KS, the verdict
    and the PSI thresholds it was read by."""

    measure: str
    bin_edges: tuple[int, ...]
    population_fraction: tuple[float, ...]
    sample_fraction: tuple[float, ...]
    psi: float
    ks: float
    verdict: str
    thresholds: Mapping[str, str]


@dataclass(frozen=True)
class LabelStratification:
    """A label field's distinct values (a lower bound past the count kept exactly), the most worth stratifying
    by for the sample's size, and whether the sample was stratified by label."""

    distinct: int
    distinct_is_lower_bound: bool
    limit: int
    stratified: bool


@dataclass(frozen=True)
class ManifestTopics:
    """The topic clusters: how they were made, how many, and one example text each (by cluster number)."""

    method: str
    clusters: int
    examples: Mapping[str, str]


@dataclass(frozen=True)
class CandidatePool:
    """The candidates kept by the streaming pass, and the most kept per stratum."""

    size: int
    per_stratum_capacity: int


@dataclass(frozen=True)
class StratumRow:
    """One stratum (length bucket x label x topic): its weighted population, candidates and texts sampled."""

    length_bucket: str
    label: str | None
    topic: int
    population: float
    candidates: int
    sample: int


@dataclass(frozen=True)
class ManifestStrata:
    """The strata the sample was allocated over (``labels``: the label values stratified by, None when the
    sample was not stratified by label)."""

    definition: str
    length_buckets: tuple[str, ...]
    labels: tuple[str | None, ...] | None
    label_stratification: LabelStratification | None
    topics: ManifestTopics
    candidate_pool: CandidatePool
    table: tuple[StratumRow, ...]


@dataclass(frozen=True)
class SampleRecord:
    """What ``calibkit sample`` records in the manifest of the set it draws: the log and how it was read, the
    cleanup, redaction and de-duplication counts, lengths, strata, how representative the sample's lengths are,
    and per sampled text how often it was seen and its line in the log. ``paths``: how ``source.path`` reads
    (``provenance.PATHS_RELATIVE``: relative to the manifest's folder; None in manifests written before that
    rule, relative to the folder sample ran in)."""

    calibkit_version: str
    kind: str  # "calibration-set"
    source: ManifestSource
    seed: int
    size_requested: int
    text_field: ManifestTextField
    label_field: str | None
    lines: ManifestLines
    warnings: tuple[str, ...]
    cleanup: ManifestCleanup
    redaction: ManifestRedaction
    dedup: ManifestDedup
    length: ManifestLength
    representativeness: Representativeness
    strata: ManifestStrata
    sample_seen_counts: tuple[int, ...]
    sample_line_numbers: tuple[int, ...]
    paths: str | None = absent()


@dataclass(frozen=True)
class CalibrationSetManifest:
    """A calibration set's ``manifest.json``: the sha256 of its ``texts.jsonl`` (the set's id) and its count of
    texts, with what ``sample`` recorded beside them (``sample``: its keys are the document's own, None when the
    set was written without a sample). The manifest has no format tag: it never had one, and the sets written
    so far must still read. ``stale`` is not in the document: it is set when the set is loaded and its
    ``texts.jsonl`` no longer has the recorded sha256 (the coverage figures describe other texts)."""

    texts_sha256: str
    count: int
    sample: SampleRecord | None = field(default=None, metadata={"flatten": True})
    stale: bool = field(default=False, metadata={"json": False})
