"""The one place that makes Runners: a registry of backends by name, each a :class:`BackendSpec` (how it opens an
engine file, and optionally how it runs an ONNX model calibkit made). :func:`open_runner` opens an engine file
through the backend its sidecar names (or its suffix), :func:`model_runner` runs an ONNX model the library made
itself (tapped copies, sensitivity variants, the FP32 reference). Library code receives a
:class:`ModelRunnerFactory` (``Resources.runner_factory``) or calls these two; it never constructs a backend's
runner class. A new backend is its module plus one :func:`register_backend` call (docs/architecture.md,
*Adding a backend*)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from calibkit.enginefiles.artifact import EngineArtifact
from calibkit.engines.base import BaseRunner
from calibkit.errors import ModelError, UsageError
from calibkit.types import Backend, PathLike

#: an ONNX model to run: a file or its serialized bytes
ModelSource = PathLike | bytes


class ModelRunnerFactory(Protocol):
    """Makes a runner for an ONNX model (path or serialized bytes). ``layout``: the Q/DQ layout of an INT8
    model; ``threads``: intra-op threads; ``keep_model=False`` lets the runner drop the model bytes once it holds
    the model; ``spinning=False``: idle threads sleep."""

    def __call__(self, model: ModelSource, *, output_names: Sequence[str] | None = None, threads: int | None = None,
                 layout: str | None = None, name: str | None = None, keep_model: bool = True,
                 spinning: bool = True) -> BaseRunner: ...


#: opens an engine file: ``(path, its artifact or None, output_names)``
EngineOpener = Callable[[Path, "EngineArtifact | None", "Sequence[str] | None"], BaseRunner]


@dataclass(frozen=True)
class BackendSpec:
    """A backend as the registry knows it. ``suffixes``: the engine-file suffixes it owns (found by suffix when
    a file has no sidecar); ``onnx_engines``: whether its engine files are ONNX models (per-layer analysis taps
    them); ``run_model``: how it runs an ONNX model calibkit made (None: it only opens its own engines)."""

    name: str
    open_engine: EngineOpener
    suffixes: tuple[str, ...] = ()
    onnx_engines: bool = False
    run_model: ModelRunnerFactory | None = None


_BACKENDS: dict[str, BackendSpec] = {}


def register_backend(spec: BackendSpec, *, replace: bool = False) -> BackendSpec:
    """Make ``spec`` the backend named ``spec.name``; a name taken is refused unless ``replace``."""
    if not spec.name or not isinstance(spec.name, str):
        raise UsageError(f"a backend needs a name, got {spec.name!r}")
    if spec.name in _BACKENDS and not replace:
        raise UsageError(f"a backend named {spec.name!r} is already registered")
    _BACKENDS[spec.name] = spec
    return spec


def unregister_backend(name: str) -> None:
    """Forget the backend ``name`` (a test's own); the built-in ones stay."""
    if name in (b.value for b in Backend):
        raise UsageError(f"{name!r} is a built-in backend")
    _BACKENDS.pop(name, None)


def registered_backends() -> tuple[str, ...]:
    return tuple(_BACKENDS)


def backend_spec(name: str | Backend) -> BackendSpec:
    """The backend registered as ``name``; ModelError naming the registered ones otherwise."""
    key = name.value if isinstance(name, Backend) else str(name)
    spec = _BACKENDS.get(key)
    if spec is None:
        raise ModelError(f"unknown backend {key!r}", hint=f"registered backends: {', '.join(_BACKENDS)}")
    return spec


def _backend_of_file(path: Path) -> BackendSpec:
    for spec in _BACKENDS.values():
        if path.suffix in spec.suffixes:
            return spec
    return backend_spec(Backend.ONNXRUNTIME)


def is_onnx_engine(artifact: EngineArtifact) -> bool:
    """Whether the artifact's engine file is an ONNX model its backend runs (so it can be tapped)."""
    return backend_spec(artifact.backend).onnx_engines


def open_runner(engine: PathLike | EngineArtifact, *, output_names: Sequence[str] | None = None) -> BaseRunner:
    """A runner for an engine artifact, by the backend its sidecar names (a bare path: by its suffix)."""
    art = engine if isinstance(engine, EngineArtifact) else None
    path = art.path if art is not None else Path(os.fspath(engine))  # type: ignore[arg-type]
    spec = backend_spec(art.backend) if art is not None else _backend_of_file(path)
    return spec.open_engine(path, art, output_names)


def model_runner(
    model: ModelSource,
    *,
    output_names: Sequence[str] | None = None,
    threads: int | None = None,
    layout: str | None = None,
    name: str | None = None,
    keep_model: bool = True,
    spinning: bool = True,
    backend: str | Backend = Backend.ONNXRUNTIME,
) -> BaseRunner:
    """A runner for an ONNX model calibkit made or was given, by ``backend`` (default ONNX Runtime). ``layout``:
    the Q/DQ layout of an INT8 model ("tensorrt" runs as exact Q/DQ, the arithmetic TensorRT computes)."""
    spec = backend_spec(backend)
    if spec.run_model is None:
        raise UsageError(f"the {spec.name} backend runs its own engine files only, not ONNX models")
    return spec.run_model(model, output_names=output_names, threads=threads, layout=layout, name=name,
                          keep_model=keep_model, spinning=spinning)


# ---------------------------------------------------------------- the built-in backends


def _ort_model(model: ModelSource, *, output_names: Sequence[str] | None = None, threads: int | None = None,
               layout: str | None = None, name: str | None = None, keep_model: bool = True,
               spinning: bool = True) -> BaseRunner:
    from calibkit.engines.onnxruntime import OnnxRuntimeRunner, evaluation_optimization

    optimization = evaluation_optimization(layout) if layout else "all"
    return OnnxRuntimeRunner(model, output_names=output_names, intra_op_threads=threads,
                             optimization=optimization, name=name, keep_model=keep_model, spinning=spinning)


def _ort_engine(path: Path, art: EngineArtifact | None, output_names: Sequence[str] | None) -> BaseRunner:
    from calibkit.engines.onnxruntime import OnnxRuntimeRunner, evaluation_optimization

    return OnnxRuntimeRunner(path, output_names=output_names,
                             optimization=evaluation_optimization(engine_layout(art, path)))


def _trt_engine(path: Path, art: EngineArtifact | None, output_names: Sequence[str] | None) -> BaseRunner:
    from calibkit.engines.tensorrt.runner import TensorRTRunner

    return TensorRTRunner(path, output_names=output_names)


def engine_layout(art: EngineArtifact | None, path: Path) -> str | None:
    """The Q/DQ layout of an INT8 ONNX engine (its sidecar's ``target``, else read from the file's zero
    points); None for FP32/FP16 engines, which are not read again."""
    if art is not None:
        if art.precision.value != "int8":
            return None
        if art.extra.target:
            return str(art.extra.target)
    from calibkit.graph import load_model, qdq_layout

    try:
        model = load_model(path, load_external_data=False)
    except ModelError:  # the runner reports unreadable files itself
        return None
    return qdq_layout(model)


register_backend(BackendSpec(Backend.ONNXRUNTIME.value, _ort_engine, suffixes=(".onnx",), onnx_engines=True,
                             run_model=_ort_model))
register_backend(BackendSpec(Backend.TENSORRT.value, _trt_engine, suffixes=(".engine", ".plan")))
