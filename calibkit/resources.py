"""What a run may use, built once at the edge (the CLI or ``calibkit.api``) and passed down as one value.

Every pipeline below the API takes ``(request, resources)``: the request says what to compute, :class:`Resources`
what the run may use to compute it — where work units run (``executor``, or a local pool of ``workers``), how much
memory the batches that tap activations may hold (``budget``), how runners are made (``runner_factory``, one
:class:`RunnerFactory`: the engine registry by default — the seam through which another backend can serve
engines, taps and variants), where progress goes (``progress``) and who writes the documents of a result
(``writer``, the report layer's codec, which the evaluation code cannot import).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from calibkit.enginefiles.registry import ModelRunnerFactory, model_runner, open_runner
from calibkit.progress import ProgressCallback, no_progress

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.data.encode import TokenBudget
    from calibkit.enginefiles.artifact import EngineArtifact
    from calibkit.engines.base import BaseRunner
    from calibkit.executors.base import Executor


class RunnerFactory(Protocol):
    """Makes every runner of a run: called, a runner for an ONNX model calibkit made (a path or serialized
    bytes; ``output_names``, ``threads``, ``layout``, ``name``, ...); ``engine(path or artifact)``, a runner for
    an engine file."""

    def __call__(self, model: Any, **options: Any) -> BaseRunner: ...

    def engine(self, engine: str | Path | EngineArtifact) -> BaseRunner: ...


@dataclass(frozen=True)
class Runners:
    """A :class:`RunnerFactory` from two functions (default: the engine registry's ``model_runner`` and
    ``open_runner``); a test replaces either."""

    model: ModelRunnerFactory = model_runner
    open_engine: Any = open_runner  # (path or artifact) -> BaseRunner

    def __call__(self, model: Any, **options: Any) -> BaseRunner:
        return self.model(model, **options)

    def engine(self, engine: str | Path | EngineArtifact) -> BaseRunner:
        return self.open_engine(engine)  # type: ignore[no-any-return]


class ResultWriter(Protocol):
    """Writes a result's documents: ``document(result, path)`` its JSON document (tune.json),
    ``report(result, folder)`` its report folder."""

    def document(self, result: Any, path: Path) -> None: ...

    def report(self, result: Any, folder: Path) -> None: ...


@dataclass(frozen=True)
class Resources:
    """``executor``: where work units run (None: a local process pool of ``workers`` where one is needed, closed
    with the run); ``budget``: the token budget of tapped batches (None: the default memory budget);
    ``runner_factory``: every runner; ``progress``: progress events; ``writer``: the documents of a result
    (None: a pipeline that writes files writes no tune.json and no report)."""

    executor: Executor | None = field(default=None, compare=False)
    budget: TokenBudget | None = None
    runner_factory: RunnerFactory = field(default_factory=Runners, compare=False)
    progress: ProgressCallback = field(default=no_progress, compare=False)
    workers: int | None = None
    writer: ResultWriter | None = field(default=None, compare=False)
