"""The documents of what ships: ``plan.json`` (:class:`PlanDocument`, written by ``tune``) and ``deploy.json``
(:class:`DeployResult`, written and returned by ``deploy``).

Like :mod:`calibkit.results.runs`, each is frozen plain data whose JSON document ``results.codec`` writes and
parses generically, with its own format tag. A field declared ``init=False`` is derived from the others (a
bucket's padded tokens, a choice's padding waste): it is written for a reader of the JSON and recomputed, not
read, when the document is parsed.

Both record the INT8 **layout** — ``tensorrt`` (Q/DQ on every quantized MatMul/Gemm input, int8 activations:
what ``compare`` and ``tune`` measure) or ``onnxruntime`` (uint8 activations on weight MatMuls only, fused by ONNX
Runtime's integer kernels) — so that what ships can be checked against what was measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from calibkit.results.runs import (
    AGREEMENT_NOUNS,
    NOT_IN_DOCUMENT,
    HoldoutVerdict,
    PlanEvidence,
    Range,
    Speed,
    TuneResult,
)
from calibkit.types import Backend, Precision

# ---------------------------------------------------------------- plan.json


@dataclass(frozen=True)
class PlanAccuracy:
    """Accuracy (a fraction) of FP32 and of the plan on the search and holdout splits (None without labels)."""

    fp32_search: float | None = None
    search: float | None = None
    fp32_holdout: float | None = None
    holdout: float | None = None


@dataclass(frozen=True)
class PlanAgreement:
    """The share of FP32's predictions (per task: see ``AGREEMENT_NOUNS``; ``kept``) the plan keeps, per split,
    with its paired 95 % interval and the texts it was measured on. For an embedder the FP32 index a text's
    nearest neighbour is looked up in is the split's own texts, so the agreement depends on how many there are:
    ``*_index_size`` says it (None for other tasks)."""

    search: float | None = None
    holdout: float | None = None
    search_interval: Range | None = None
    holdout_interval: Range | None = None
    search_texts: int | None = None
    holdout_texts: int | None = None
    search_index_size: int | None = None
    holdout_index_size: int | None = None
    kept: str = ""

    @classmethod
    def of(cls, search: float | None, holdout: float | None, search_evidence: PlanEvidence | None,
           holdout_evidence: PlanEvidence | None, task: str) -> PlanAgreement:
        def texts(ev: PlanEvidence | None) -> int | None:
            return None if ev is None else ev.agreement_n if ev.agreement_n is not None else ev.n

        index = task == "embedding"
        return cls(search, holdout, search_evidence.agreement if search_evidence else None,
                   holdout_evidence.agreement if holdout_evidence else None, texts(search_evidence),
                   texts(holdout_evidence), texts(search_evidence) if index else None,
                   texts(holdout_evidence) if index else None, AGREEMENT_NOUNS.get(task, ""))


BLOCKWISE_KEPT = ("fp16 (TensorRT) / ONNX Runtime CPU: weight MatMuls as 8-bit blockwise MatMulNBits (activations "
                  "quantized per block of 128 as each request runs), the rest fp32")


@dataclass(frozen=True)
class PlanDocument:
    """plan.json: what a deployment needs of tune's plan — the layers kept and why, the INT8 layout tune
    measured (and wrote ``model.int8.onnx`` in), its INT8 share, the measurements behind it and what it may
    claim. A build input; the report is tune.json."""

    kept_nodes: tuple[str, ...]
    layout: str  # "tensorrt" | "onnxruntime": the Q/DQ layout every measurement of the plan was made in
    method: str
    int8_flops_fraction: float
    met_target: bool
    claim: str
    accuracy: PlanAccuracy = PlanAccuracy()
    agreement_with_fp32: PlanAgreement = PlanAgreement()
    holdout_verdict: HoldoutVerdict | None = None
    reasons: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    precision_of_kept: str = "fp16 (TensorRT) / fp32 (ONNX Runtime CPU)"
    calibkit_version: str = ""
    speed: Speed | None = None  # the plan served beside FP32 on tune's machine (None: ``speed_note`` says why)
    speed_note: str | None = None

    @classmethod
    def of(cls, result: TuneResult, layout: str) -> PlanDocument:
        """The plan of a tune result, measured in ``layout``."""
        final, target = result.final, result.target
        return cls(
            kept_nodes=tuple(final.kept_nodes), layout=layout, method=final.method,
            int8_flops_fraction=final.int8_flops_fraction, met_target=target.met, claim=result.claim,
            accuracy=PlanAccuracy(target.fp32_accuracy, final.accuracy_search, target.fp32_accuracy_holdout,
                                  final.accuracy_holdout),
            agreement_with_fp32=PlanAgreement.of(final.agreement_search, final.agreement_holdout,
                                                 final.search_evidence, final.holdout_evidence, target.task),
            holdout_verdict=final.holdout_verdict, reasons={n: tuple(r) for n, r in final.reasons.items()},
            calibkit_version=result.calibkit_version, speed=final.speed, speed_note=final.speed_note,
            **({"precision_of_kept": BLOCKWISE_KEPT} if final.kept_weights == "blockwise" else {}))


# ---------------------------------------------------------------- deploy.json: what was chosen


@dataclass(frozen=True)
class LengthBucket:
    """Requests of ``lo..hi`` tokens, padded to ``hi``."""

    lo: int
    hi: int
    requests: int
    real_tokens: int
    median_length: int
    padded_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "padded_tokens", self.hi * self.requests)


@dataclass(frozen=True)
class BucketChoice:
    """``k`` buckets and what they cost on the observed traffic; ``waste``: padding tokens per real token."""

    buckets: tuple[LengthBucket, ...]
    requests: int
    real_tokens: int  # after truncation to max_seq
    max_seq: int
    over_max: int  # requests longer than max_seq (truncated to it, or refused)
    k: int = field(init=False)
    padded_tokens: int = field(init=False)
    waste: float = field(init=False)
    over_max_share: float = field(init=False)

    def __post_init__(self) -> None:
        padded = sum(b.padded_tokens for b in self.buckets)
        object.__setattr__(self, "k", len(self.buckets))
        object.__setattr__(self, "padded_tokens", padded)
        object.__setattr__(self, "waste", (padded - self.real_tokens) / self.real_tokens if self.real_tokens else 0.0)
        object.__setattr__(self, "over_max_share", self.over_max / self.requests if self.requests else 0.0)

    def bucket_of(self, length: int) -> LengthBucket:
        """The bucket a request of ``length`` tokens is padded in (the last one past max_seq: truncated)."""
        for b in self.buckets:
            if length <= b.hi:
                return b
        return self.buckets[-1]


@dataclass(frozen=True)
class BatchingPlan:
    batch_tokens: int
    per_bucket: tuple[int, ...]  # preferred batch size of each bucket, in bucket order
    preferred: tuple[int, ...]  # distinct, ascending: Triton's preferred_batch_size
    max_batch_size: int
    queue_delay_us: int
    worst_tokens: int  # max_batch_size x the longest bucket's length


@dataclass(frozen=True)
class PaddingBaseline:
    """One profile 1..``max_seq``: every request padded to it, and arrival-order batches of ``arrival_batch``
    each padded to its longest request (a server that pads per batch)."""

    max_seq: int
    real_tokens: int
    padded_tokens_padded_to_max: int
    waste_padded_to_max: float
    arrival_batch: int
    padded_tokens_arrival_batches: int
    waste_arrival_batches: float


@dataclass(frozen=True)
class ProfileChoice:
    chosen_k: int
    requested_k: int | None  # None: auto (the fewest within 5 % of the best)
    round_to: int
    choices: tuple[BucketChoice, ...]
    baseline: PaddingBaseline

    @property
    def auto(self) -> bool:
        return self.requested_k is None

    @property
    def chosen(self) -> BucketChoice:
        return next(c for c in self.choices if c.k == self.chosen_k)


@dataclass(frozen=True)
class LengthSummary:
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: int


@dataclass(frozen=True)
class ServedTensor:
    name: str
    data_type: str  # Triton's TYPE_*
    dims: tuple[int, ...] = field(default=(), metadata={"unchecked": True})  # without the batch axis; -1: dynamic


@dataclass(frozen=True)
class ServedModel:
    inputs: tuple[ServedTensor, ...]
    outputs: tuple[ServedTensor, ...]
    max_length: int
    max_length_source: str
    label_output: str | None = None


@dataclass(frozen=True)
class TrafficRecord:
    """The log deploy read: ``texts`` kept of ``usable`` usable lines (a uniform sample past the cap); ``path``
    as :class:`SourceRecord`'s paths (relative to the repository in deploy.json)."""

    path: str
    lines: int
    usable: int
    texts: int
    sampled: bool
    redacted: bool
    origin: str  # "--traffic" (given), "tune" (the log tune judged agreement on), "calibration set" (its log)
    broken: Mapping[str, int] = field(default_factory=dict)
    text_fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class SourceRecord:
    """SOURCE as deploy read it: absolute paths in the result deploy returns; in the repository's deploy.json
    relative to the repository (no absolute path of the writing machine ships; read back against deploy.json's
    folder, :func:`calibkit.provenance.document_path`)."""

    path: str
    kind: str  # "tune" | "calibrate" | "engine"
    model: str
    tokenizer: str
    precision: Precision
    calibration_json: str | None = None
    kept_nodes: tuple[str, ...] = ()
    qdq_model: str | None = None
    qdq_target: str | None = None
    calibration_set: str | None = None


