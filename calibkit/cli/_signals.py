"""SIGTERM as an exception: what :func:`calibkit.cli.main` installs first, and what the error handler of every
command reads. No imports beyond the standard library: the handler must be in place before typer is imported."""

from __future__ import annotations

#: the exit codes of a run ended by SIGTERM and by Ctrl-C (128 + the signal's number, as a shell reports them)
TERMINATED_EXIT = 143
INTERRUPTED_EXIT = 130
TERMINATED_MESSAGE = "terminated: finished work is kept; outputs were not half-written"

_signalled: list[int] = []


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is so that it unwinds (and cleans up) like Ctrl-C."""


def terminate(signum: int, frame: object) -> None:
    """The SIGTERM handler: remember the signal, raise :class:`Terminated` where the process is. Later SIGTERMs
    are ignored while the first unwinds: raised inside the cleanup, one would cut it short (a temporary folder
    left behind) and print a second message; and a handler Python restores to the default as it exits would
    let one kill the process on the way out (exit -15 instead of 143)."""
    import signal

    _signalled.append(signum)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated


def signalled() -> bool:
    """Whether SIGTERM came (typer turns a Terminated raised while it parses options into exit code 130)."""
    return bool(_signalled)
