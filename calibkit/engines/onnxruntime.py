"""ONNX Runtime backend: the embedded default that runs everywhere (CPU; CUDA when onnxruntime-gpu is there)."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from calibkit._io import native_path, utf8_path
from calibkit.cpus import usable_cpus
from calibkit.engines.base import BaseRunner, Feeds, Outputs
from calibkit.errors import BackendError, ModelError
from calibkit.types import TensorSpec

if TYPE_CHECKING:  # pragma: no cover - types only
    import onnxruntime as ort

_ORT_DTYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(bool)": "bool",
}


def default_providers() -> list[str]:
    import onnxruntime as ort

    have = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in have]


EXACT_QDQ = "none"  # graph optimizations off: Q/DQ pairs run as written, the MatMuls in FP32 on dequantized values


def evaluation_optimization(target: str | None) -> str:
    """ONNX Runtime's optimization level for evaluating a model of this Q/DQ layout on CPU. The TensorRT layout
    runs as exact Q/DQ arithmetic, which is what TensorRT computes (int8 GEMMs accumulating in int32); with
    optimizations on, ORT fuses it into its own int8 kernels, which saturate on x86 CPUs without VNNI
    (calibkit.engines.cpu) and would blame calibration for the CPU. Other models run fully optimized."""
    return EXACT_QDQ if target == "tensorrt" else "all"


class OnnxRuntimeRunner(BaseRunner):
    """Runs an ONNX model (a path or serialized bytes) in an ``onnxruntime.InferenceSession``.

    ``output_names`` limits what ``infer`` returns (default: every graph output).
    ``intra_op_threads`` defaults to the number of CPUs. ``keep_model=False`` drops serialized model bytes once
    the session holds the model (one copy of the weights less; the runner cannot be activated again).
    ``spinning=False``: ONNX Runtime's idle threads sleep instead of spin-waiting (for a session whose runs share
    the CPUs with other work: spinning threads take the cores that work needs).
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | bytes,
        *,
        providers: Sequence[str] | None = None,
        output_names: Sequence[str] | None = None,
        intra_op_threads: int | None = None,
        optimization: str = "all",
        name: str | None = None,
        keep_model: bool = True,
        spinning: bool = True,
    ) -> None:
        super().__init__(name or (Path(model).name if not isinstance(model, bytes) else "onnx-bytes"))
        self._model: str | os.PathLike[str] | bytes | None = model  # None once released (keep_model=False)
        self._providers = list(providers) if providers else None
        self._requested_outputs = tuple(output_names) if output_names else None
        self._threads = intra_op_threads
        self._optimization = optimization
        self._session: ort.InferenceSession | None = None
        self._keep_model = keep_model
        self._spinning = spinning

    @property
    def providers(self) -> list[str]:
        return list(self._session.get_providers()) if self._session is not None else []

    def _activate_impl(self) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.graph_optimization_level = {
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        }[self._optimization]
        opts.intra_op_num_threads = self._threads or usable_cpus()
        if not self._spinning:
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if self._model is None:
            raise BackendError(f"{self.name}: the model bytes were released after the first activation")
        model = self._model if isinstance(self._model, bytes) else os.fspath(self._model)
        if not isinstance(model, bytes) and not Path(model).is_file():
            raise ModelError(f"model file not found: {model}")
        if not isinstance(model, bytes) and not utf8_path(model):  # ORT opens UTF-8 names only
            import onnx

            data = Path(model).read_bytes()
            with contextlib.suppress(Exception):  # not parsable: ONNX Runtime says what is wrong below
                if any(t.data_location == onnx.TensorProto.EXTERNAL
                       for t in onnx.load_model_from_string(data).graph.initializer):
                    native_path(model)  # weights beside it, where ORT would look by that name: the error
            model = data
        try:
            session = ort.InferenceSession(model, opts, providers=self._providers or default_providers())
        except Exception as exc:  # onnxruntime raises its own untyped exceptions
            raise BackendError(f"ONNX Runtime could not load {self.name}: {exc}") from exc
        if not self._keep_model and isinstance(model, bytes):
            self._model = None
        del model
        self._session = session
        self._inputs = tuple(
            TensorSpec(i.name, _ORT_DTYPES.get(i.type, i.type), tuple(i.shape)) for i in session.get_inputs()
        )
        all_outputs = tuple(o.name for o in session.get_outputs())
        if self._requested_outputs:
            unknown = [n for n in self._requested_outputs if n not in all_outputs]
            if unknown:
                raise ModelError(f"{self.name}: requested outputs not in the model: {unknown[:5]}")
            self._outputs = self._requested_outputs
        else:
            self._outputs = all_outputs

    def _infer_impl(self, feeds: Feeds) -> Outputs:
        assert self._session is not None
        want = {s.name: s.dtype for s in self._inputs}
        cast = {n: np.asarray(a, dtype=want[n]) if str(np.asarray(a).dtype) != want[n] else a for n, a in feeds.items()}
        try:
            values = self._session.run(list(self._outputs), dict(cast))
        except Exception as exc:
            _check_token_ids(self.name, cast, exc)
            raise BackendError(f"ONNX Runtime failed running {self.name}: {exc}") from exc
        return dict(zip(self._outputs, values))

    def _deactivate_impl(self) -> None:
        self._session = None


_GATHER_BOUNDS = re.compile(r"Gather.*out of data bounds, idx=(-?\d+) must be within the inclusive range \[-(\d+),",
                            re.DOTALL)


def _check_token_ids(name: str, feeds: Feeds, exc: Exception) -> None:
    """A ModelError for a Gather out of bounds on token ids past the model's vocabulary: the tokenizer is not the
    model's (ONNX Runtime's own message names a node and an index, not the cause)."""
    found = _GATHER_BOUNDS.search(str(exc))
    ids = feeds.get("input_ids")
    if found is None or ids is None or not np.size(ids):
        return
    rows, top = int(found.group(2)), int(np.max(ids))
    if top < rows:
        return
    raise ModelError(f"{name}: the tokenizer gives token id {top}, past the model's vocabulary (its embedding table "
                     f"has {rows} rows): the tokenizer is not the one the model was trained with",
                     hint="use the model's own tokenizer (its files in the model folder, or --tokenizer)") from exc