@dataclass(frozen=True)
class LayoutRecord:
    """The INT8 layout written (``shipped``) and the one SOURCE records as measured (``measured``: tune's plan,
    the calibration's ``--target``, an engine's own); ``requested``: the ``--layout`` asked for, if any."""

    shipped: str
    measured: str | None
    requested: str | None = None

    @property
    def as_measured(self) -> bool:
        return self.measured is None or self.shipped == self.measured


@dataclass(frozen=True)
class PerfAnalyzerData:
    requests: int
    per_bucket: tuple[int, ...]
    command: tuple[str, ...]


@dataclass(frozen=True)
class ShapeRange:
    """One TensorRT optimization profile: (batch, sequence) at its min, opt and max."""

    min_shape: tuple[int, ...]
    opt_shape: tuple[int, ...]
    max_shape: tuple[int, ...]


@dataclass(frozen=True)
class TensorRTBuild:
    available_here: bool
    trtexec: tuple[str, ...]
    profiles: tuple[ShapeRange, ...] = ()


# ---------------------------------------------------------------- deploy.json: what was measured


@dataclass(frozen=True)
class ServedLatency:
    """The served model's and FP32's time per batch at the measurement's batch size (``threads``: ONNX Runtime
    intra-op threads, None: its default): the same ``batches`` batches of up to ``batch_size`` texts for both,
    in interleaved rounds; the medians over rounds, and ``speedup``, their ratio FP32 / served (above 1: the
    served model is faster). The whole measurement, batch 1 included, is ``ServedMeasurement.speed``."""

    batch_size: int
    batches: int
    threads: int | None
    fp32_median_ms: float
    served_median_ms: float
    speedup: float
    shortest: int | None = None  # the batches' texts: of this many tokens or more (None: any length)
    longest: int | None = None  # and this many or fewer (the length bucket most requests fall in)


