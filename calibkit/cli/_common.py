"""What every command shares: one error-to-exit-code mapping and a rich progress renderer.

Only light imports here: ``calibkit --help`` must not import onnxruntime, transformers or torch.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from calibkit.errors import CalibkitError
from calibkit.progress import ProgressEvent

console = Console(stderr=True)
out = Console()


@contextlib.contextmanager
def handle_errors() -> Iterator[None]:
    """Turn a CalibkitError into one clear message and its exit code; never a traceback for user errors."""
    try:
        yield
    except CalibkitError as exc:
        # escape: messages and hints hold brackets ("calibkit[tensorrt]", regexes) that rich would eat as markup
        console.print(f"[bold red]error:[/] {escape(exc.message)}", highlight=False, markup=True)
        if exc.hint:
            console.print(f"  [yellow]hint:[/] {escape(exc.hint)}", highlight=False)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: finished work is kept; outputs were not half-written")
        raise typer.Exit(130) from None


class RichProgress:
    """A ProgressCallback that renders one bar per task name (to stderr, so stdout stays parseable)."""

    def __init__(self, enabled: bool = True) -> None:
        self._progress = Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[message]}"),
            console=console,
            transient=False,
            disable=not enabled or not sys.stderr.isatty() and not _force_progress(),
        )
        self._tasks: dict[str, TaskID] = {}

    def __call__(self, event: ProgressEvent) -> None:
        task = self._tasks.get(event.task)
        if task is None:
            task = self._progress.add_task(event.task, total=event.total, message=event.message)
            self._tasks[event.task] = task
        self._progress.update(task, completed=event.done, total=event.total, message=event.message)

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()


def _force_progress() -> bool:
    import os

    return os.environ.get("CALIBKIT_PROGRESS", "") == "1"


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
