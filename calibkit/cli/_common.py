"""What every command shares: one error-to-exit-code mapping and a rich progress renderer.

Only light imports here: ``calibkit --help`` must not import onnxruntime, transformers or torch.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.segment import Segment
from rich.text import Text

from calibkit.cli._signals import INTERRUPTED_EXIT, TERMINATED_EXIT, TERMINATED_MESSAGE, Terminated
from calibkit.errors import CalibkitError
from calibkit.progress import ESTIMATE_TASK, ProgressEvent
from calibkit.report.formatting import visible_controls


# markup off: paths, node names and texts hold brackets ("runs/[/x]", "calibkit[tensorrt]") that rich would
# parse as markup (or fail on); styled lines opt in with markup=True and escape() every value they show.
# emoji off: rich expands ":x:" or ":smile:" in any string it renders (markup or not, tables included), so a
# path or text holding such a code was shown as another one. Every line calibkit prints goes through these two.
class _Console(Console):
    """A rich Console whose output is always encodable and inert: a lone surrogate (a file name whose bytes are
    not UTF-8, in a path, a table cell or a progress line) is written as ``\\udcff`` instead of failing the
    write, and a control character in the text (an ANSI escape in a node name) as ``\\x1b`` instead of acting
    on the terminal; rich's own styles and cursor controls pass. A closed stdout (where rich would drop every
    line without a word) or a broken pipe raises BrokenPipeError."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        # every string printed or put in a table cell comes through here: escaped before the layout measures it
        return super().render_str(printable(text), **kwargs)

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        # the net for Text built without render_str (progress columns)
        shown = (s if s.control else Segment(visible_controls(s.text), s.style) for s in buffer)
        return _encodable(super()._render_buffer(shown))  # rich's own escape codes are in it now: kept

    def _check_buffer(self) -> None:
        if self._file is None and not self.stderr and sys.stdout is None and self._buffer_index == 0:
            del self._buffer[:]
            self.on_broken_pipe()
        super()._check_buffer()

    def on_broken_pipe(self) -> None:
        # rich's own answer is SystemExit(1) (past every handler, and it points the wrong fd at /dev/null):
        # handle_errors decides instead (stdout gone: quietly, 141)
        import errno

        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "stdout is closed" if sys.stdout is None else "broken pipe")


console = _Console(stderr=True, markup=False, highlight=False, emoji=False)
out = _Console(markup=False, highlight=False, emoji=False)
# piped to a file or a pipe, a printed line stays one line whatever its length (wrapped at 80 columns, node names
# and paths were cut across lines and could not be grepped); tables still fit their width
console.soft_wrap = not console.is_terminal
out.soft_wrap = not out.is_terminal
_state = {"verbose": False}
_depth = [0]  # handle_errors blocks open: the outermost one ends the command
TRACEBACK_ENV = "CALIBKIT_TRACEBACK"


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
        what, _, rest = TERMINATED_MESSAGE.partition(":")
        what = what if isinstance(exc, Terminated) else "interrupted"
        console.print(f"[yellow]{what}[/]:{rest}", markup=True)
        raise typer.Exit(TERMINATED_EXIT if isinstance(exc, Terminated) else INTERRUPTED_EXIT) from None
    except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
        raise
    except BrokenPipeError as exc:
        if not stdout_gone():  # another pipe (a worker's): an OS error like any other, below
            _os_error(exc)
        # the reader of stdout went away (`| head`) or stdout was closed: nothing more can be said there, and
        # the conventional code of a writer whose pipe broke is 128 + SIGPIPE
        _silence_stdout()
        raise typer.Exit(STDOUT_GONE_EXIT) from None
    except OSError as exc:
        _os_error(exc)
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


