"""TensorRT 11 backend: the ONLY place that imports ``tensorrt`` and ``cuda`` (both imported lazily).

- ``profile``: the pure part: optimization-profile sequence lengths from a calibration set's token lengths.
- ``builder``: a strongly typed engine from an FP32 / FP16 / Q/DQ INT8 ONNX model (TensorRT 11 has no weak
  typing, no INT8 calibrators: the precision is whatever the ONNX graph says).
- ``runner``: :class:`TensorRTRunner`, a BaseRunner over a serialized engine.

GPU memory comes from NVIDIA's ``cuda-python`` (``cuda.bindings.runtime``) rather than pycuda: it is maintained
by NVIDIA alongside the CUDA toolkit, ships binary wheels (no compiler or CUDA toolkit needed to install it),
and is what the current TensorRT Python samples use; pycuda must be built against a local CUDA toolkit.

Typing: checked with mypy against ``tensorrt-stubs`` (10.13 API). The calls used here exist unchanged in
TensorRT 11 (NetworkDefinitionCreationFlag.STRONGLY_TYPED is accepted and ignored there, strong typing being
always on); what 11 changed and this code does not use: builder precision flags and INT8 calibrators are gone,
``EngineInspector.execution_context`` is the only inspector attribute, and the inspector's JSON replaced
``Bindings`` by ``I/O Tensors`` (we store the JSON as TensorRT writes it).
"""

from __future__ import annotations

from types import ModuleType

from calibkit._deps import available as _real_module  # treats the stubs' bare folder as absent
from calibkit._deps import require
from calibkit.errors import MissingDependencyError

_HINT = (
    "install TensorRT from NVIDIA's index (pip install 'calibkit[tensorrt]' pulls tensorrt + cuda-python) "
    "on a machine with an NVIDIA GPU, or use --backend onnxruntime"
)


def available() -> bool:
    """True when the real ``tensorrt`` and cuda-python are importable (without importing them)."""
    return _real_module("tensorrt") and (_real_module("cuda.bindings") or _real_module("cuda.cudart"))


def load_tensorrt() -> ModuleType:
    """``import tensorrt``, or a MissingDependencyError with a hint (also when only the stubs are installed)."""
    if not _real_module("tensorrt"):
        raise MissingDependencyError("TensorRT is not installed (the tensorrt Python package)", hint=_HINT)
    try:
        return require("tensorrt")
    except MissingDependencyError as exc:
        raise MissingDependencyError(exc.message, hint=_HINT) from exc


def require_cuda() -> None:
    if not (_real_module("cuda.bindings") or _real_module("cuda.cudart")):
        raise MissingDependencyError("cuda-python is not installed (GPU memory for the TensorRT backend)", hint=_HINT)
