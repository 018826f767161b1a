"""calibkit: INT8 calibration and quantization-accuracy workbench for transformer models.

The public API (imported on first use, so ``import calibkit`` stays light)::

    import calibkit as ck
    cs = ck.sample("logs.jsonl", "calibration_sets/logs")
    r = ck.calibrate("model/", cs, "runs/int8")
    c = ck.compare("engines/fp32.onnx", "engines/int8.onnx", "test.jsonl")
    c.agreement

Functions: :func:`sample`, :func:`smooth`, :func:`calibrate`, :func:`build`, :func:`compare`, :func:`tune`,
:func:`load_report`, :func:`render_report` (calibkit.api). Results: :class:`Comparison`, :class:`TuneResult`
and their parts (calibkit.evaluate.results). Errors: :class:`CalibkitError` and its subclasses (calibkit.errors).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_API = ("sample", "smooth", "calibrate", "build", "compare", "tune", "load_report", "render_report")
_RESULTS = ("Comparison", "EngineEvaluation", "LayerVerdict", "Evidence", "TuneResult", "TunePlan", "Candidate",
            "HoldoutVerdict")
_ERRORS = ("CalibkitError", "UsageError", "DataError", "ModelError", "CalibrationError", "BackendError",
           "MissingDependencyError")
_WHERE = {**dict.fromkeys(_API, "calibkit.api"), **dict.fromkeys(_RESULTS, "calibkit.evaluate.results"),
          **dict.fromkeys(_ERRORS, "calibkit.errors")}

__all__ = ["__version__", *_API, *_RESULTS, *_ERRORS]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'calibkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
