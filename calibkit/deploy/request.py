"""What ``calibkit deploy`` is asked for: one frozen :class:`DeployRequest`, its defaults and :meth:`validate`
(every check that needs no file read), shared by the command line and ``ck.deploy``."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path

from calibkit.deploy.batching import DEFAULT_BATCH_TOKENS, DEFAULT_MAX_BATCH, DEFAULT_QUEUE_DELAY_US
from calibkit.deploy.profiles import ROUND_TO
from calibkit.errors import UsageError
from calibkit.types import Backend, check_seed

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
LAYOUTS = ("tensorrt", "onnxruntime")
DEFAULT_MEASURE_TEXTS = 1000
DEFAULT_MEASURE_BATCH = 8


@dataclass(frozen=True)
class DeployRequest:
    """A Triton model repository for ``source`` (a tune or calibrate folder, or an engine calibkit built) at
    ``out``, shaped by ``traffic`` (None: the calibration set's log) and, for ONNX Runtime, the model it writes
    measured against FP32 on ``measure_texts`` of those texts (0: not measured)."""

    source: Path
    out: Path
    backend: Backend = Backend.ONNXRUNTIME
    traffic: Path | None = None
    text_field: str | None = None
    strict: bool = False
    redact: bool = True
    profiles: int | None = None  # 1..4; None: auto (the fewest within 5 % of the best)
    name: str | None = None
    max_seq: int | None = None  # None: the longest request, rounded up to 8, at most the model's maximum
    batch_tokens: int = DEFAULT_BATCH_TOKENS
    max_batch: int = DEFAULT_MAX_BATCH
    queue_delay_us: int = DEFAULT_QUEUE_DELAY_US
    instances: int = 1
    threads: int | None = None  # ONNX Runtime intra-op threads per instance (and of the measurement)
    perf_requests: int = 512
    max_texts: int = 50_000
    seed: int = 0
    reduce_range: bool | None = None
    workspace_mib: int = 4096
    round_to: int = ROUND_TO
    layout: str | None = None  # INT8 Q/DQ layout to ship; None: the one SOURCE records as measured
    measure_texts: int = DEFAULT_MEASURE_TEXTS
    measure_batch: int = DEFAULT_MEASURE_BATCH

    def __post_init__(self) -> None:
        if isinstance(self.backend, str) and not isinstance(self.backend, Backend):  # "onnxruntime", "TensorRT"
            try:
                object.__setattr__(self, "backend", Backend(self.backend.lower()))
            except ValueError:
                pass  # validate() names it

    def validate(self) -> None:
        """A UsageError naming the option and what to pass, for any value out of its range or options that do
        not fit together; nothing is read."""
        from calibkit.deploy.profiles import check_k
        from calibkit.deploy.triton import INT32_MAX, UINT64_MAX, check_range

        backend = _backend(self.backend)
        self._check_types()
        check_seed(self.seed)
        if self.profiles is not None:
            check_k(self.profiles)
        if self.name is not None and not _NAME.match(self.name):
            raise UsageError(f"--name {self.name!r} is not a Triton model name",
                             hint="use letters, digits, '_', '-' and '.', starting with a letter, digit or '_'")
        for flag, v, lo in (("--perf-requests", self.perf_requests, 1), ("--max-texts", self.max_texts, 1),
                            ("--workspace-mib", self.workspace_mib, 1), ("--measure-texts", self.measure_texts, 0),
                            ("--measure-batch", self.measure_batch, 1)):
            if v < lo:
                raise UsageError(f"{flag} must be at least {lo} (got {v})")
        # config.pbtxt's fields, checked before any work (TritonModelConfig checks them again as it is made)
        check_range("--instances", self.instances, 1, INT32_MAX, "instance_group count (int32)")
        check_range("--max-batch", self.max_batch, 1, INT32_MAX, "max_batch_size (int32)")
        check_range("--queue-delay-us", self.queue_delay_us, 0, UINT64_MAX, "max_queue_delay_microseconds (uint64)")
        if self.threads is not None:
            check_range("--threads", self.threads, 1, INT32_MAX, "intra_op_thread_count")
        self._check_layout(backend)
        if backend is Backend.TENSORRT and self.threads is not None:
            raise UsageError("--threads sets ONNX Runtime's intra-op threads; it does not apply to --backend tensorrt",
                             hint="drop --threads (use --instances for more TensorRT execution contexts)")
        if backend is Backend.TENSORRT and self.reduce_range is not None:
            raise UsageError("--reduce-range applies to the ONNX Runtime layout only",
                             hint="drop it with --backend tensorrt (TensorRT's INT8 GEMMs accumulate in int32)")

    def _check_types(self) -> None:
        """Whole numbers where they go (a string, a float or a bool is refused naming the option), flags as
        bools: the API passes its keywords here unconverted."""
        for f in fields(self):
            value, kind = getattr(self, f.name), _TYPES.get(f.name)
            if kind is int and value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise UsageError(f"--{f.name.replace('_', '-')} must be a whole number, got {value!r}",
                                 hint=f"pass --{f.name.replace('_', '-')} as an integer")
            if kind is bool and not isinstance(value, bool) and not (f.name == "reduce_range" and value is None):
                raise UsageError(f"{f.name} must be True or False, got {value!r}")

    def _check_layout(self, backend: Backend) -> None:
        if self.layout is None:
            return
        if self.layout not in LAYOUTS:
            raise UsageError(f"unknown --layout {self.layout!r}", hint="choose tensorrt or onnxruntime")
        if backend is Backend.TENSORRT and self.layout == "onnxruntime":
            raise UsageError("--layout onnxruntime (uint8 activations) cannot be built by TensorRT",
                             hint="drop --layout, or pass --layout tensorrt")


_TYPES: dict[str, type] = {
    **dict.fromkeys(("profiles", "max_seq", "batch_tokens", "max_batch", "queue_delay_us", "instances", "threads",
                     "perf_requests", "max_texts", "seed", "workspace_mib", "round_to", "measure_texts",
                     "measure_batch"), int),
    **dict.fromkeys(("strict", "redact", "reduce_range"), bool),
}


def _backend(value: object) -> Backend:
    if isinstance(value, Backend):
        return value
    try:
        return Backend(str(value).lower())
    except ValueError:
        raise UsageError(f"unknown --backend {value!r}", hint="choose onnxruntime or tensorrt") from None
