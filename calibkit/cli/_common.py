"""What every command shares: one error-to-exit-code mapping and a rich progress renderer.

Only light imports here: ``calibkit --help`` must not import onnxruntime, transformers or torch.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.segment import Segment

from calibkit.errors import CalibkitError
from calibkit.progress import ProgressEvent


# markup off: paths, node names and texts hold brackets ("runs/[/x]", "calibkit[tensorrt]") that rich would
# parse as markup (or fail on); styled lines opt in with markup=True and escape() every value they show.
# emoji off: rich expands ":x:" or ":smile:" in any string it renders (markup or not, tables included), so a
# path or text holding such a code was shown as another one. Every line calibkit prints goes through these two.
class _Console(Console):
    """A rich Console whose output is always encodable: a lone surrogate (a file name whose bytes are not UTF-8,
    in a path, a table cell or a progress line) is written as ``\\udcff`` instead of failing the write."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return printable(super()._render_buffer(buffer))


console = _Console(stderr=True, markup=False, highlight=False, emoji=False)
out = _Console(markup=False, highlight=False, emoji=False)
# piped to a file or a pipe, a printed line stays one line whatever its length (wrapped at 80 columns, node names
# and paths were cut across lines and could not be grepped); tables still fit their width
console.soft_wrap = not console.is_terminal
out.soft_wrap = not out.is_terminal
_state = {"verbose": False}
_depth = [0]  # handle_errors blocks open: the outermost one ends the command
TRACEBACK_ENV = "CALIBKIT_TRACEBACK"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is so that it unwinds (and cleans up) like Ctrl-C."""


@contextlib.contextmanager
def handle_errors() -> Iterator[None]:
    """Turn any error into one clear message and an exit code; a traceback only under --verbose.

    CalibkitError: its exit code (2-7) and hint. OS errors (permissions, full disk, a folder where a file was
    expected) that no check caught: exit 2 with the path and what to do. Anything else is a calibkit bug:
    exit 1 and a hint to report it. The specific causes are fixed where they arise; this is the net.
    """
    import click

    from calibkit.outdirs import release_claims

    _depth[0] += 1
    try:
        yield
    except CalibkitError as exc:
        _error(exc.message, exc.hint or _default_hint(exc))
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt as exc:
        what = "terminated" if isinstance(exc, Terminated) else "interrupted"
        console.print(f"[yellow]{what}[/]: finished work is kept; outputs were not half-written", markup=True)
        raise typer.Exit(143 if isinstance(exc, Terminated) else 130) from None
    except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
        raise
    except OSError as exc:
        _traceback()
        import errno

        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            # a copy names its source first and its destination second: the destination is what filled up
            dest = exc.filename2 or exc.filename
            _error(f"{exc.strerror or exc}" + (f" while writing {dest}" if dest else " while writing the output"),
                   "free space (or raise the file-size limit) where the output goes, or pass another --out / -o; "
                   "nothing half-written was left in place")
            raise typer.Exit(2) from None
        where = f"{exc.filename}: " if exc.filename else ""
        _error(f"{where}{exc.strerror or exc}",
               "check that the path exists, is the kind expected (file or folder) and that you may write it; "
               "free disk space if it is full")
        raise typer.Exit(2) from None
    except RuntimeError as exc:
        if not str(exc).startswith("Symlink loop"):  # pathlib's resolve() before Python 3.13 (then: OSError ELOOP)
            _unexpected(exc)
        _traceback()
        _error(f"{str(exc).removeprefix('Symlink loop from ').strip(chr(39))}: a symbolic link loop",
               "remove or fix the symbolic link (it points, directly or not, to itself), or pass another path")
        raise typer.Exit(2) from None
    except MemoryError:
        _traceback()
        _error("out of memory", "use a smaller input (--limit, --size) or a machine with more memory")
        raise typer.Exit(1) from None
    except Exception as exc:  # noqa: BLE001 - the last net: one message instead of a traceback
        _unexpected(exc)
    finally:
        _depth[0] -= 1
        if not _depth[0]:  # the command is over: its --out folders are free for the next run
            release_claims()


def _unexpected(exc: BaseException) -> None:
    _traceback()
    _error(f"unexpected {type(exc).__name__}: {exc}",
           f"this is a bug in calibkit; please report it with the command line (run with --verbose or "
           f"{TRACEBACK_ENV}=1 for the traceback)")
    raise typer.Exit(1) from None


def _default_hint(exc: CalibkitError) -> str:
    """What to do, for errors raised without a specific hint: every message comes with one."""
    from calibkit import errors as e

    for cls, hint in (
        (e.UsageError, "see the command's --help for its options and examples"),
        (e.DataError, "fix or replace the input file named above; the command's --help lists the formats read"),
        (e.ModelError, "check the model file or folder named above (an ONNX model with its tokenizer)"),
        (e.CalibrationError, "re-run `calibkit calibrate` to write the calibration files again"),
        (e.BackendError, "run with --verbose to see the backend's log"),
        (e.MissingDependencyError, "install the extra named above, e.g. pip install 'calibkit[demo]'"),
    ):
        if isinstance(exc, cls):
            return hint
    return "run with --verbose for details"


def _error(message: str, hint: str | None) -> None:
    # escape: messages and hints hold brackets ("calibkit[tensorrt]", regexes) that rich would eat as markup
    console.print(f"[bold red]error:[/] {escape(printable(message))}", markup=True)
    if hint:
        console.print(f"  [yellow]hint:[/] {escape(printable(hint))}", markup=True)


def printable(text: str) -> str:
    """Lone surrogates (from undecodable file names or JSON escapes) cannot be encoded: show them escaped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _traceback() -> None:
    import os
    import traceback

    if _state["verbose"] or os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
        console.print(printable(traceback.format_exc()))


