"""calibkit: INT8 calibration and quantization-accuracy workbench for transformer models.

The public API (imported on first use, so ``import calibkit`` stays light)::

    import calibkit as ck
    cs = ck.sample("logs.jsonl", "calibration_sets/logs")
    r = ck.calibrate("model/", cs, "runs/int8")
    c = ck.compare("engines/fp32.onnx", "engines/int8.onnx", "test.jsonl")
    c.agreement

Functions: :func:`export`, :func:`sample`, :func:`smooth`, :func:`calibrate`, :func:`histogram`, :func:`build`,
:func:`compare`, :func:`tune`, :func:`deploy`, :func:`load_report`, :func:`render_report`, :func:`run`
(calibkit.api; ``run`` takes an :class:`ExportRequest`, :class:`SampleRequest`, :class:`SmoothRequest`,
:class:`CalibrateRequest`, :class:`BuildRequest`, :class:`CompareRequest`, :class:`TuneRequest` or
:class:`DeployRequest`, the values calibkit.requests declares every option in);
:func:`prepare_demo` with :class:`PrepareOptions` (calibkit.demo.prepare: the demo's model, data and log). Results:
:class:`Comparison`, :class:`TuneResult` and their parts (calibkit.results.runs); :class:`DeployResult` and
:class:`PlanDocument` (calibkit.results.documents). Errors: :class:`CalibkitError` and its
subclasses (calibkit.errors). Progress: every long call takes ``progress=``, a callable given each
:class:`ProgressEvent` (calibkit.progress).
"""

from __future__ import annotations

import importlib as _importlib
import sys as _sys
import types as _types  # aliased: the subpackage calibkit.types, once imported, is bound as calibkit.types
from typing import TYPE_CHECKING, Any

from calibkit._version import __version__

if TYPE_CHECKING:  # pragma: no cover - types only
    import inspect as _inspect

_API = ("export", "sample", "smooth", "calibrate", "histogram", "build", "compare", "tune", "deploy", "load_report",
        "render_report", "run")
_REQUESTS = {"ExportRequest": "calibkit.requests.export", "SampleRequest": "calibkit.requests.sample",
             "SmoothRequest": "calibkit.requests.smooth", "CalibrateRequest": "calibkit.requests.calibrate",
             "BuildRequest": "calibkit.requests.build", "CompareRequest": "calibkit.requests.compare",
             "TuneRequest": "calibkit.requests.tune", "DeployRequest": "calibkit.requests.deploy",
             "Traffic": "calibkit.requests.traffic", "Profiles": "calibkit.requests.deploy",
             "Alpha": "calibkit.requests.smooth", "ResourceOptions": "calibkit.requests.resources"}
_DEMO = ("prepare_demo", "PrepareOptions")  # the demo's model, data and log (notebooks/walkthrough.ipynb)
_RESULTS = ("Comparison", "EngineEvaluation", "LayerVerdict", "Evidence", "TuneResult", "TunePlan", "Candidate",
            "HoldoutVerdict")
_DOCUMENTS = ("DeployResult", "PlanDocument")  # what ships: deploy.json and tune's plan.json
_PROGRESS = ("ProgressEvent",)
_ERRORS = ("CalibkitError", "UsageError", "DataError", "ModelError", "CalibrationError", "BackendError",
           "MissingDependencyError", "TargetMissedError")
_WHERE = {**dict.fromkeys(_API, "calibkit.api"), **dict.fromkeys(_DEMO, "calibkit.demo.prepare"),
          **dict.fromkeys(_RESULTS, "calibkit.results.runs"),
          **dict.fromkeys(_DOCUMENTS, "calibkit.results.documents"),
          **dict.fromkeys(_ERRORS, "calibkit.errors"), **dict.fromkeys(_PROGRESS, "calibkit.progress"), **_REQUESTS}

__all__ = ["__version__", *_API, *_REQUESTS, *_DEMO, *_RESULTS, *_DOCUMENTS, *_ERRORS, *_PROGRESS]


class _ApiAndPackage:
    """``calibkit.calibrate`` and ``calibkit.deploy``: the API function when called, the subpackage of the same
    name for attribute access (``calibkit.calibrate.pipeline``), since both have the one name."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(_importlib.import_module("calibkit.api"), self._name)(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(_importlib.import_module(f"calibkit.{self._name}"), name)

    def __repr__(self) -> str:
        return f"<calibkit.{self._name}: calibkit.api.{self._name}, and the calibkit.{self._name} package>"

    @property
    def __doc__(self) -> str | None:  # type: ignore[override]
        return getattr(_importlib.import_module("calibkit.api"), self._name).__doc__

    @property
    def __signature__(self) -> _inspect.Signature:
        """The API function's signature, for ``inspect.signature``, ``help`` and editors."""
        import inspect

        return inspect.signature(getattr(_importlib.import_module("calibkit.api"), self._name))


_SHARED = ("calibrate", "deploy")  # API functions named like a subpackage


class _Package(_types.ModuleType):
    def __setattr__(self, name: str, value: object) -> None:
        if name in _SHARED and isinstance(value, _types.ModuleType):
            return  # the import system binding the subpackage: the name stays the API entry
        super().__setattr__(name, value)


calibrate = _ApiAndPackage("calibrate")
deploy = _ApiAndPackage("deploy")
_sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'calibkit' has no attribute {name!r}")
    value = getattr(_importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
