"""The one place that turns an engine file into a Runner. Library code receives runners; it never builds one
from a string."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from calibkit.engines.artifact import EngineArtifact
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
        from calibkit.engines.onnxruntime import OnnxRuntimeRunner

        return OnnxRuntimeRunner(path, providers=providers, output_names=output_names)
    if backend is Backend.TENSORRT:
        from calibkit.engines.tensorrt.runner import TensorRTRunner

        return TensorRTRunner(path, output_names=output_names)
    raise ModelError(f"unknown backend for {path}")
