"""What ``calibkit calibrate`` is asked: :class:`CalibrateRequest`, every option declared once."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from calibkit.errors import UsageError
from calibkit.quantize.placement import DEFAULT_OP_TYPES
from calibkit.requests.checks import COUNT, COUNT_OR_NONE, PERCENTILE, Bound, check_names, check_paths
from calibkit.requests.choices import Target
from calibkit.requests.options import Choice, calibration_set_option, check_bounds, coerce, model_option, option
from calibkit.types import Method, MethodParams, PathLike

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.data.calibset import CalibrationSet
    from calibkit.data.modeldir import ModelDir


class CalibrationMethod(Choice):
    """How a tensor's range is chosen from its histogram."""

    ENTROPY = Method.ENTROPY.value
    MINMAX = Method.MINMAX.value
    PERCENTILE = Method.PERCENTILE.value
    MSE = Method.MSE.value


def _names(value: object, *, commas: bool = False) -> object:
    """A tuple from a list (with ``commas``, each string split at commas: ``--op-types MatMul,Gemm``); a string
    alone is left for ``validate()`` to refuse (``exclude="fc1"`` would read as three one-letter patterns)."""
    if not isinstance(value, (list, tuple)):
        return value
    if not commas:
        return tuple(value)
    return tuple(p.strip() for v in value for p in (v.split(",") if isinstance(v, str) else [v])
                 if not isinstance(p, str) or p.strip())


@dataclass(frozen=True, kw_only=True)
class CalibrateRequest:
    """Activation statistics on a calibration set, a method's ranges, and the INT8 Q/DQ model (or the Q/DQ model
    from a TensorRT calibration cache)."""

    model: PathLike | ModelDir = model_option()
    calibration_set: PathLike | CalibrationSet | None = calibration_set_option(
        "Calibration-set folder (texts.jsonl), a .jsonl of {\"text\": ...} or the loaded set (None with "
        "--from-cache).", None)
    out: PathLike | None = option(
        None, flags=("--out", "-o"), positional=True, cli_type=Path | None,
        help="Output folder: model.int8.onnx (Q/DQ), calibration.cache, calibration.json and stats.npz "
             "[default: runs/calibrate-<method>].")
    method: CalibrationMethod = option(
        CalibrationMethod.MSE, flags=("--method", "-m"), cli_type=str,
        help="mse | entropy | minmax | percentile (mse: best held-out accuracy on the demo).")
    percentile: float = option(MethodParams.percentile, bound=PERCENTILE,
                               help="Percentile of |x| for --method percentile.")
    batch_size: int = option(32, flags=("--batch-size", "-b"), bound=COUNT,
                             help="Most texts per inference batch (length-bucketed; the budget may cut it).")
    op_types: tuple[str, ...] = option(
        DEFAULT_OP_TYPES, cli_type=list[str], help="Op types to quantize (comma-separated or repeated).")
    exclude: tuple[str, ...] = option(
        (), flags=("--exclude", "-x"), cli_type=list[str],
        help="Regex of node names or module paths to keep in FP32 (repeatable), e.g. 'layer\\.5/' or "
             "'encoder.layer.5.output.dense'; works on legacy and dynamo exports; a pattern that matches nothing "
             "is warned about.")
    target: Target = option(Target.TENSORRT, cli_type=str,
                            help="tensorrt | onnxruntime: the Q/DQ layout to write.")
    tokenizer: PathLike | None = option(None, cli_type=Path | None,
                                        help="Tokenizer folder when MODEL is an .onnx file.")
    num_bins: int = option(MethodParams.num_bins, bound=Bound(low=256, high=1 << 24, integer=True, example="2048"),
                           help="Histogram bins (a power of two).")
    from_cache: PathLike | None = option(
        None, cli_type=Path | None,
        help="Build the Q/DQ model from this TensorRT calibration cache instead of calibrating (the model does "
             "not run, and a bare .onnx file needs no tokenizer).")
    use_cache: bool = option(True, flags=("--reuse-stats/--fresh-stats",),
                             help="Reuse saved statistics (--fresh-stats: run the model again).")
    cache_dir: PathLike | None = option(None, cli=False,
                                        help="The statistics cache (None: $CALIBKIT_CACHE, default ~/.cache/calibkit).")
    # ---- a knob of the pipeline: no command line sets it
    threads: int | None = option(None, cli=False, api=False, bound=COUNT_OR_NONE,
                                 help="Threads of the statistics and the method (None: one per usable CPU).")

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", coerce(CalibrationMethod, self.method))
        object.__setattr__(self, "target", coerce(Target, self.target))
        object.__setattr__(self, "op_types", _names(self.op_types, commas=True))
        object.__setattr__(self, "exclude", _names(self.exclude))
        self.validate()  # a request that exists is valid: checked once, when it is made

    @property
    def params(self) -> MethodParams:
        return MethodParams(num_bins=self.num_bins, percentile=self.percentile)

    @property
    def out_dir(self) -> Path:
        """``out``, by default runs/calibrate-<method> (or -from-cache)."""
        name = "from-cache" if self.from_cache is not None else str(self.method)
        return Path(self.out) if self.out is not None else Path("runs") / f"calibrate-{name}"

    def validate(self) -> None:
        """Every check that needs no file read: UsageError naming the option and what to pass instead."""
        from calibkit.data.calibset import CalibrationSet
        from calibkit.data.modeldir import ModelDir

        check_paths({"model": self.model}, {"calibration_set": self.calibration_set, "out": self.out,
                                            "tokenizer": self.tokenizer, "cache_dir": self.cache_dir,
                                            "from_cache": self.from_cache}, loaded=(ModelDir, CalibrationSet))
        check_names({"method": self.method, "target": self.target}, {"op_types": self.op_types,
                                                                     "exclude": self.exclude},
                    required=("method", "target"))
        check_bounds(self)
        if not isinstance(self.method, CalibrationMethod):
            raise UsageError(f"unknown --method {self.method!r}", hint=f"choose one of: {CalibrationMethod.words()}")
        if not isinstance(self.target, Target):
            raise UsageError(f"unknown --target {self.target!r}", hint="choose tensorrt or onnxruntime")
        if self.num_bins & (self.num_bins - 1):
            raise UsageError(f"--num-bins must be a power of two >= 256, got {self.num_bins}",
                             hint="the default is 2048")
        if not self.op_types:
            raise UsageError("--op-types is empty", hint="e.g. --op-types MatMul,Gemm")
        for p in self.exclude:
            try:
                re.compile(p)
            except re.error as exc:
                raise UsageError(f"--exclude {p!r} is not a valid regular expression ({exc})") from None
        self._check_sources()

    def _check_sources(self) -> None:
        if self.from_cache is not None and self.calibration_set is not None:
            raise UsageError("--from-cache and --calibration-set exclude each other")
        if self.from_cache is None and self.calibration_set is None:
            raise UsageError("--calibration-set is required (or --from-cache FILE)",
                             hint="create one with `calibkit sample LOGS.jsonl --out DIR`")
        if self.out_dir.resolve() == Path.cwd().resolve():
            raise UsageError("--out is the current directory", hint="calibkit writes into a folder: pass --out DIR")
