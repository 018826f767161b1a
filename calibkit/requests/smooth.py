"""What ``calibkit smooth`` is asked: :class:`SmoothRequest`, every option declared once.

The smoothing pipeline (``calibrate.smoothing``) reads the request as its configuration; what the run may use
(``--memory-budget``, ``--max-batch-tokens``) is no field: it comes with the run's resources.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from calibkit.requests.checks import COUNT, Bound, check_numbers, check_paths
from calibkit.requests.options import Choice, calibration_set_option, check_bounds, coerce, model_option, option
from calibkit.types import PathLike

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.data.calibset import CalibrationSet
    from calibkit.data.modeldir import ModelDir


ALPHA = Bound(low=0, high=1, example="0.8 (or auto)")


class Alpha(Choice):
    """The migration strength chosen on the calibration set: ``AUTO``, per activation the alpha (0.5 to 1.0, or
    none) whose fake-quantized INT8 product is closest to FP32 on sampled rows."""

    AUTO = "auto"


@dataclass(frozen=True, kw_only=True)
class SmoothRequest:
    """A smoothed FP32 model folder (SmoothQuant: activation outliers moved into the weights), checked to compute
    the same function as the original on calibration texts."""

    model: PathLike | ModelDir = model_option()
    calibration_set: PathLike | CalibrationSet = calibration_set_option(
        "Folder written by `calibkit sample`, or the loaded set: the activations are measured on it.")
    out: PathLike = option(flags=("--out", "-o"), positional=True, cli_type=Path,
                           help="The smoothed model folder to write (new, or calibkit's).")
    alpha: Alpha | float = option(
        Alpha.AUTO, cli_type=Alpha | float,
        help="Migration strength in [0, 1] (1: activations flattened, the weights take every outlier), or auto: per "
             "activation, the alpha with the least INT8 product error on the calibration rows. From Python: a "
             "number or Alpha.AUTO.")
    tokenizer: PathLike | None = option(None, cli_type=Path | None,
                                        help="Tokenizer folder when MODEL is an .onnx file.")
    batch_size: int = option(32, flags=("--batch-size", "-b"), bound=COUNT, help="Most texts per inference batch.")

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", coerce(Alpha, self.alpha))
        self.validate()  # a request that exists is valid: checked once, when it is made

    @property
    def fixed_alpha(self) -> float | None:
        """The alpha every layer gets (None: chosen per activation, ``Alpha.AUTO``)."""
        return None if self.alpha is Alpha.AUTO else float(self.alpha)

    def validate(self) -> None:
        """Every check that reads no file: UsageError naming the option and what to pass instead."""
        from calibkit.data.calibset import CalibrationSet
        from calibkit.data.modeldir import ModelDir

        check_paths({"model": self.model, "calibration_set": self.calibration_set, "out": self.out},
                    {"tokenizer": self.tokenizer}, loaded=(ModelDir, CalibrationSet))
        if self.alpha is not Alpha.AUTO:
            check_numbers({"--alpha": (self.alpha, ALPHA)})
        check_bounds(self)
