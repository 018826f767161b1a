"""The few CUDA runtime calls the TensorRT runner needs, through cuda-python, with errors turned into ours."""

from __future__ import annotations

from typing import Any

from calibkit._deps import require
from calibkit.errors import BackendError


def cudart() -> Any:
    """``cuda.bindings.runtime`` (cuda-python >= 12.6), or the older ``cuda.cudart`` spelling."""
    try:
        from cuda.bindings import runtime

        return runtime
    except ImportError:
        return require("cuda.cudart")


def check(result: Any, what: str) -> Any:
    """cuda-python returns ``(err, *values)``; raise on a non-success code, return the value(s)."""
    rt = cudart()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != rt.cudaError_t.cudaSuccess:
        _, name = rt.cudaGetErrorName(err)
        raise BackendError(f"CUDA {what} failed: {name.decode() if isinstance(name, bytes) else name}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


class DeviceBuffer:
    """A grow-only device allocation."""

    def __init__(self) -> None:
        self.ptr = 0
        self.nbytes = 0

    def ensure(self, nbytes: int) -> int:
        if nbytes > self.nbytes:
            self.free()
            self.ptr = int(check(cudart().cudaMalloc(max(nbytes, 1)), "cudaMalloc"))
            self.nbytes = nbytes
        return self.ptr

    def free(self) -> None:
        if self.ptr:
            check(cudart().cudaFree(self.ptr), "cudaFree")
        self.ptr = 0
        self.nbytes = 0