def _os_error(exc: OSError) -> None:
    _traceback()
    import errno

    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        # a copy names its source first and its destination second: the destination is what filled up
        dest = exc.filename2 or exc.filename
        _error(f"{exc.strerror or exc}" + (f" while writing {dest}" if dest else " while writing the output"),
               "free space (or raise the file-size limit) where the output goes, or pass another --out / -o; "
               "nothing half-written was left in place")
        raise typer.Exit(2) from None
    if exc.errno == errno.EPIPE:
        _error(f"a pipe closed: {exc.strerror or exc}", "a process calibkit talks to (a worker) ended early; "
               "run with --verbose for the traceback")
        raise typer.Exit(2) from None
    where = f"{exc.filename}: " if exc.filename else ""
    _error(f"{where}{exc.strerror or exc}",
           "check that the path exists, is the kind expected (file or folder) and that you may write it; "
           "free disk space if it is full")
    raise typer.Exit(2) from None


#: the exit code when stdout's reader went away or stdout was closed (128 + SIGPIPE, as a shell reports it)
STDOUT_GONE_EXIT = 141


def stdout_gone() -> bool:
    """Whether stdout can take no more output: closed when the process started (``>&-``: no ``sys.stdout``),
    or a pipe or socket whose reader went away (poll says POLLERR/POLLHUP, without writing)."""
    import io
    import select

    stream = sys.stdout
    if stream is None:
        return True
    try:
        fd = stream.fileno()
    except (OSError, ValueError, io.UnsupportedOperation):  # not a file (a test's capture): it cannot break
        return False
    try:
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        events = poller.poll(0)
    except (OSError, ValueError):
        return True
    return any(ev & (select.POLLERR | select.POLLHUP | select.POLLNVAL) for _, ev in events)


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null, so the interpreter's last flush of stdout does not fail again on the way out."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass


def write_stdout(text: str) -> None:
    """``text`` on stdout, flushed (a document for ``--json -``). A closed stdout is a BrokenPipeError, as a
    broken pipe is: :func:`handle_errors` ends either quietly with :data:`STDOUT_GONE_EXIT`."""
    import errno

    stream = sys.stdout
    if stream is None:
        raise BrokenPipeError(errno.EPIPE, "stdout is closed")
    stream.write(text)
    stream.flush()


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
    """Text safe to write to a terminal or a log: control characters (ANSI escapes, carriage returns, bidi
    overrides) shown as escapes, lone surrogates (from undecodable file names or JSON escapes), which cannot be
    encoded, too. Tabs and newlines stay."""
    return _encodable(visible_controls(text))


def _encodable(text: str) -> str:
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
        if event.task == ESTIMATE_TASK:  # a line above the bars, not a bar
            if not self._progress.disable:
                self._progress.console.print(printable(event.message), markup=False, highlight=False)
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
        self._interval = interval if interval is not None else progress_interval(os.environ)
        self._write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self._started: dict[str, float] = {}
        self._last: dict[str, float] = {}

    def __call__(self, event: ProgressEvent) -> None:
        if event.task == ESTIMATE_TASK:  # said once, when it is made
            self._write(printable(event.message))
            return
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


def progress_interval(environ: Mapping[str, str]) -> float:
    """``CALIBKIT_PROGRESS_INTERVAL`` in seconds (default 10); anything but a finite number of seconds >= 0 is a
    usage error naming the variable (it used to end in a traceback)."""
    import math

    from calibkit.errors import UsageError

    raw = environ.get("CALIBKIT_PROGRESS_INTERVAL", "").strip()
    if not raw:
        return 10.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"CALIBKIT_PROGRESS_INTERVAL={raw[:40]!r} is not a number of seconds",
                         hint="set it to the seconds between progress lines (e.g. 10), or unset it")
    return value


def _force_progress() -> bool:
    import os

    return os.environ.get("CALIBKIT_PROGRESS", "") == "1"