def warn(message: str) -> None:
    """One warning line on stderr (piped: one line whatever its length, so a log can be grepped)."""
    console.print(f"[yellow]warning:[/] {escape(printable(message))}", markup=True)


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 node``, ``2 nodes``: a number with its noun in the right number."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def say(message: str) -> None:
    """One plain line on stdout (no markup; paths are shown as they are). Piped to a file it stays one line,
    whatever its length: a node name cut across two lines cannot be grepped."""
    out.print(printable(message))


KEEP_FINISHED = 3  # finished steps left on screen under the running ones


class RichProgress:
    """A ProgressCallback that renders one bar per task name (to stderr, so stdout stays parseable).

    When stderr is not a terminal (a log file, a pipe, CI), bars would be lost or garble the log: progress goes
    out as plain lines instead, ``progress: TASK DONE/TOTAL (MESSAGE), N s`` — at most one per task every
    ``CALIBKIT_PROGRESS_INTERVAL`` seconds (default 10), and a last one when a task that took that long ends."""

    def __init__(self, enabled: bool = True) -> None:
        self._plain = enabled and not sys.stderr.isatty() and not _force_progress()
        self._progress = Progress(
            TextColumn("{task.description}", style="progress.description", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[message]}", markup=False),
            console=console,
            transient=False,
            disable=not enabled or not sys.stderr.isatty() and not _force_progress(),
        )
        self._tasks: dict[str, TaskID] = {}
        self._finished: list[TaskID] = []  # in the order they finished
        self._overall: TaskID | None = None
        self._lines = PlainProgress() if self._plain else None

    def __call__(self, event: ProgressEvent) -> None:
        if self._lines is not None:
            self._lines(event)
            return
        task = self._tasks.get(event.task)
        if task is None:
            if self._tasks and self._overall is None:  # a second step: an overall bar above them all
                self._overall = self._progress.add_task("all steps", total=1, message="")
            task = self._progress.add_task(event.task, total=event.total, message=event.message)
            self._tasks[event.task] = task
        self._progress.update(task, completed=event.done, total=event.total, message=event.message,
                              visible=True)
        done = event.total is not None and event.done >= event.total
        if task in self._finished:
            self._finished.remove(task)
        if done:
            self._finished.append(task)
        self._tidy()

    def _tidy(self) -> None:
        """Keep what is running and the overall bar on screen: a long run finishes dozens of steps, and one bar
        each pushed the running step below the bottom of the terminal. Finished steps beyond the last few (as
        many as the terminal's height leaves room for) are hidden; the overall bar counts them."""
        if self._overall is None:
            return
        running = len(self._tasks) - len(self._finished)
        room = self._progress.console.size.height - 2 - running  # the overall bar and a spare line
        shown = max(0, min(KEEP_FINISHED, room))
        for i, task in enumerate(self._finished):
            self._progress.update(task, visible=i >= len(self._finished) - shown)
        self._progress.update(self._overall, completed=len(self._finished), total=len(self._tasks),
                              message=f"{len(self._finished)} finished, {running} running")

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()


class PlainProgress:
    """Progress as plain periodic lines on stderr, for logs (see :class:`RichProgress`)."""

    def __init__(self, interval: float | None = None, write: Callable[[str], None] | None = None) -> None:
        import os
        import time

        self._clock = time.monotonic
        self._interval = interval if interval is not None else float(os.environ.get("CALIBKIT_PROGRESS_INTERVAL", 10))
        self._write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self._started: dict[str, float] = {}
        self._last: dict[str, float] = {}

    def __call__(self, event: ProgressEvent) -> None:
        now = self._clock()
        start = self._started.setdefault(event.task, now)
        if event.total is not None and event.done >= event.total:  # the task ended: a last line if it was long
            self._started.pop(event.task, None)
            self._last.pop(event.task, None)
            if now - start >= self._interval:
                self._line(event, now - start)
            return
        if now - self._last.get(event.task, start) >= self._interval:
            self._last[event.task] = now
            self._line(event, now - start)

    def _line(self, event: ProgressEvent, seconds: float) -> None:
        total = f"/{event.total}" if event.total is not None else ""
        message = f" ({printable(event.message)})" if event.message else ""
        self._write(f"progress: {printable(event.task)} {event.done}{total}{message}, {seconds:.0f} s")


