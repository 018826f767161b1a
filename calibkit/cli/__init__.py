"""The ``calibkit`` command line.

:func:`main` (the console script) is light on purpose: it installs the SIGTERM handler before anything heavy is
imported, then imports the app (``calibkit.cli._app``: typer, rich and every command) and runs it, so SIGTERM
at any moment — during the imports, while options are parsed, inside a command — ends the run with exit code 143
and one line saying so, never with the bare signal or Ctrl-C's 130. ``from calibkit.cli import app`` still
gives the typer app (imported on first use).
"""

from __future__ import annotations

import signal
import sys
from typing import Any

from calibkit.cli._signals import TERMINATED_EXIT, TERMINATED_MESSAGE, Terminated, signalled, terminate


def main() -> None:
    # SIGTERM (kill, a job scheduler, a container stop) unwinds like Ctrl-C: temporary outputs are removed
    signal.signal(signal.SIGTERM, terminate)
    stdout_was = _fd_identity(1)
    try:
        from calibkit.cli._app import app

        app()
    except Terminated:  # before typer ran (the imports): nothing was started
        _exit_terminated()
    except SystemExit as exc:
        # a SIGTERM outside a command's error handler (while typer parsed the options) reaches typer as a
        # KeyboardInterrupt, which it ends with 130 and no word
        if signalled() and exc.code != TERMINATED_EXIT:
            _exit_terminated()
        if exc.code == 1:
            # a broken stdout outside a command (``--help | head``): typer's answer is 1, and rich's (which
            # renders the help) points fd 1 at /dev/null first
            from calibkit.cli._common import STDOUT_GONE_EXIT, stdout_gone

            if stdout_gone() or _fd_identity(1) != stdout_was:
                raise SystemExit(STDOUT_GONE_EXIT) from None
        raise


def _fd_identity(fd: int) -> tuple[int, int] | None:
    import os

    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _exit_terminated() -> None:
    try:
        sys.stderr.write(TERMINATED_MESSAGE + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # stderr closed too: the exit code says it
        pass
    raise SystemExit(TERMINATED_EXIT)


def __getattr__(name: str) -> Any:
    if name == "app":
        from calibkit.cli._app import app

        return app
    raise AttributeError(f"module 'calibkit.cli' has no attribute {name!r}")
