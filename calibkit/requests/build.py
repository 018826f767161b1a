"""What ``calibkit build`` is asked: :class:`BuildRequest`, every option declared once.

The build step (``building``) reads the request as its configuration; ``deploy`` makes one per engine it
ships. ``validate()`` holds the checks that read no file; the build itself then refuses an output that is a
folder, a model TensorRT's parser cannot read, and a missing TensorRT.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from calibkit.errors import UsageError
from calibkit.requests.checks import Bound, check_names, check_paths
from calibkit.requests.choices import KeptWeights, Target
from calibkit.requests.options import check_bounds, coerce, option
from calibkit.types import Backend, PathLike, Precision

ONNX_SUFFIXES = (".onnx",)
TRT_SUFFIXES = (".engine", ".plan")
SEQ = Bound(low=1, high=1 << 20, integer=True, optional=True, example="128")


@dataclass(frozen=True, kw_only=True)
class BuildRequest:
    """An engine file from a model: FP32, FP16 (some nodes kept FP32), or INT8 from a calibration or a ready
    Q/DQ model; an ONNX Runtime .onnx or a TensorRT .engine, with its sidecar."""

    model: PathLike = option(argument=True, positional=True, cli_type=Path,
                             help="Model folder (model.onnx + tokenizer + config.json) or an .onnx file.")
    output: PathLike = option(flags=("--output", "-o"), positional=True, cli_type=Path,
                              help="Engine file to write: .onnx (onnxruntime) or .engine.")
    precision: Precision = option(Precision.FP32, flags=("--precision", "-p"), cli_type=str,
                                  help="fp32 | fp16 | int8.")
    calibration: PathLike | None = option(
        None, cli_type=Path | None, help="calibration.json from `calibkit calibrate` (or its folder), for int8.")
    qdq: PathLike | None = option(None, cli_type=Path | None,
                                  help="A ready Q/DQ INT8 .onnx to use as it is, for int8.")
    backend: Backend = option(Backend.ONNXRUNTIME, flags=("--backend", "-b"), cli_type=str,
                              help="onnxruntime | tensorrt.")
    target: Target | None = option(
        None, cli_type=str | None,
        help="INT8 Q/DQ layout: tensorrt | onnxruntime [default: the one calibration.json records].")
    exclude: tuple[str, ...] = option(
        (), flags=("--exclude", "-x"), cli_type=list[str],
        help="Regex of node names or module paths kept in FP32 for int8/fp16 (repeatable), e.g. '/classifier/' or "
             "'classifier'.")
    tokenizer: PathLike | None = option(None, cli_type=Path | None,
                                        help="Tokenizer folder when MODEL is an .onnx file.")
    calibration_set: PathLike | None = option(None, flags=("--calibration-set", "-c"), cli_type=Path | None,
                                              help="Texts whose token lengths set the TensorRT profile.")
    min_seq: int | None = option(None, bound=SEQ, help="TensorRT profile: shortest sequence [1].")
    opt_seq: int | None = option(None, bound=SEQ, help="TensorRT profile: tuned-for sequence [median].")
    max_seq: int | None = option(None, bound=SEQ, help="TensorRT profile: longest sequence [p99, to 8].")
    workspace_mib: int = option(4096, bound=Bound(low=1, high=1 << 30, integer=True, example="4096"),
                                help="TensorRT builder workspace limit (MiB).")
    reduce_range: bool | None = option(
        None, flags=("--reduce-range/--no-reduce-range",), cli_type=bool | None,
        help="7-bit weights for the onnxruntime layout: ONNX Runtime's int8 GEMM saturates with 8-bit weights on "
             "x86 CPUs without VNNI [default: on where this machine's CPU lacks VNNI].")
    kept_weights: KeptWeights = option(
        KeptWeights.BLOCKWISE, cli_type=str,
        help="onnxruntime layout on --backend onnxruntime: how the weight MatMuls kept out of static INT8 are "
             "served. blockwise: 8-bit weights in blocks of 128, activations quantized per block as each request "
             "runs (ONNX Runtime's MatMulNBits; close to FP32 where one static scale is not, and about as fast as "
             "INT8); fp32: exactly as tune certified them.")
    # ---- set by deploy, which ships a plan's FP16 or INT8 model: no command line sets it
    keep_nodes: tuple[str, ...] = option((), cli=False, api=False,
                                         help="Nodes kept in higher precision by name (a tuned plan's).")

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", coerce(Precision, self.precision))
        object.__setattr__(self, "backend", coerce(Backend, self.backend))
        if self.target is not None:
            object.__setattr__(self, "target", coerce(Target, self.target))
        object.__setattr__(self, "kept_weights", coerce(KeptWeights, self.kept_weights))
        for name in ("exclude", "keep_nodes"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        for name in ("model", "output", "calibration", "qdq", "tokenizer", "calibration_set"):
            value = getattr(self, name)
            if isinstance(value, (str, os.PathLike)):  # anything else is left for validate() to refuse
                object.__setattr__(self, name, Path(value))
        self.validate()  # a request that exists is valid: checked once, when it is made

    def validate(self) -> None:
        """Every check that reads no file: UsageError naming the option and what to pass instead."""
        check_paths({"model": self.model, "output": self.output},
                    {"calibration": self.calibration, "qdq": self.qdq, "tokenizer": self.tokenizer,
                     "calibration_set": self.calibration_set})
        check_bounds(self)
        check_names({"precision": self.precision, "backend": self.backend, "target": self.target,
                     "kept_weights": self.kept_weights},
                    {"exclude": self.exclude}, required=("precision", "backend", "kept_weights"))
        if not isinstance(self.precision, Precision):
            raise UsageError(f"unknown --precision {self.precision!r}", hint="choose fp32, fp16 or int8")
        if not isinstance(self.backend, Backend):
            raise UsageError(f"unknown --backend {self.backend!r}", hint="choose onnxruntime or tensorrt")
        if not isinstance(self.kept_weights, KeptWeights):
            raise UsageError(f"unknown --kept-weights {self.kept_weights!r}", hint=f"choose {KeptWeights.words()}")
        self._check_output()
        self._check_int8()
        self._check_target()
        if self.backend is Backend.ONNXRUNTIME and any(v is not None for v in (self.min_seq, self.opt_seq,
                                                                                self.max_seq)):
            raise UsageError("--min-seq/--opt-seq/--max-seq only apply to --backend tensorrt")
        for p in self.exclude:
            try:
                re.compile(p)
            except re.error as exc:
                raise UsageError(f"--exclude {p!r} is not a valid regular expression ({exc})") from None
        if self.precision is Precision.FP32 and (self.exclude or self.keep_nodes):
            raise UsageError("--exclude applies to fp16 (nodes kept FP32) and int8 builds, not to fp32")
        if self.qdq is not None and self.exclude:
            raise UsageError("--exclude applies when building from --calibration; a --qdq model is used as it is")

    def _check_output(self) -> None:
        suffix = Path(self.output).suffix.lower()
        if self.backend is Backend.ONNXRUNTIME and suffix not in ONNX_SUFFIXES:
            raise UsageError(f"-o {self.output}: an ONNX Runtime engine is an .onnx file",
                             hint="use e.g. -o out/model.int8.onnx")
        if self.backend is Backend.TENSORRT and suffix not in TRT_SUFFIXES:
            raise UsageError(f"-o {self.output}: a TensorRT engine is a .engine file",
                             hint="use e.g. -o out/model.int8.engine")

    def _check_int8(self) -> None:
        if self.precision is Precision.INT8:
            if (self.calibration is None) == (self.qdq is None):
                raise UsageError(
                    "--precision int8 needs exactly one of --calibration and --qdq",
                    hint="calibrate first (`calibkit calibrate MODEL -c SET --out OUT`), then pass --calibration OUT")
            if self.reduce_range is not None and self.qdq is not None:
                raise UsageError("--reduce-range/--no-reduce-range choose the weights calibkit quantizes; --qdq "
                                 "models come quantized", hint="drop the flag, or build from --calibration")
        elif self.reduce_range is not None:
            raise UsageError(f"--reduce-range only applies to --precision int8 (got {self.precision.value})")
        elif self.calibration is not None or self.qdq is not None:
            raise UsageError(f"--calibration/--qdq only apply to --precision int8 (got {self.precision.value})")

    def _check_target(self) -> None:
        if self.target is None:
            return
        if not isinstance(self.target, Target):
            raise UsageError(f"unknown --target {self.target!r}", hint="use tensorrt or onnxruntime")
        if self.backend is Backend.TENSORRT and self.target is Target.ONNXRUNTIME:
            raise UsageError("--target onnxruntime (uint8 activations) cannot be built by TensorRT",
                             hint="drop --target, or use --target tensorrt")
        if self.precision is not Precision.INT8 or self.qdq is not None:
            raise UsageError("--target only applies when building INT8 from --calibration")
