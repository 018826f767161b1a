"""What a run may use, built once at the edge (the CLI or ``calibkit.api``) and passed down as one value.

Every pipeline below the API takes ``(request, resources)``: the request says what to compute, :class:`Resources`
what the run may use to compute it — where work units run (``executor``, or a local pool of ``workers``), how much
memory the batches that tap activations may hold (``budget``), how runners are made (``runner_factory``, one
:class:`RunnerFactory`: the engine registry by default — the seam through which another backend can serve
engines, taps and variants), where progress goes (``progress``) and who writes the documents of a result
(``writer``, the report layer's codec, which the evaluation code cannot import).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from calibkit.enginefiles.registry import ModelRunnerFactory, ModelSource, model_runner, open_runner
from calibkit.progress import ProgressCallback, no_progress
from calibkit.types import PathLike

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.data.encode import TokenBudget
    from calibkit.enginefiles.artifact import EngineArtifact
    from calibkit.engines.base import BaseRunner
    from calibkit.executors.base import Executor
    from calibkit.results.documents import PlanDocument
    from calibkit.results.runs import TuneResult


class EngineRunnerFactory(Protocol):
    """Opens an engine file (a path, or its loaded artifact) in the backend its sidecar names."""

    def __call__(self, engine: PathLike | EngineArtifact) -> BaseRunner: ...


class RunnerFactory(ModelRunnerFactory, Protocol):
    """Makes every runner of a run: called (a :class:`ModelRunnerFactory`), a runner for an ONNX model calibkit
    made (a path or serialized bytes; ``output_names``, ``threads``, ``layout``, ``name``, ...);
    ``engine(path or artifact)``, a runner for an engine file."""

    def engine(self, engine: PathLike | EngineArtifact) -> BaseRunner: ...


@dataclass(frozen=True)
class Runners:
    """A :class:`RunnerFactory` from two functions (default: the engine registry's ``model_runner`` and
    ``open_runner``, which serve every registered backend); a test replaces either."""

    model: ModelRunnerFactory = model_runner
    open_engine: EngineRunnerFactory = open_runner

    def __call__(self, model: ModelSource, *, output_names: Sequence[str] | None = None, threads: int | None = None,
                 layout: str | None = None, name: str | None = None, keep_model: bool = True,
                 spinning: bool = True) -> BaseRunner:
        return self.model(model, output_names=output_names, threads=threads, layout=layout, name=name,
                          keep_model=keep_model, spinning=spinning)

    def engine(self, engine: PathLike | EngineArtifact) -> BaseRunner:
        return self.open_engine(engine)


class ResultWriter(Protocol):
    """Writes a result's documents: ``document(result, path)`` its JSON document (tune.json, or a plan's
    plan.json), ``report(result, folder)`` its report folder."""

    def document(self, result: TuneResult | PlanDocument, path: Path) -> None: ...

    def report(self, result: TuneResult, folder: Path) -> None: ...


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
