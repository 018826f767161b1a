"""Typer commands whose options are generated from a request's fields (``calibkit.requests``).

:func:`request_command` lists, in the command's signature, one typer option per field the command line sets (its
flags, help, default and number parser from the field's declaration), the resource options
(:class:`~calibkit.requests.resources.ResourceOptions`) and the command's own presentation options (``--json``,
``--force``, ...); a call builds the request and the resource options from what was parsed and hands them, with
the presentation options, to the command's body. An option is declared once: on its request field.
"""

from __future__ import annotations

import builtins
import dataclasses
import enum
import inspect
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import MISSING
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, Union, get_args, get_origin

import typer

from calibkit.cli._common import FLOAT, FORCE, INTEGER, handle_errors, keyword_or
from calibkit.requests.options import Choice, Option, declared, default_of, flag_of, nested_default
from calibkit.requests.resources import ResourceOptions

if TYPE_CHECKING:  # pragma: no cover - types only
    from _typeshed import DataclassInstance

_R = TypeVar("_R", bound="DataclassInstance")


def _base(kind: object) -> object:
    """``int`` for ``int | None``; the type itself otherwise."""
    if get_origin(kind) in (Union, types.UnionType):
        rest = [a for a in get_args(kind) if a is not type(None)]
        return rest[0] if len(rest) == 1 else kind
    return kind


def _cli_type(f: dataclasses.Field[Any], decl: Option) -> object:
    if decl.cli_type is not None:
        return decl.cli_type
    return eval(str(f.type), {"__builtins__": builtins})  # a plain annotation: int, float | None, bool, str


def _keyword_or_number(kind: object) -> tuple[type[Choice], type] | None:
    """(the words, ``int`` or ``float``) of an option typed ``Choice | int`` (``Profiles.AUTO`` or a number)."""
    if get_origin(kind) not in (Union, types.UnionType):
        return None
    args = get_args(kind)
    words = [a for a in args if isinstance(a, type) and issubclass(a, Choice)]
    numbers = [a for a in args if a in (int, float)]
    return (words[0], numbers[0]) if len(args) == 2 and len(words) == len(numbers) == 1 else None


def _typer_kind(kind: object) -> tuple[object, dict[str, Any]]:
    """What typer is told an option is, and its number parser: a keyword-or-number option is its number with a
    parser that also takes the keyword (typer reads no union but ``X | None``)."""
    mixed = _keyword_or_number(kind)
    if mixed is not None:
        words, number = mixed
        return number, {"parser": keyword_or(words, INTEGER if number is int else FLOAT)}
    base = _base(kind)
    return kind, {"parser": INTEGER} if base is int else {"parser": FLOAT} if base is float else {}


def _shown(value: object) -> object:
    return value.value if isinstance(value, enum.Enum) else value


def cli_default(f: dataclasses.Field[Any], decl: Option) -> object:
    """What the command line shows as the default: the field's, a word for a choice; None ("not given": the
    field's default applies) where the field's default is no plain value the command line can spell."""
    default = default_of(f)
    if decl.negation is not None:
        return None
    if isinstance(default, tuple):
        return list(default)
    return _shown(default) if default is not MISSING else ...


def _field_params(request_cls: type) -> Iterator[inspect.Parameter]:
    for f, decl in declared(request_cls):
        if not decl.cli:
            continue
        if decl.nested:
            base = nested_default(f)
            for n in decl.nested:
                yield _param(n.flag.lstrip("-").replace("-", "_"), float,
                             typer.Option(getattr(base, n.attribute), n.flag, help=n.help, parser=FLOAT))
            continue
        kind = _cli_type(f, decl)
        if decl.argument:
            yield _param(f.name, kind, typer.Argument(..., help=decl.help))
            continue
        flags = decl.flags or (flag_of(f, decl),)
        kind, parser = _typer_kind(kind)
        yield _param(f.name, kind, typer.Option(cli_default(f, decl), *flags, help=decl.help, **parser))
        if decl.negation is not None:
            yield _param(_name(decl.negation), bool, typer.Option(False, decl.negation, help=decl.negation_help))


def _name(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _param(name: str, kind: object, default: object) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind)


def resource_params(names: Sequence[str]) -> list[inspect.Parameter]:
    """The command line's options of the named :class:`ResourceOptions` fields."""
    out = []
    for f, decl in declared(ResourceOptions):
        if f.name in names:
            kind, parser = _typer_kind(_cli_type(f, decl))
            out.append(_param(f.name, kind, typer.Option(default_of(f), flag_of(f, decl), help=decl.help, **parser)))
    return out


def build_request(request_cls: type[_R], parsed: dict[str, Any]) -> _R:
    """The request from the parsed options (each popped from ``parsed``): nested options set their attribute
    of the field's default, a negation sets None, an option not given (None where its field's default is not)
    leaves the field's default."""
    from calibkit.errors import UsageError

    values: dict[str, Any] = {}
    for f, decl in declared(request_cls):
        if not decl.cli:
            continue
        if decl.nested:
            updates = {n.attribute: parsed.pop(_name(n.flag)) for n in decl.nested}
            values[f.name] = dataclasses.replace(nested_default(f), **updates)
            continue
        value = parsed.pop(f.name)
        if decl.negation is not None and parsed.pop(_name(decl.negation)):
            if value is not None:
                raise UsageError(f"{flag_of(f, decl)} and {decl.negation} contradict each other",
                                 hint="pass one of them")
            values[f.name] = None
        elif value is not None or default_of(f) is None:
            values[f.name] = value
    return request_cls(**values)


#: the presentation options of a command that only writes its --out: --force
FORCE_ONLY = (inspect.Parameter("force", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=FORCE),)


def cli_paths(*values: object) -> list[Path | None]:
    """A request's inputs as the command line gave them: paths (a traffic keyword, or no value, is None)."""
    return [v if isinstance(v, Path) else None for v in values]


def request_command(request_cls: type[DataclassInstance], body: Callable[..., None], *, resources: Sequence[str],
                    extra: Sequence[inspect.Parameter] = ()) -> Callable[..., None]:
    """A typer command: the request's options, the named resource options, then ``extra`` (the command's own),
    calling ``body(request, resource_options, **extra_values)`` inside :func:`handle_errors`."""
    params = [*_field_params(request_cls), *resource_params(resources), *extra]

    def command(**parsed: Any) -> None:
        with handle_errors():
            request = build_request(request_cls, parsed)
            options = ResourceOptions(**{name: parsed.pop(name) for name in resources})
            body(request, options, **parsed)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__name__ = command.__qualname__ = body.__name__
    command.__doc__ = body.__doc__
    return command