def _force_progress() -> bool:
    import os

    return os.environ.get("CALIBKIT_PROGRESS", "") == "1"


def setup_logging(verbose: bool) -> None:
    _state["verbose"] = verbose
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


FORCE_HELP = ("Replace an --out folder that holds files calibkit did not write: the old folder is moved aside "
              "to NAME.replaced-<time> (never deleted). Inputs are never overwritten, even with --force.")


def guard_out_dir(path: Path, *, inputs: Sequence[Path | None] = (), option: str = "--out", force: bool = False,
                  legacy_names: Iterable[str] = ()) -> None:
    """Before any work: refuse an output folder that is an input, a file, foreign (without --force) or
    unwritable; under --force move a foreign folder aside and say where."""
    from calibkit.outdirs import guard_output_dir

    moved = guard_output_dir(path, inputs=inputs, option=option, force=force, legacy_names=legacy_names)
    if moved is not None:
        warn(f"{option} {path} held files calibkit did not write; moved it aside to {moved} (--force)")


def guard_out_file(path: Path, *, inputs: Sequence[Path | None] = (), option: str,
                   owned: Callable[[Path], bool] | None = None) -> None:
    """Before any work: refuse an output file that is an input, a folder, unwritable, or an existing file
    calibkit did not write (``owned``)."""
    from calibkit.outdirs import guard_output_file

    guard_output_file(path, inputs=inputs, option=option, owned=owned)


MEMORY_BUDGET_HELP = ("Bytes of tapped activations held at once, e.g. 512M, 1G, 4G (while one batch's statistics "
                      "run the next is inferred: two batches of half the budget each).")
MAX_BATCH_TOKENS_HELP = "Most padded tokens (batch x longest text) per batch [default: no limit]."


# ---------------------------------------------------------------- option blocks shared by several commands
# declared once; a command's signature names them (``tokenizer: Path | None = TOKENIZER``)

TOKENIZER: Any = typer.Option(None, "--tokenizer", help="Tokenizer folder when MODEL is an .onnx file.")
MAX_BATCH_TOKENS: Any = typer.Option(None, "--max-batch-tokens", help=MAX_BATCH_TOKENS_HELP)
MEMORY_BUDGET: Any = typer.Option("1G", "--memory-budget", help=MEMORY_BUDGET_HELP)
MEMORY_BUDGET_TAPS: Any = typer.Option("1G", "--memory-budget", help=MEMORY_BUDGET_HELP + " For the layer taps.")
FORCE: Any = typer.Option(False, "--force", help=FORCE_HELP)
NO_REPORT: Any = typer.Option(False, "--no-report", help="Write no report folder.")
LIMIT: Any = typer.Option(None, "--limit", min=1,
                     help="Use N eval examples, drawn at random and stratified by label (--seed).")
TRAFFIC: Any = typer.Option(
    None, "--traffic",
    help="Unlabeled request log whose texts judge agreement with FP32 (the formats of `calibkit sample`), or "
         "'auto' for the log named in the calibration set's manifest (refused when it is gone or changed). "
         "Default: that log when it is still there unchanged. Texts in the calibration set are excluded. "
         "Agreement needs no labels: a labelled set of a thousand texts cannot show 99 % agreement, a few thousand "
         "traffic texts can.",
)
NO_TRAFFIC: Any = typer.Option(False, "--no-traffic", help="Judge on the eval set alone, even when the calibration "
                                                           "set's log is there.")


def traffic_choice(traffic: str | None, no_traffic: bool) -> str | None:
    """What --traffic / --no-traffic ask the API for: a log, 'auto', none, or the default (the calibration set's
    log when it is still there)."""
    from calibkit.api import DEFAULT_TRAFFIC

    if no_traffic and traffic is not None:
        from calibkit.errors import UsageError

        raise UsageError("--traffic and --no-traffic contradict each other", hint="pass one of them")
    return None if no_traffic else traffic if traffic is not None else DEFAULT_TRAFFIC
TRAFFIC_SIZE: Any = typer.Option(4000, "--traffic-size", min=1,
                                 help="Traffic texts drawn (stratified by token length, --seed).")
TRAFFIC_TEXT_FIELD: Any = typer.Option(
    None, "--traffic-text-field", help="Text field of the traffic log, as `sample --text-field` (default: found)."
)


def force_option(applies_to: str) -> Any:
    """--force, saying which outputs it applies to."""
    return typer.Option(False, "--force", help=f"{FORCE_HELP} Applies to {applies_to}.")
