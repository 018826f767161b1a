"""What ``calibkit deploy`` is asked: :class:`DeployRequest`, every option declared once.

The serving pipeline (``deploy.pipeline``) reads the request as its configuration; the command line's options
and ``ck.deploy``'s keywords are generated from its fields. ``validate()`` holds every check that reads no file;
the pipeline then refuses what only the files can tell (a SOURCE that is no calibkit output, a ``--max-seq``
above the model's maximum length, a model with fixed axes).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from calibkit.deploy.batching import DEFAULT_BATCH_TOKENS, DEFAULT_MAX_BATCH, DEFAULT_QUEUE_DELAY_US
from calibkit.deploy.profiles import AUTO_TOLERANCE, MAX_PROFILES, ROUND_TO, check_k
from calibkit.deploy.triton import INT32_MAX, check_range
from calibkit.errors import UsageError
from calibkit.requests.checks import COUNT, COUNT_OR_NONE, INT_LIMIT, Bound, check_names, check_paths
from calibkit.requests.choices import KeptWeights, Target
from calibkit.requests.options import Choice, check_bounds, coerce, option
from calibkit.types import Backend, PathLike, check_seed

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
DEFAULT_MEASURE_TEXTS = 1000


class Profiles(Choice):
    """How many length buckets (TensorRT optimization profiles) a repository gets when no number is asked:
    ``AUTO``, the fewest whose padded tokens are within 5 % of the best of 1 to 4."""

    AUTO = "auto"


@dataclass(frozen=True, kw_only=True)
class DeployRequest:
    """A Triton model repository for ``source`` (a tune or calibrate folder, or an engine calibkit built) at
    ``out``, shaped by the traffic it will serve and, for ONNX Runtime, the model it writes measured against FP32
    on ``measure_texts`` of those texts (0: not measured)."""

    source: PathLike = option(argument=True, positional=True, cli_type=Path,
                              help="A tune or calibrate output folder, or an engine calibkit built.")
    out: PathLike = option(flags=("--out", "-o"), positional=True, cli_type=Path,
                           help="Folder of the Triton model repository to write (new, or one deploy wrote before).")
    # One rule for both callers: the command line and ck.deploy share this default (the command line required
    # --backend before, while the API defaulted to onnxruntime; `calibkit build --backend` defaults the same way).
    backend: Backend = option(
        Backend.ONNXRUNTIME, flags=("--backend", "-b"), cli_type=str,
        help="onnxruntime | tensorrt, as in `calibkit build` (tensorrt: the Q/DQ model and build_engine.sh for the "
             "serving GPU).")
    traffic: PathLike | None = option(
        None, cli_type=Path | None,
        help="JSON Lines request log whose lengths shape the server and whose texts the model is measured on "
             "[default: the log a tune run judged agreement on, else the calibration set's log].")
    text_field: str | None = option(
        None, help="Dotted path of the text in --traffic, e.g. request.text [default: auto-detect].")
    strict: bool = option(False, help="Fail at the first broken line of --traffic.")
    redact: bool = option(True, flags=("--redact/--no-redact",),
                          help="Redact e-mails, phone/card numbers and IPs in perf_data.json (--no-redact: keep "
                               "them as they are in the log).")
    profiles: Profiles | int = option(
        Profiles.AUTO, flags=("--profiles", "-k"), cli_type=Profiles | int,
        help=f"Length buckets / TensorRT optimization profiles: a whole number from 1 to {MAX_PROFILES}, or auto "
             f"(the fewest within {100 * AUTO_TOLERANCE:g} % of the best). From Python: an int or Profiles.AUTO.")
    name: str | None = option(None, help="Triton model name [default: MODELFOLDER-PRECISION, MODELFOLDER the "
                                         "folder of the model you gave: the original behind a smoothed copy].")
    max_seq: int | None = option(
        None, bound=COUNT_OR_NONE,
        help="Largest profile max; longer requests are truncated [default: the longest request, rounded up to 8, "
             "at most the model's maximum].")
    batch_tokens: int = option(DEFAULT_BATCH_TOKENS, bound=COUNT,
                               help="Padded tokens per batch that set the batch sizes.")
    max_batch: int = option(DEFAULT_MAX_BATCH, bound=COUNT, help="Upper bound of any batch size.")
    queue_delay_us: int = option(DEFAULT_QUEUE_DELAY_US, bound=Bound(low=0, high=INT_LIMIT, integer=True),
                                 help="Triton's max_queue_delay_microseconds.")
    instances: int = option(1, bound=COUNT, help="Model instances (instance_group count).")
    threads: int | None = option(
        None, bound=COUNT_OR_NONE,
        help="ONNX Runtime intra-op threads per instance, and of the measurement [default: the backend's].")
    perf_requests: int = option(512, bound=COUNT, help="Requests in perf_data.json.")
    max_texts: int = option(50_000, bound=COUNT, help="Traffic texts kept (a seeded uniform sample past it).")
    seed: int = option(0, help="Seed of the traffic sample, the perf_analyzer requests and the measured texts.")
    reduce_range: bool | None = option(
        None, flags=("--reduce-range/--no-reduce-range",), cli_type=bool | None,
        help="7-bit weights for the ONNX Runtime layout (x86 CPUs without VNNI) [default: as `calibkit build`].")
    kept_weights: KeptWeights | None = option(
        None, cli_type=str | None,
        help="ONNX Runtime layout: how the weight MatMuls the plan keeps out of static INT8 are served: blockwise "
             "(8-bit, blocks of 128, ONNX Runtime's MatMulNBits) | fp32 [default: as tune timed them, else "
             "blockwise].")
    workspace_mib: int = option(4096, bound=Bound(low=1, high=1 << 30, integer=True, example="4096"),
                                help="TensorRT builder workspace (MiB).")
    layout: Target | None = option(
        None, cli_type=str | None,
        help="INT8 Q/DQ layout to ship: tensorrt | onnxruntime [default: the one SOURCE was measured in; another is "
             "shipped with a warning].")
    measure_texts: int = option(DEFAULT_MEASURE_TEXTS, bound=Bound(low=0, high=INT_LIMIT, integer=True),
                                help="Traffic texts the served model is measured on against FP32 (0: not measured).")
    measure_batch: int | None = option(
        None, bound=COUNT_OR_NONE, cli_type=int | None,
        help="Batch size of that measurement besides batch 1 [default: the largest preferred batch size written, "
             "the batch Triton forms under load].")
    # ---- a knob of the bucket choice: no command line sets it
    round_to: int = option(ROUND_TO, cli=False, api=False, bound=COUNT,
                           help="Bucket lengths are multiples of this (TensorRT kernels prefer multiples of 8).")

    def __post_init__(self) -> None:
        object.__setattr__(self, "backend", coerce(Backend, self.backend))
        object.__setattr__(self, "profiles", coerce(Profiles, self.profiles))
        if self.layout is not None:
            object.__setattr__(self, "layout", coerce(Target, self.layout))
        if self.kept_weights is not None:
            object.__setattr__(self, "kept_weights", coerce(KeptWeights, self.kept_weights))
        for name in ("source", "out", "traffic"):
            value = getattr(self, name)
            if isinstance(value, (str, os.PathLike)):  # anything else is left for validate() to refuse
                object.__setattr__(self, name, Path(value))
        self.validate()  # a request that exists is valid: checked once, when it is made

    @property
    def requested_k(self) -> int | None:
        """The number of profiles asked for (None: auto), as deploy.json records it."""
        return None if self.profiles is Profiles.AUTO else self.profiles

    def validate(self) -> None:
        """Every check that reads no file: UsageError naming the option and what to pass instead."""
        check_paths({"source": self.source, "out": self.out}, {"traffic": self.traffic})
        check_names({"backend": self.backend, "text_field": self.text_field, "name": self.name,
                     "layout": self.layout, "kept_weights": self.kept_weights}, required=("backend",))
        if not isinstance(self.backend, Backend):
            raise UsageError(f"unknown --backend {self.backend!r}", hint="choose onnxruntime or tensorrt")
        if self.kept_weights is not None and not isinstance(self.kept_weights, KeptWeights):
            raise UsageError(f"unknown --kept-weights {self.kept_weights!r}", hint=f"choose {KeptWeights.words()}")
        for flag, value in (("--strict", self.strict), ("--redact", self.redact)):
            if not isinstance(value, bool):
                raise UsageError(f"{flag} must be True or False, got {value!r}")
        if self.reduce_range is not None and not isinstance(self.reduce_range, bool):
            raise UsageError(f"--reduce-range must be True, False or None, got {self.reduce_range!r}")
        check_seed(self.seed)
        check_bounds(self)
        self._check_profiles()
        if self.name is not None and not _NAME.match(self.name):
            raise UsageError(f"--name {self.name!r} is not a Triton model name",
                             hint="use letters, digits, '_', '-' and '.', starting with a letter, digit or '_'")
        # config.pbtxt's int32 fields (TritonModelConfig checks them again as it is made)
        check_range("--instances", self.instances, 1, INT32_MAX, "instance_group count (int32)")
        check_range("--max-batch", self.max_batch, 1, INT32_MAX, "max_batch_size (int32)")
        if self.threads is not None:
            check_range("--threads", self.threads, 1, INT32_MAX, "intra_op_thread_count")
        self._check_backend()

    def _check_profiles(self) -> None:
        if self.profiles is Profiles.AUTO:
            return
        if isinstance(self.profiles, bool) or not isinstance(self.profiles, int):
            raise UsageError(f"--profiles must be a whole number from 1 to {MAX_PROFILES} or auto, got "
                             f"{self.profiles!r}", hint="e.g. --profiles 2, or profiles=Profiles.AUTO from Python")
        check_k(self.profiles)

    def _check_backend(self) -> None:
        if self.layout is not None and not isinstance(self.layout, Target):
            raise UsageError(f"unknown --layout {self.layout!r}", hint="choose tensorrt or onnxruntime")
        if self.backend is not Backend.TENSORRT:
            return
        if self.layout is Target.ONNXRUNTIME:
            raise UsageError("--layout onnxruntime (uint8 activations) cannot be built by TensorRT",
                             hint="drop --layout, or pass --layout tensorrt")
        if self.threads is not None:
            raise UsageError("--threads sets ONNX Runtime's intra-op threads; it does not apply to --backend tensorrt",
                             hint="drop --threads (use --instances for more TensorRT execution contexts)")
        if self.reduce_range is not None:
            raise UsageError("--reduce-range applies to the ONNX Runtime layout only",
                             hint="drop it with --backend tensorrt (TensorRT's INT8 GEMMs accumulate in int32)")