class _PrintableFormatter(logging.Formatter):
    """Log lines as :func:`printable` shows text: a file name holding an ANSI escape or a bidi override is
    written as its escape, not acted on by the terminal."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


def setup_logging(verbose: bool) -> None:
    _state["verbose"] = verbose
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_PrintableFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])


FORCE_HELP = ("Kept so existing scripts run; it lifts no refusal. A folder holding any file calibkit did not "
              "write (in any subfolder) is refused, naming the file, with or without --force: calibkit never "
              "deletes, moves or overwrites such a file. Inputs are never overwritten.")


def guard_out_dir(path: Path, *, inputs: Sequence[Path | None] = (), option: str = "--out", force: bool = False,
                  legacy_names: Iterable[str] = ()) -> None:
    """Before any work: refuse an output folder that is an input, a file, holds files calibkit did not write
    (``force`` or not) or is unwritable."""
    from calibkit.outdirs import guard_output_dir

    guard_output_dir(path, inputs=inputs, option=option, force=force, legacy_names=legacy_names)


def guard_out_file(path: Path, *, inputs: Sequence[Path | None] = (), option: str,
                   owned: Callable[[Path], bool] | None = None) -> None:
    """Before any work: refuse an output file that is an input, a folder, unwritable, or an existing file
    calibkit did not write (``owned``)."""
    from calibkit.outdirs import guard_output_file

    guard_output_file(path, inputs=inputs, option=option, owned=owned)




# ---------------------------------------------------------------- numeric options
# Every numeric option of every command is parsed by one of these two (``parser=FLOAT`` / ``parser=INTEGER``):
# NaN, infinities (an overflowing "1e999" included), text that is not a number and a fraction where a whole number
# goes are refused while the command line is read, before anything runs. Ranges (int64 included) are checked by
# the API call the command makes (calibkit.api.check_numbers), also before any work, so a Python caller gets the
# same checks and messages.


def _refuse(message: str) -> ValueError:
    """The error a parser raises: typer reports a ValueError as "Invalid value for '--x': MESSAGE" (through
    pydantic, whose own error type keeps the message clean of its "Value error, " prefix)."""
    try:
        from pydantic_core import PydanticCustomError
    except ImportError:  # pragma: no cover - a typer without pydantic reads a plain ValueError the same way
        return ValueError(message)
    return PydanticCustomError("calibkit_number", message)  # no context: a "{x}" in the value stays as it is


def _parse_float(value: object) -> float:
    try:
        number = float(value) if not isinstance(value, bool) else math.nan  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise _refuse(f"{str(value)[:40]!r} is not a number") from None
    if not math.isfinite(number):
        raise _refuse(f"{str(value)[:40]!r} is not a finite number (NaN and infinities mean nothing here)")
    return number


def _parse_int(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip()
    if len(text.lstrip("+-")) > 40:  # int() of thousands of digits is slow, and no option takes such a number
        raise _refuse(f"{text[:20]}... ({len(text)} characters) is too long to be a whole number an option takes")
    try:
        return int(text)
    except ValueError:
        raise _refuse(f"{text[:40]!r} is not a whole number") from None


_parse_float.__name__, _parse_int.__name__ = "float", "integer"  # the type help shows: <float>, <integer>
FLOAT: Callable[[object], float] = _parse_float
INTEGER: Callable[[object], int] = _parse_int


def keyword_or(words: type[enum.Enum], number: Callable[[object], float]) -> Callable[[object], object]:
    """The parser of an option that takes a keyword (a member of ``words``, e.g. ``auto``) or a number read by
    ``number`` (FLOAT or INTEGER, kept as the parser's ``number``): the member, the number, or a refusal that
    names both."""
    keywords = {str(m.value): m for m in words}

    def parse(value: object) -> object:
        if isinstance(value, words):
            return value
        found = keywords.get(str(value).strip().lower())
        if found is not None:
            return found
        try:
            return number(value)
        except ValueError:
            what = "a whole number" if number is INTEGER else "a finite number"
            raise _refuse(f"{str(value)[:40]!r} is neither {' nor '.join(keywords)} nor {what}") from None

    parse.__name__ = "|".join([number.__name__, *keywords])  # the type help shows: <integer|auto>
    parse.number = number  # type: ignore[attr-defined]
    return parse


# ---------------------------------------------------------------- option blocks shared by several commands
# declared once; a command's signature names them (``force: bool = FORCE``): what a request's field is, its request
# declares (cli/_requests.py)

FORCE: Any = typer.Option(False, "--force", help=FORCE_HELP)
NO_REPORT: Any = typer.Option(False, "--no-report", help="Write no report folder.")


def force_option(applies_to: str) -> Any:
    """--force, saying which outputs it applies to."""
    return typer.Option(False, "--force", help=f"{FORCE_HELP} Applies to {applies_to}.")
