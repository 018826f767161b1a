"""The ``calibkit`` app: each command lives in its own module and registers itself here (``calibkit.cli.main``
runs it)."""

from __future__ import annotations

import typer

import calibkit.cli.build as _build
import calibkit.cli.calibrate as _calibrate
import calibkit.cli.compare as _compare
import calibkit.cli.demo as _demo
import calibkit.cli.deploy as _deploy
import calibkit.cli.export as _export
import calibkit.cli.report as _report
import calibkit.cli.sample as _sample
import calibkit.cli.smooth as _smooth
import calibkit.cli.tune as _tune
from calibkit._version import __version__
from calibkit.cli._common import setup_logging


class _FlagsWithoutType:
    """Flags take no value, so their help row shows no type: typer writes ``<bool>`` beside every flag
    (``--verbose <bool>``, ``--help <bool>``), which reads as if the flag wanted an argument."""

    def get_params(self, ctx):  # type: ignore[no-untyped-def]
        params = super().get_params(ctx)  # type: ignore[misc]
        for p in params:
            if getattr(p, "is_flag", False) and p.metavar is None:
                p.metavar = ""
        return params


class _Command(_FlagsWithoutType, typer.core.TyperCommand):
    pass


class _Group(_FlagsWithoutType, typer.core.TyperGroup):
    pass


app = typer.Typer(
    name="calibkit",
    cls=_Group,
    help=(
        "INT8 calibration and quantization-accuracy workbench for transformer models.\n\n"
        "Workflow: [export ->] sample -> [smooth ->] calibrate -> build -> compare -> tune -> deploy.  "
        "Start with `calibkit demo run` to see every step on a real model."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"calibkit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log what each step does."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    setup_logging(verbose)


for _module in (_demo, _export, _sample, _smooth, _calibrate, _build, _compare, _tune, _deploy, _report):
    _module.register(app)


def _unset(cls: object, default: type) -> bool:
    """Whether a typer ``cls`` is typer's own: None, its default class, or the ``Default(...)`` placeholder a
    ``typer.Typer()`` or ``add_typer`` left unset holds (missed, the demo group showed ``--help <bool>``)."""
    if isinstance(cls, typer.models.DefaultPlaceholder):
        cls = cls.value
    return cls is None or cls is default


def _literal_help(t: typer.Typer, seen: set[int] | None = None) -> None:
    """Help texts are plain text: their brackets ("[default: no limit]", "[smooth ->]", "logits [batch,
    classes]") are shown, not read as rich markup (which silently dropped them)."""
    import inspect

    seen = set() if seen is None else seen  # option objects shared by several commands are escaped once

    def esc(text: str | None) -> str | None:
        return text.replace("[", "\\[") if text else text

    t.info.help = esc(t.info.help)
    t.info.cls = _Group if _unset(t.info.cls, typer.core.TyperGroup) else t.info.cls
    for info in t.registered_commands:
        info.cls = _Command if _unset(info.cls, typer.core.TyperCommand) else info.cls
        info.help = esc(info.help or (inspect.getdoc(info.callback) if info.callback else None))
        info.epilog = esc(info.epilog)
        if info.callback is None:
            continue
        for param in inspect.signature(info.callback).parameters.values():
            if isinstance(param.default, typer.models.ParameterInfo) and id(param.default) not in seen:
                seen.add(id(param.default))
                param.default.help = esc(param.default.help)
    for group in t.registered_groups:
        if group.typer_instance is not None:
            group.help = esc(group.help)
            group.cls = _Group if _unset(group.cls, typer.core.TyperGroup) else group.cls
            _literal_help(group.typer_instance, seen)


_literal_help(app)
