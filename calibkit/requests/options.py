"""How a request declares an option: once, as a dataclass field with its default, its help and its spelling.

A field made by :func:`option` carries an :class:`Option` in its metadata. From it the command line builds its
typer option (``cli/_requests.py``), the API builds its keyword signature and the ``Args:`` of its docstring
(``api.py``), and ``validate()`` checks numbers against its :class:`~calibkit.requests.checks.Bound` — so adding an
option is adding one field (and using it).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calibkit.requests.checks import Bound, check_numbers

if TYPE_CHECKING:  # pragma: no cover - types only
    from _typeshed import DataclassInstance

OPTION = "calibkit.option"  # the metadata key of an option's declaration


@dataclass(frozen=True)
class Nested:
    """One command-line option setting one attribute of a field's value (``--threshold-sqnr`` sets the
    ``min_sqnr_db`` of ``thresholds``): the default is that attribute of the field's default."""

    flag: str
    attribute: str
    help: str
    bound: Bound | None = None


@dataclass(frozen=True)
class Option:
    """An option's declaration. ``help``: one sentence or more, shown by ``--help`` and in the API's docstring;
    ``flags``: the command line's spelling (default ``--field-name``; ``--x/--no-x`` for a switch);
    ``bound``: the numbers it takes; ``cli``: the command line sets it (False: the API alone, e.g. a loaded
    value's only spelling is a path there); ``api``: a keyword of the API function (False: a knob of the
    pipeline that tests and benchmarks set on the request); ``argument``: a positional argument of the
    command line; ``positional``: positional in the API's signature too; ``cli_type``: what the command line
    parses (default: the field's type); ``negation``: a second flag that sets the field to None
    (``--no-traffic``), ``negation_help`` its help; ``nested``: options setting attributes of the field's
    value, instead of one flag."""

    help: str
    flags: tuple[str, ...] = ()
    bound: Bound | None = None
    cli: bool = True
    api: bool = True
    argument: bool = False
    positional: bool = False
    cli_type: Any = None
    negation: str | None = None
    negation_help: str = ""
    nested: tuple[Nested, ...] = ()


def option(default: object = MISSING, *, help: str, default_factory: Callable[[], object] | None = None,
           **declaration: Any) -> Any:
    """A request field declared once: its default (or ``default_factory``) and its :class:`Option`."""
    meta = {OPTION: Option(help=help, **declaration)}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def model_option() -> Any:
    """MODEL, the first argument of every command that runs a model folder (calibrate, smooth, tune): one
    declaration, a fresh field for each request."""
    return option(argument=True, positional=True, cli_type=Path,
                  help="Model folder (model.onnx + tokenizer + config.json), an .onnx file, or a loaded ModelDir.")


def calibration_set_option(help: str, default: object = MISSING) -> Any:
    """``--calibration-set``/``-c`` of the commands that read one (positional from Python), with its help."""
    return option(default, flags=("--calibration-set", "-c"), positional=True,
                  cli_type=Path if default is MISSING else Path | None, help=help)


def declared(request: DataclassInstance | type[DataclassInstance]) -> Iterator[tuple[dataclasses.Field[Any], Option]]:
    """Each field of a request class (or value) with its declaration, in declaration order."""
    for f in dataclasses.fields(request):
        decl = f.metadata.get(OPTION)
        if decl is not None:
            yield f, decl


def flag_of(f: dataclasses.Field[Any], decl: Option) -> str:
    """The name messages use for a field: its first command-line flag (``--max-drop``), for both callers."""
    if decl.flags:
        return decl.flags[0].split("/")[0]
    return "--" + f.name.replace("_", "-")


def default_of(f: dataclasses.Field[Any]) -> object:
    """A field's default value (a fresh one from its factory); MISSING when it is required."""
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def nested_default(f: dataclasses.Field[Any]) -> DataclassInstance:
    """The default of a field with ``nested`` options: a dataclass value, whose attributes the options set."""
    default = default_of(f)
    if not dataclasses.is_dataclass(default) or isinstance(default, type):
        raise TypeError(f"{f.name}: a field with nested options needs a dataclass value as its default")
    return default


def check_bounds(request: DataclassInstance) -> None:
    """UsageError for the first number out of its declared :class:`Bound` (nested attributes included)."""
    checks: dict[str, tuple[object, Bound]] = {}
    for f, decl in declared(request):
        value = getattr(request, f.name)
        if decl.bound is not None:
            checks[flag_of(f, decl)] = (value, decl.bound)
        for n in decl.nested:
            if n.bound is not None:
                checks[n.flag] = (getattr(value, n.attribute, None), n.bound)
    check_numbers(checks)


class Choice(str, enum.Enum):
    """A closed set of words an option takes: each member is its word (it compares, formats and serialises as
    that string), so the pipeline reads ``request.method == "auto"`` and documents hold the word."""

    def __str__(self) -> str:
        return str(self.value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def words(cls) -> str:
        return ", ".join(m.value for m in cls)


def coerce(kind: type[enum.Enum], value: object) -> Any:
    """``value`` as a member of ``kind`` when it names one; anything else as it is, for ``validate()`` to refuse
    with the words it takes."""
    if isinstance(value, str) and not isinstance(value, kind):
        try:
            return kind(value.lower())
        except ValueError:
            return value
    return value
