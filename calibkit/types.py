"""Core value types shared across layers. Frozen dataclasses; no meaning carried by tuple positions."""

from __future__ import annotations

import enum
import math
import numbers
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast, overload

INT8_MAX = 127
UINT8_STEPS = 255  # a uint8 grid's highest code (its lowest is 0)
UINT8_SYMMETRIC_ZERO = 128  # the zero point that makes a uint8 grid the int8 one shifted
SEED_MAX = (1 << 32) - 1  # numpy, scikit-learn and torch seeds are unsigned 32-bit

#: how every path a caller gives is typed (a request's path fields, the API's parameters)
PathLike = str | os.PathLike[str]


@overload
def request_path(value: PathLike) -> Path: ...
@overload
def request_path(value: PathLike | None) -> Path | None: ...
def request_path(value: PathLike | None) -> Path | None:
    """A path field of a request whose ``__post_init__`` makes it a Path (build's, deploy's, export's), read back:
    typed :data:`PathLike` (what the caller may pass), it holds a Path (or None) once the request is built.
    Returns it as it is."""
    return cast("Path | None", value)


def check_seed(seed: object, option: str = "--seed") -> None:
    """A seed every random generator calibkit seeds accepts (0 .. 2**32-1), else a UsageError with a hint."""
    from calibkit.errors import UsageError

    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= SEED_MAX:
        raise UsageError(f"{option} must be a whole number from 0 to {SEED_MAX} (got {str(seed)[:40]})",
                         hint=f"pass e.g. {option} 0; the same seed draws the same subsets")


class Precision(str, enum.Enum):
    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"


class Method(str, enum.Enum):
    ENTROPY = "entropy"
    MINMAX = "minmax"
    PERCENTILE = "percentile"
    MSE = "mse"


class Backend(str, enum.Enum):
    ONNXRUNTIME = "onnxruntime"
    TENSORRT = "tensorrt"


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output: name, numpy dtype name and shape (None or a string for dynamic axes)."""

    name: str
    dtype: str
    shape: tuple[int | str | None, ...]


@dataclass(frozen=True)
class MethodParams:
    """Parameters of a calibration method (the defaults follow TensorRT / ModelOpt, REFERENCES.md §2)."""

    num_bins: int = 2048
    num_quant_bins: int = 128
    start_bin: int = 128
    percentile: float = 99.99

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_bins": self.num_bins,
            "num_quant_bins": self.num_quant_bins,
            "start_bin": self.start_bin,
            "percentile": self.percentile,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MethodParams:
        return cls(
            num_bins=int(d.get("num_bins", 2048)),
            num_quant_bins=int(d.get("num_quant_bins", 128)),
            start_bin=int(d.get("start_bin", 128)),
            percentile=float(d.get("percentile", 99.99)),
        )


@dataclass(frozen=True)
class TensorRange:
    """The INT8 clipping range chosen for one activation tensor: [-amax, amax], the symmetric int8 grid TensorRT
    runs. ``observed_min``/``observed_max``: the extremes calibration saw (None where unknown, as for ranges read
    from a TensorRT cache); the onnxruntime layout's uint8 grid is fitted to them (:meth:`uint8_grid`)."""

    tensor: str
    amax: float
    method: Method
    observed_min: float | None = None
    observed_max: float | None = None

    @property
    def scale(self) -> float:
        return self.amax / INT8_MAX

    def uint8_grid(self, fitted: bool = True) -> tuple[float, int]:
        """(scale, zero point) of the onnxruntime layout's uint8 grid for this tensor: [-amax, amax] clipped to
        what calibration observed (zero kept inside), so a one-sided tensor (a GELU output, whose minimum is
        -0.17) gets all 256 steps where the symmetric grid wastes half of them. Without observed extremes, when
        both lie beyond amax, or with ``fitted`` False, it is the symmetric grid shifted by 128 (scale
        amax / 127, zero point 128), which dequantizes to exactly the int8 grid's values."""
        lo, hi = -self.amax, self.amax
        if fitted and self.observed_min is not None and self.observed_max is not None:
            lo = max(min(self.observed_min, 0.0), -self.amax)
            hi = min(max(self.observed_max, 0.0), self.amax)
        if (lo == -self.amax and hi == self.amax) or not hi - lo > 0:
            return self.amax / INT8_MAX, UINT8_SYMMETRIC_ZERO
        scale = (hi - lo) / UINT8_STEPS
        return scale, int(min(UINT8_STEPS, max(0, round(-lo / scale))))


