"""The API's keyword functions, generated from the requests: one declaration per option, a real signature.

``@request_api(TuneRequest)`` over ``def tune(request, resources)`` makes ``calibkit.api.tune(model,
calibration_set, eval_set=None, out=None, *, max_drop=0.5, ..., workers=None, executor=None, memory_budget="1G",
max_batch_tokens=None, progress=None)``: its ``__signature__`` lists every API field of the request (positional
ones first) and every :class:`~calibkit.requests.resources.ResourceOptions` field, its docstring's ``Args:`` is
each field's help. A call builds the request and the resource options from the keywords (each checked as it is
made), opens the one ``Resources`` value and runs the body; :func:`run` does the same for a request built by the
caller (the CLI).
"""

from __future__ import annotations

import contextlib
import inspect
import textwrap
from collections.abc import Callable, Iterator, Sequence
from dataclasses import MISSING
from typing import TYPE_CHECKING, Any, TypeVar, overload

from calibkit.progress import ProgressCallback, no_progress
from calibkit.requests.options import declared, default_of
from calibkit.requests.resources import ResourceOptions
from calibkit.resources import Resources

if TYPE_CHECKING:  # pragma: no cover - types only
    from calibkit.building import BuildResult
    from calibkit.calibrate.pipeline import CalibrationResult
    from calibkit.calibrate.smoothing import SmoothResult
    from calibkit.data.calibset import CalibrationSet
    from calibkit.evaluate.tune import TuneRun
    from calibkit.exporter.pipeline import ExportResult
    from calibkit.requests.build import BuildRequest
    from calibkit.requests.calibrate import CalibrateRequest
    from calibkit.requests.compare import CompareRequest
    from calibkit.requests.deploy import DeployRequest
    from calibkit.requests.export import ExportRequest
    from calibkit.requests.sample import SampleRequest
    from calibkit.requests.smooth import SmoothRequest
    from calibkit.requests.tune import TuneRequest
    from calibkit.results.documents import DeployResult
    from calibkit.results.runs import Comparison

R = TypeVar("R")
T = TypeVar("T")

PROGRESS_HELP = "Called with each :class:`~calibkit.progress.ProgressEvent` (None: silent)."
RESOURCE_NAMES = tuple(f.name for f, _ in declared(ResourceOptions))

#: request type -> (the body that runs it, whether a local pool opens when no executor is given)
_BODIES: dict[type, tuple[Callable[[Any, Resources], Any], bool]] = {}


class _Shown(str):
    """An annotation shown as written (``float | None``), not as a quoted string, by ``inspect`` and ``help``
    (a string still, for readers that parse annotations, as the documentation's does)."""

    def __repr__(self) -> str:
        return str(self)


def signature_of(request_cls: type, returns: str, resources: Sequence[str] = RESOURCE_NAMES) -> inspect.Signature:
    """The keyword function's signature: the request's API fields, the named resource options, ``progress``."""
    params = []
    for f, decl in declared(request_cls):
        if decl.api:
            default = default_of(f)
            kind = inspect.Parameter.POSITIONAL_OR_KEYWORD if decl.positional else inspect.Parameter.KEYWORD_ONLY
            params.append(inspect.Parameter(f.name, kind, default=inspect.Parameter.empty if default is MISSING
                                            else default, annotation=_Shown(str(f.type))))
    for f, _ in declared(ResourceOptions):
        if f.name not in resources:
            continue
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default_of(f),
                                        annotation=_Shown(str(f.type))))
    params.append(inspect.Parameter("progress", inspect.Parameter.KEYWORD_ONLY, default=None,
                                    annotation=_Shown("ProgressCallback | None")))
    return inspect.Signature(params, return_annotation=_Shown(returns))


def args_section(request_cls: type, resources: Sequence[str] = RESOURCE_NAMES) -> str:
    """The ``Args:`` of the keyword function's docstring: each parameter with its field's help."""
    lines = ["Args:"]
    entries = [(f.name, decl.help) for f, decl in declared(request_cls) if decl.api]
    entries += [(f.name, decl.help) for f, decl in declared(ResourceOptions) if f.name in resources]
    entries += [("progress", PROGRESS_HELP)]
    for name, help in entries:
        lines += textwrap.wrap(f"{name}: {help}", width=112, initial_indent="    ", subsequent_indent="        ",
                               break_on_hyphens=False)
    return "\n".join(lines)


def request_api(request_cls: type[R], *, pool_by_default: bool = False, resources: Sequence[str] = RESOURCE_NAMES
                ) -> Callable[[Callable[[R, Resources], T]], Callable[..., T]]:
    """Make the keyword function of ``body(request, resources)`` (see the module docstring). The body's
    docstring gives the summary, ``Returns:``, ``Raises:`` and ``Examples:``; ``Args:`` is generated before
    ``Returns:``. ``resources``: the resource options the function takes (a command that runs no model in
    batches, like sample, takes none; its body gets the defaults and the progress callback)."""

    def decorate(body: Callable[[R, Resources], T]) -> Callable[..., T]:
        _BODIES[request_cls] = (body, pool_by_default)
        sig = signature_of(request_cls, str(inspect.signature(body).return_annotation), resources)

        def function(*args: object, **kwargs: object) -> T:
            given = dict(sig.bind(*args, **kwargs).arguments)  # a TypeError for what the signature has not
            options = ResourceOptions(**{k: given.pop(k) for k in RESOURCE_NAMES if k in given})
            progress = given.pop("progress", None)
            request = request_cls(**given)  # checked when made: before any resource is opened
            with open_resources(options, progress, pool_by_default=pool_by_default) as res:
                return body(request, res)  # what run(request) does, with the body's own types

        doc = inspect.cleandoc(body.__doc__ or "")
        head, sep, tail = doc.partition("\nReturns:")
        args = args_section(request_cls, resources)
        function.__doc__ = f"{head.rstrip()}\n\n{args}\n\nReturns:{tail}" if sep else f"{doc}\n\n{args}"
        function.__signature__ = sig  # type: ignore[attr-defined]
        function.__name__ = function.__qualname__ = body.__name__
        function.__module__ = body.__module__
        return function

    return decorate


