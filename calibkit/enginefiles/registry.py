"""The one place that makes Runners: :func:`open_runner` for an engine file (ONNX Runtime ``.onnx`` or TensorRT
``.engine``), :func:`model_runner` for an ONNX model the library made itself (tapped copies, sensitivity
variants, the FP32 reference). Library code receives a :data:`ModelRunnerFactory` (``Resources.runner_factory``)
or calls :func:`model_runner`; it never constructs a backend's runner class."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from calibkit.enginefiles.artifact import EngineArtifact
from calibkit.engines.base import BaseRunner
from calibkit.errors import ModelError
from calibkit.types import Backend


def open_runner(
    engine: str | Path | EngineArtifact,
    *,
    output_names: Sequence[str] | None = None,
    providers: Sequence[str] | None = None,
) -> BaseRunner:
    """A runner for an engine artifact (ONNX Runtime ``.onnx`` or TensorRT ``.engine``)."""
    art = engine if isinstance(engine, EngineArtifact) else None
    path = art.path if art else Path(engine)  # type: ignore[arg-type]
    backend = art.backend if art else (Backend.TENSORRT if path.suffix in (".engine", ".plan") else Backend.ONNXRUNTIME)
    if backend is Backend.ONNXRUNTIME:
        from calibkit.engines.onnxruntime import OnnxRuntimeRunner, evaluation_optimization

        layout = _engine_layout(art, path)
        return OnnxRuntimeRunner(path, providers=providers, output_names=output_names,
                                 optimization=evaluation_optimization(layout))
    if backend is Backend.TENSORRT:
        from calibkit.engines.tensorrt.runner import TensorRTRunner

        return TensorRTRunner(path, output_names=output_names)
    raise ModelError(f"unknown backend for {path}")


def _engine_layout(art: EngineArtifact | None, path: Path) -> str | None:
    """The Q/DQ layout of an INT8 ONNX engine (its sidecar's ``target``, else read from the file's zero
    points); None for FP32/FP16 engines, which are not read again."""
    if art is not None:
        if art.precision.value != "int8":
            return None
        if art.extra.get("target"):
            return str(art.extra["target"])
    from calibkit.graph import load_model, qdq_layout

    try:
        model = load_model(path, load_external_data=False)
    except ModelError:  # the runner reports unreadable files itself
        return None
    return qdq_layout(model)


#: makes a runner for an ONNX model (path or serialized bytes); :func:`model_runner` is the default
ModelRunnerFactory = Callable[..., BaseRunner]


def model_runner(
    model: str | os.PathLike[str] | bytes,
    *,
    output_names: Sequence[str] | None = None,
    threads: int | None = None,
    layout: str | None = None,
    name: str | None = None,
    keep_model: bool = True,
    spinning: bool = True,
    providers: Sequence[str] | None = None,
) -> BaseRunner:
    """A runner for an ONNX model calibkit made or was given (ONNX Runtime). ``layout``: the Q/DQ layout of an
    INT8 model ("tensorrt" runs as exact Q/DQ, the arithmetic TensorRT computes); ``threads``: intra-op
    threads; ``keep_model=False`` lets the runner drop the model bytes once its session is built."""
    from calibkit.engines.onnxruntime import OnnxRuntimeRunner, evaluation_optimization

    optimization = evaluation_optimization(layout) if layout else "all"
    return OnnxRuntimeRunner(model, providers=providers, output_names=output_names, intra_op_threads=threads,
                             optimization=optimization, name=name, keep_model=keep_model, spinning=spinning)