def _observed(entry: dict[str, Any]) -> dict[str, float]:
    """A table entry's observed extremes (both or neither; earlier tables have none), checked: numbers (not
    strings or booleans, as for ``amax``), finite, the minimum not above the maximum."""
    has = [k for k in ("observed_min", "observed_max") if k in entry]
    if not has:
        return {}
    tensor = entry.get("tensor")
    if len(has) == 1:
        other = "observed_max" if has[0] == "observed_min" else "observed_min"
        raise ValueError(f"range of {tensor!r} has {has[0]} but no {other} (calibkit writes both or neither)")
    ends: list[float] = []
    for key in ("observed_min", "observed_max"):
        v = entry[key]
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise ValueError(f"range of {tensor!r}: {key} is {type(v).__name__}, not a number")
        try:
            ends.append(float(v))
        except OverflowError:
            raise ValueError(f"range of {tensor!r}: {key} is too large for a float") from None
    lo, hi = ends
    if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
        raise ValueError(f"range of {tensor!r}: observed_min {lo} and observed_max {hi} are not "
                         f"finite with min <= max")
    return {"observed_min": lo, "observed_max": hi}


@dataclass(frozen=True)
class CalibrationTable:
    """The only hand-off from calibration to quantization."""

    model_sha256: str
    calibration_set_id: str
    method: Method
    params: MethodParams
    ranges: tuple[TensorRange, ...]
    provenance: dict[str, str] = field(default_factory=dict)

    def amax(self) -> dict[str, float]:
        return {r.tensor: r.amax for r in self.ranges}

    def get(self, tensor: str) -> TensorRange | None:
        for r in self.ranges:
            if r.tensor == tensor:
                return r
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_sha256": self.model_sha256,
            "calibration_set_id": self.calibration_set_id,
            "method": self.method.value,
            "params": self.params.to_dict(),
            "ranges": [
                {"tensor": r.tensor, "amax": r.amax, "scale": r.scale, "method": r.method.value,
                 **({} if r.observed_min is None or r.observed_max is None
                    else {"observed_min": r.observed_min, "observed_max": r.observed_max})}
                for r in self.ranges
            ],
            "provenance": dict(self.provenance),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CalibrationTable:
        """The table of ``d``; ValueError for one calibkit never writes (each tensor has one range: with two,
        ``get`` would read the first and ``amax``, the Q/DQ writer and the cache the last)."""
        seen: set[str] = set()
        twice: set[str] = set()
        for r in d["ranges"]:
            t = str(r.get("tensor")) if isinstance(r, dict) else ""
            (twice if t in seen else seen).add(t)
        if twice:
            shown = ", ".join(sorted(twice)[:5])
            raise ValueError(f"{len(twice)} tensor(s) have more than one range: {shown} (calibkit writes one range "
                             "per tensor)")
        return cls(
            model_sha256=str(d["model_sha256"]),
            calibration_set_id=str(d["calibration_set_id"]),
            method=Method(d["method"]),
            params=MethodParams.from_dict(d.get("params", {})),
            ranges=tuple(
                TensorRange(tensor=r["tensor"], amax=float(r["amax"]), method=Method(r.get("method", d["method"])),
                            **_observed(r))
                for r in d["ranges"]
            ),
            provenance={str(k): str(v) for k, v in d.get("provenance", {}).items()},
        )
