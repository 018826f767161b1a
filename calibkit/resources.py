"""What a run may use, built once at the edge (the CLI or ``calibkit.api``) and passed down as one value.

:class:`Resources` replaces the ``Any``-typed settings that used to be threaded through compare, sensitivity and
tune one by one: where work units run (``executor``), how much memory the batches that tap activations may hold
(``budget``), how runners for ONNX models are made (``runner_factory``, the engine registry's
:func:`~calibkit.engines.registry.model_runner` by default — the seam through which another backend can serve
taps and variants) and where progress goes (``progress``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from calibkit.engines.registry import ModelRunnerFactory, model_runner
from calibkit.progress import ProgressCallback, no_progress

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.data.encode import TokenBudget
    from calibkit.executors.base import Executor


@dataclass(frozen=True)
class Resources:
    """``executor``: where work units run (None: a local process pool of ``workers`` where one is needed, closed
    with the run); ``budget``: the token budget of tapped batches (None: the default memory budget);
    ``runner_factory(model, *, output_names, threads, layout, name, ...)``: runners for ONNX models;
    ``progress``: progress events."""

    executor: Executor | None = field(default=None, compare=False)
    budget: TokenBudget | None = None
    runner_factory: ModelRunnerFactory = field(default=model_runner, compare=False)
    progress: ProgressCallback = field(default=no_progress, compare=False)
    workers: int | None = None
