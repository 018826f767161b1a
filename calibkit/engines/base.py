"""The Runner protocol and the base class that does state checks, input validation and timing.

Backends implement only ``_activate_impl``, ``_infer_impl``, ``_deactivate_impl`` and the spec properties.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Protocol, runtime_checkable

import numpy as np

from calibkit.errors import BackendError, ModelError, UsageError
from calibkit.types import TensorSpec

Feeds = Mapping[str, np.ndarray]
Outputs = dict[str, np.ndarray]


@runtime_checkable
class Runner(Protocol):
    name: str

    def activate(self) -> None: ...

    def deactivate(self) -> None: ...

    def infer(self, feeds: Feeds) -> Outputs: ...

    @property
    def input_specs(self) -> tuple[TensorSpec, ...]: ...

    @property
    def output_names(self) -> tuple[str, ...]: ...

    def __enter__(self) -> Runner: ...

    def __exit__(self, *exc: object) -> None: ...


class BaseRunner:
    """Shared behaviour of every backend. Subclasses fill in the ``_impl`` methods."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._inputs: tuple[TensorSpec, ...] = ()  # set by the backend (at construction or activation)
        self._outputs: tuple[str, ...] = ()
        self._active = False
        self.inference_count = 0
        self.inference_seconds = 0.0
        self.last_inference_seconds = 0.0

    # -- lifecycle -------------------------------------------------------------------------------------
    def activate(self) -> None:
        if self._active:
            raise BackendError(f"runner {self.name!r} is already active")
        self._activate_impl()
        self._active = True

    def deactivate(self) -> None:
        if not self._active:
            return
        try:
            self._deactivate_impl()
        finally:
            self._active = False

    @property
    def is_active(self) -> bool:
        return self._active

    def __enter__(self) -> BaseRunner:
        self.activate()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.deactivate()

    # -- inference -------------------------------------------------------------------------------------
    def infer(self, feeds: Feeds) -> Outputs:
        if not self._active:
            raise BackendError(f"runner {self.name!r} must be activated before infer() (use it as a context manager)")
        self._validate(feeds)
        start = time.perf_counter()
        outputs = self._infer_impl(feeds)
        self.last_inference_seconds = time.perf_counter() - start
        self.inference_seconds += self.last_inference_seconds
        self.inference_count += 1
        return outputs

    def _validate(self, feeds: Feeds) -> None:
        specs = {s.name: s for s in self.input_specs}
        missing = [n for n in specs if n not in feeds]
        unknown = [n for n in feeds if n not in specs]
        if missing or unknown:
            raise UsageError(
                f"runner {self.name!r}: inputs do not match the model "
                f"(missing: {missing or 'none'}, unknown: {unknown or 'none'}; expected {sorted(specs)})"
            )
        for n, arr in feeds.items():
            spec = specs[n]
            if len(spec.shape) != np.ndim(arr):
                raise UsageError(
                    f"runner {self.name!r}: input {n!r} has rank {np.ndim(arr)}, the model expects {len(spec.shape)}"
                )
            for i, (want, got) in enumerate(zip(spec.shape, np.shape(arr))):
                if isinstance(want, int) and want >= 0 and want != got:
                    axis = {0: "batch", 1: "sequence"}.get(i, f"axis {i}")
                    raise ModelError(
                        f"runner {self.name!r}: the model's input {n!r} has a fixed {axis} size {want}, and calibkit "
                        + (f"feeds batches of {got} texts" if i == 0 else
                           f"feeds {got} (each batch is as long as its longest text)"),
                        hint="re-export with dynamic axes, e.g. torch.onnx.export(..., dynamic_axes={'input_ids': "
                             "{0: 'batch', 1: 'sequence'}, ...}); for TensorRT, `calibkit build --min-seq/--opt-seq/"
                             "--max-seq` sets the shapes the engine is built for",
                    )

    @property
    def input_specs(self) -> tuple[TensorSpec, ...]:
        return self._inputs

    @property
    def output_names(self) -> tuple[str, ...]:
        return self._outputs

    # -- to implement ----------------------------------------------------------------------------------

    def _activate_impl(self) -> None:
        raise NotImplementedError

    def _infer_impl(self, feeds: Feeds) -> Outputs:
        raise NotImplementedError

    def _deactivate_impl(self) -> None:
        return None


class FunctionRunner(BaseRunner):
    """A runner around a plain function: for tests and for wrapping other frameworks."""

    def __init__(
        self,
        fn: Callable[[Feeds], Outputs],
        inputs: Sequence[TensorSpec],
        outputs: Sequence[str],
        name: str = "function",
    ) -> None:
        super().__init__(name)
        self._fn = fn
        self._inputs = tuple(inputs)
        self._outputs = tuple(outputs)

    def _activate_impl(self) -> None:
        return None

    def _infer_impl(self, feeds: Feeds) -> Outputs:
        return self._fn(feeds)
