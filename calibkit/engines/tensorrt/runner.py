"""TensorRTRunner: runs a serialized engine with ``set_input_shape`` / ``set_tensor_address`` /
``execute_async_v3`` on one CUDA stream, device memory from cuda-python (see the package docstring)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from calibkit.engines.base import BaseRunner, Feeds, Outputs
from calibkit.engines.tensorrt import load_tensorrt, require_cuda
from calibkit.engines.tensorrt._cuda import DeviceBuffer, check, cudart
from calibkit.errors import BackendError, ModelError
from calibkit.types import TensorSpec

if TYPE_CHECKING:
    import tensorrt as trt


class TensorRTRunner(BaseRunner):
    def __init__(
        self,
        engine: str | os.PathLike[str],
        *,
        output_names: Sequence[str] | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(name or Path(engine).name)
        self._path = Path(engine)
        self._requested = tuple(output_names) if output_names else None
        self._all_outputs: tuple[str, ...] = ()
        self._dtypes: dict[str, np.dtype[Any]] = {}
        self._buffers: dict[str, DeviceBuffer] = {}
        self._engine: trt.ICudaEngine | None = None
        self._context: trt.IExecutionContext | None = None
        self._stream: Any = None

    def _activate_impl(self) -> None:
        load_tensorrt()
        require_cuda()
        import tensorrt as trt

        if not self._path.is_file():
            raise ModelError(f"engine not found: {self._path}")
        rt = cudart()
        logger = trt.Logger(trt.Logger.WARNING)
        runtime = trt.Runtime(logger)
        engine = runtime.deserialize_cuda_engine(self._path.read_bytes())
        if engine is None:
            raise BackendError(
                f"TensorRT could not load {self._path}",
                hint="engines only run on the GPU model and TensorRT version that built them; rebuild it here",
            )
        inputs, outputs = [], []
        for i in range(engine.num_io_tensors):
            n = engine.get_tensor_name(i)
            dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(n)))
            self._dtypes[n] = dtype
            if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT:
                dims = engine.get_tensor_shape(n)
                shape = tuple(dims[k] if dims[k] >= 0 else None for k in range(len(dims)))
                inputs.append(TensorSpec(n, dtype.name, shape))
            else:
                outputs.append(n)
        if self._requested:
            unknown = [n for n in self._requested if n not in outputs]
            if unknown:
                raise ModelError(
                    f"{self.name}: outputs {unknown[:5]} are not engine outputs",
                    hint="TensorRT engines only expose the graph outputs they were built with; tap tensors in the ONNX",
                )
        self._engine = engine
        self._context = engine.create_execution_context()
        self._stream = check(rt.cudaStreamCreate(), "cudaStreamCreate")
        self._inputs = tuple(inputs)
        self._outputs = self._requested or tuple(outputs)
        self._all_outputs = tuple(outputs)

    def _infer_impl(self, feeds: Feeds) -> Outputs:
        rt = cudart()
        ctx = self._context
        if ctx is None:
            raise BackendError(f"runner {self.name!r} is not active")
        h2d = rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        d2h = rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        hosts = []
        for spec in self._inputs:
            arr = np.ascontiguousarray(feeds[spec.name], dtype=self._dtypes[spec.name])
            hosts.append(arr)  # keep alive until the copy completes
            if not ctx.set_input_shape(spec.name, tuple(arr.shape)):
                raise BackendError(
                    f"{self.name}: input {spec.name!r} shape {arr.shape} is outside the engine's optimization profile",
                    hint="rebuild with a wider --max-seq, or feed shorter batches",
                )
            buf = self._buffers.setdefault(spec.name, DeviceBuffer())
            ptr = buf.ensure(arr.nbytes)
            check(rt.cudaMemcpyAsync(ptr, arr.ctypes.data, arr.nbytes, h2d, self._stream), "cudaMemcpyAsync")
            ctx.set_tensor_address(spec.name, ptr)
        results: dict[str, np.ndarray] = {}
        for n in self._all_outputs:
            dims = ctx.get_tensor_shape(n)
            shape = tuple(int(dims[k]) for k in range(len(dims)))
            out = np.empty(shape, dtype=self._dtypes[n])
            buf = self._buffers.setdefault(n, DeviceBuffer())
            ctx.set_tensor_address(n, buf.ensure(out.nbytes))
            results[n] = out
        if not ctx.execute_async_v3(int(self._stream)):
            raise BackendError(f"{self.name}: TensorRT execution failed")
        for n in self._outputs:
            out = results[n]
            check(
                rt.cudaMemcpyAsync(out.ctypes.data, self._buffers[n].ptr, out.nbytes, d2h, self._stream),
                "cudaMemcpyAsync",
            )
        check(rt.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
        return {n: results[n] for n in self._outputs}

    def _deactivate_impl(self) -> None:
        for buf in self._buffers.values():
            buf.free()
        self._buffers.clear()
        if self._stream is not None:
            check(cudart().cudaStreamDestroy(self._stream), "cudaStreamDestroy")
        self._stream = None
        self._context = None
        self._engine = None