@overload
def run(request: ExportRequest, resources: ResourceOptions | None = ...,
        progress: ProgressCallback | None = ...) -> ExportResult: ...
@overload
def run(request: SampleRequest, resources: ResourceOptions | None = ...,
        progress: ProgressCallback | None = ...) -> CalibrationSet: ...
@overload
def run(request: SmoothRequest, resources: ResourceOptions | None = ...,
        progress: ProgressCallback | None = ...) -> SmoothResult: ...
@overload
def run(request: CalibrateRequest, resources: ResourceOptions | None = ...,
        progress: ProgressCallback | None = ...) -> CalibrationResult: ...
@overload
def run(request: BuildRequest, resources: ResourceOptions | None = ...,
        progress: ProgressCallback | None = ...) -> BuildResult: ...
@overload
def run(request: CompareRequest, resources: ResourceOptions | None = ...,
        progress: ProgressCallback | None = ...) -> Comparison: ...
@overload
def run(request: TuneRequest, resources: ResourceOptions | None = ...,
        progress: ProgressCallback | None = ...) -> TuneRun: ...
@overload
def run(request: DeployRequest, resources: ResourceOptions | None = ...,
        progress: ProgressCallback | None = ...) -> DeployResult: ...
@overload
def run(request: object, resources: ResourceOptions | None = ...,
        progress: ProgressCallback | None = ...) -> object: ...
def run(request: object, resources: ResourceOptions | None = None, progress: ProgressCallback | None = None) -> object:
    """Run a request built by the caller (the command line builds one from its options): the keyword function
    of its command, called with the request's values.

    Args:
        request: A :class:`~calibkit.requests.export.ExportRequest`,
            :class:`~calibkit.requests.sample.SampleRequest`, :class:`~calibkit.requests.smooth.SmoothRequest`,
            :class:`~calibkit.requests.calibrate.CalibrateRequest`, :class:`~calibkit.requests.build.BuildRequest`,
            :class:`~calibkit.requests.compare.CompareRequest`, :class:`~calibkit.requests.tune.TuneRequest` or
            :class:`~calibkit.requests.deploy.DeployRequest`.
        resources: What the call may use: workers, executor, memory budget (None: the defaults).
        progress: Called with each :class:`~calibkit.progress.ProgressEvent` (None: silent).

    Returns:
        What the command's keyword function returns: an ``ExportResult`` for export, a ``CalibrationSet`` for
        sample, a ``SmoothResult`` for smooth, a ``CalibrationResult`` for calibrate, a ``BuildResult`` for build,
        a ``Comparison`` for compare, a ``TuneRun`` for tune, a ``DeployResult`` for deploy.

    Raises:
        UsageError: Not a request of a command, or a value its ``validate()`` refuses.

    Examples:
        >>> req = ck.CompareRequest(engine_a=fp32.artifact, engine_b=int8.artifact, eval_set="test.jsonl",
        ...                         traffic=None, layers=False)
        >>> ck.run(req).agreement == ck.compare(fp32.artifact, int8.artifact, "test.jsonl", traffic=None,
        ...                                     layers=False).agreement
        True
    """
    from calibkit.errors import UsageError

    found = _BODIES.get(type(request))
    if found is None:
        raise UsageError(f"no calibkit command takes a {type(request).__name__}",
                         hint="pass one of " + ", ".join(sorted(t.__name__ for t in _BODIES))
                              + " (calibkit.requests)")
    body, pool_by_default = found
    options = resources or ResourceOptions()
    with open_resources(options, progress, pool_by_default=pool_by_default) as res:
        return body(request, res)


@contextlib.contextmanager
def open_resources(options: ResourceOptions, progress: ProgressCallback | None = None, *,
                   pool_by_default: bool = False) -> Iterator[Resources]:
    """The one :class:`Resources` value of a call: ``options.executor`` as given, or opened from its spec
    ("local", "local:N", "dask://host:port"; closed when the call ends); None stays None unless
    ``pool_by_default`` (then a local pool of ``workers``); the token budget; progress (default: none)."""
    from calibkit.data.encode import TokenBudget, parse_size
    from calibkit.executors import from_spec

    budget = TokenBudget(max_batch_tokens=options.max_batch_tokens, memory_bytes=parse_size(options.memory_budget))
    with contextlib.ExitStack() as stack:
        ex = options.executor
        if isinstance(ex, str) or (ex is None and pool_by_default):
            ex = stack.enter_context(from_spec(ex, options.workers))
        yield Resources(executor=ex, budget=budget, workers=options.workers, progress=progress or no_progress)