@dataclass(frozen=True)
class ServedMeasurement:
    """The model deploy wrote, measured against FP32 on ``texts`` traffic texts (a seeded sample of the log
    deploy read, calibration texts left out): ``agreement`` with FP32 (the task's per-text fidelity:
    classification the same class, embeddings the same nearest neighbour in the FP32 index, token tags the
    share of tokens) with its 95 % interval, and latency."""

    texts: int
    task: str
    latency: ServedLatency
    agreement: float | None = None  # None: a task without per-text fidelity (regression, multi-label)
    agreement_ci: Range | None = None
    seed: int = 0
    calibration_texts_left_out: int = 0
    cosine: float | None = None  # embeddings: mean cosine to FP32's vectors
    speed: Speed | None = None  # at batch 1 and at the measurement's batch size, with the spread of single rounds
    agreement_batch: int | None = None  # texts per batch of the agreement pass (None: written before it was recorded)


# ---------------------------------------------------------------- deploy.json


@dataclass(frozen=True)
class DeployResult:
    """What ``calibkit deploy`` wrote (deploy.json, field by field) and where: the repository ``out_dir``
    (not in the document: set from where it is read), every choice and the numbers behind it, and the model
    it wrote measured against FP32 on the traffic (``measurement``; None with ``measurement_note`` saying
    why)."""

    calibkit_version: str
    name: str
    backend: Backend
    precision: Precision
    source: SourceRecord
    traffic: TrafficRecord
    model: ServedModel
    lengths: LengthSummary
    profiles: ProfileChoice
    batching: BatchingPlan
    perf_analyzer: PerfAnalyzerData
    tensorrt: TensorRTBuild
    layout: LayoutRecord | None = None  # INT8 only
    measurement: ServedMeasurement | None = None
    measurement_note: str | None = None
    warnings: tuple[str, ...] = ()
    out_dir: Path = field(default=Path("."), compare=False, metadata=NOT_IN_DOCUMENT)

    @property
    def choice(self) -> BucketChoice:
        return self.profiles.chosen

    @property
    def choices(self) -> tuple[BucketChoice, ...]:
        return self.profiles.choices

    @property
    def tensorrt_available(self) -> bool:
        return self.tensorrt.available_here

    @property
    def perf_command(self) -> tuple[str, ...]:
        return self.perf_analyzer.command

    @property
    def trtexec(self) -> tuple[str, ...]:
        return self.tensorrt.trtexec

    @property
    def config_path(self) -> Path:
        return self.out_dir / self.name / "config.pbtxt"

    @property
    def model_path(self) -> Path | None:
        """ONNX Runtime: NAME/1/model.onnx; TensorRT: None (the plan is built on the serving GPU)."""
        return self.out_dir / self.name / "1" / "model.onnx" if self.backend is Backend.ONNXRUNTIME else None

    @property
    def engine_onnx(self) -> Path | None:
        """TensorRT: the Q/DQ ONNX build_engine.sh builds from."""
        if self.backend is not Backend.TENSORRT:
            return None
        return self.out_dir / self.name / f"model.{self.precision.value}.onnx"

    @property
    def build_script(self) -> Path | None:
        return self.out_dir / self.name / "build_engine.sh" if self.backend is Backend.TENSORRT else None

    @property
    def perf_data(self) -> Path:
        return self.out_dir / "perf_data.json"

    @property
    def readme(self) -> Path:
        return self.out_dir / "README.md"


class _Shapes(Protocol):
    """What :func:`shape_range` reads of a shape profile."""

    @property
    def min_shape(self) -> Sequence[int]: ...

    @property
    def opt_shape(self) -> Sequence[int]: ...

    @property
    def max_shape(self) -> Sequence[int]: ...


def shape_range(profile: _Shapes) -> ShapeRange:
    """From a ``deploy.trtexec.ShapeProfile`` (min/opt/max shapes)."""
    return ShapeRange(tuple(profile.min_shape), tuple(profile.opt_shape), tuple(profile.max_shape))
