"""The executor seam: submit pure work units, gather their results in order, share large read-only inputs once.

Work units are a module-level function and a picklable argument. Large inputs (model bytes, eval data) are
not put in every argument: the driver ``share``s them once and the argument carries a :class:`Shared` reference
(a content key); on a worker, :func:`fetch` returns the value from a per-process cache, filled once per worker
process (a file the pool worker reads once, or Dask's broadcast copy in the worker's memory).
"""

from __future__ import annotations

import ast
import atexit
import hashlib
import multiprocessing.util
import os
import pickle
import shutil
import sys
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Generic, TypeVar

from calibkit._io import mark_alive, owner_alive
from calibkit.cpus import usable_cpus
from calibkit.errors import UsageError
from calibkit.progress import ProgressCallback, ProgressEvent, no_progress

T = TypeVar("T")
R = TypeVar("R")
_V_co = TypeVar("_V_co", covariant=True)  # a shared value's type

ResultCallback = Callable[[int, Any], None]


@dataclass(frozen=True)
class Shared(Generic[_V_co]):
    """A reference to a value (of type ``_V_co``) shared once with every worker; :func:`fetch` resolves it on the
    worker."""

    key: str  # sha256 of the value's pickle (bytes values: of the bytes)
    nbytes: int


@dataclass(frozen=True)
class Spilled:
    """Where a pool worker reads a shared value from (once per process)."""

    path: str

    def load(self) -> Any:  # whatever was pickled: fetch returns it as its reference's type
        with open(self.path, "rb") as fh:
            return pickle.load(fh)


def content_key(value: object) -> tuple[str, bytes]:
    data = value if isinstance(value, bytes) else pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return hashlib.sha256(data).hexdigest(), data


# -- worker side: per-process cache of shared values -----------------------------------------------------------
_lock = threading.Lock()
_values: dict[str, Any] = {}
_sources: dict[str, Any] = {}
_files: dict[str, Path] = {}
_tmp: Path | None = None


def install_sources(sources: Mapping[str, Any]) -> None:
    """Called before each task on a worker: makes the executor's current shares resolvable and forgets the
    ones no longer shared (an executor that closed), so a long-lived worker does not keep old models."""
    with _lock:
        for k in [k for k in _values if k not in sources]:
            del _values[k]
        for k in [k for k in _files if k not in sources]:
            _remove(_files.pop(k))
        for k in [k for k in _sources if k not in sources]:
            del _sources[k]
        for k, v in sources.items():
            if k not in _values:
                _sources[k] = v


def fetch(ref: Shared[T]) -> T:
    """The value behind ``ref`` (loaded once per process)."""
    with _lock:
        if ref.key in _values:
            return _values[ref.key]
        src = _sources.get(ref.key)
        if src is None:
            raise UsageError(f"shared value {ref.key[:12]} is not known in this process",
                             hint="share it through the executor that runs the work unit")
        value = src.load() if isinstance(src, Spilled) else src
        _values[ref.key] = value
        _sources.pop(ref.key, None)
        return value


def materialize(ref: Shared[bytes | Mapping[str, bytes]]) -> Path:
    """A local path holding the shared value: ``bytes`` become a file, ``{name: bytes}`` a folder (once per
    process, under a temporary folder removed when the process exits)."""
    with _lock:
        hit = _files.get(ref.key)
    if hit is not None and hit.exists():
        return hit
    value = fetch(ref)
    root = _scratch()
    dest = root / ref.key
    tmp = root / f".{ref.key}.{threading.get_ident()}"
    if isinstance(value, bytes):
        tmp.write_bytes(value)
    elif isinstance(value, Mapping):
        tmp.mkdir()
        for name, data in value.items():
            (tmp / Path(name).name).write_bytes(data)
    else:
        raise UsageError(f"shared value {ref.key[:12]} is {type(value).__name__}, not bytes or a folder")
    if dest.exists():
        _remove(tmp)
    else:
        os.replace(tmp, dest)
    with _lock:
        _files[ref.key] = dest
    return dest


def _scratch() -> Path:
    global _tmp
    with _lock:
        if _tmp is None:
            sweep_stale("calibkit-worker-")
            _tmp = Path(tempfile.mkdtemp(prefix=f"calibkit-worker-{os.getpid()}-"))
            mark_alive(_tmp)
            atexit.register(remove_scratch)
            # multiprocessing children (pool and Dask workers) leave through os._exit, skipping atexit: their
            # exit runs multiprocessing's finalizers instead
            multiprocessing.util.Finalize(None, remove_scratch, exitpriority=10)
        return _tmp


_UNLOCKED_GRACE_S = 600.0  # an unlocked folder this young may still be locked by its (live) creator


def sweep_stale(prefix: str) -> None:
    """Remove ``PREFIX<pid>-*`` temporary folders of processes that no longer exist (a worker or driver killed
    with no chance to clean up: SIGKILL, out of memory)."""
    for p in Path(tempfile.gettempdir()).glob(f"{prefix}*-*"):
        pid = p.name[len(prefix):].split("-", 1)[0]
        if not pid.isdigit() or not p.is_dir():
            continue
        alive = owner_alive(p)  # the owner's lock: right across PID namespaces sharing this /tmp
        if alive is None:  # no lock (older calibkit, or being created): the PID, and only once it is old
            try:
                os.kill(int(pid), 0)
                continue
            except ProcessLookupError:
                try:
                    alive = time.time() - p.stat().st_mtime < _UNLOCKED_GRACE_S
                except OSError:  # removed meanwhile by its owner, who was leaving
                    continue
            except OSError:  # exists, owned by someone else
                continue
        if not alive:
            shutil.rmtree(p, ignore_errors=True)


def remove_scratch() -> None:
    """Delete this process's materialized shared files (at exit, or before a worker leaves)."""
    locked = _lock.acquire(timeout=2)  # never hang an exiting process on a unit that holds the lock
    try:
        if _tmp is not None:
            shutil.rmtree(_tmp, ignore_errors=True)
        _files.clear()
    finally:
        if locked:
            _lock.release()


def _remove(p: Path) -> None:
    if p.is_dir():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def run_unit(fn: Callable[[T], R], item: T, sources: Mapping[str, object]) -> R:
    """What every executor runs on a worker: install the shared values, then the work unit."""
    install_sources(sources)
    return fn(item)


def _rerun_main_path() -> str | None:
    """The file a spawned process re-runs as ``__mp_main__`` before it can work (multiprocessing's own rule:
    a script run by path or a module run with -m, not a package's __main__.py nor an interactive session)."""
    main = sys.modules.get("__main__")
    if main is None:
        return None
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    if spec_name is not None and (spec_name == "__main__" or spec_name.endswith(".__main__")):
        return None
    path = getattr(main, "__file__", None)
    if not isinstance(path, str) or Path(path).stem == "ipython":
        return None
    return path


def _guards(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "__name__" for n in ast.walk(node))


def check_spawn_safe() -> None:
    """Refuse to start spawned workers from a script's unguarded top level.

    Each spawned worker imports the main script again before it takes any work: a script whose calls to
    calibkit are not under ``if __name__ == "__main__":`` runs again in every worker (rewriting its outputs,
    starting workers of its own, which multiprocessing refuses, until the pool gives up or hangs). Called in the
    process that starts the workers: the call in progress is found on the stack, its line in the script's
    source, and refused unless an ``if`` on ``__name__`` encloses it."""
    path = _rerun_main_path()
    if path is None:
        return
    main = sys.modules["__main__"]
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and not (frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:  # not called while the script's top level runs (a thread, an atexit hook)
        return
    line = frame.f_lineno
    try:
        tree = ast.parse(Path(path).read_bytes(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return
    if any(isinstance(n, ast.If) and _guards(n.test) and n.lineno <= line <= (n.end_lineno or n.lineno)
           for n in ast.walk(tree)):
        return
    raise UsageError(
        f"{path} starts worker processes at line {line}, at its top level: each worker imports the script again "
        "and would run it again (its outputs rewritten, workers of its own started) before doing any work",
        hint='put the script\'s work under  if __name__ == "__main__":  (see the Python API page), or pass '
             'executor="inline" to run in this process')


# -- driver side -----------------------------------------------------------------------------------------------
class Executor(ABC):
    """Runs work units; results come back in the order of the inputs. Use as a context manager."""

    name: str = "executor"
    retries: int = 2

    def __init__(self) -> None:
        self._shared: dict[str, Shared[Any]] = {}  # by content: each value's own type
        self._file_memo: dict[tuple[str, int, int], Shared[bytes]] = {}

    # sharing
    def share(self, value: T) -> Shared[T]:
        """Share ``value`` with every worker once; the same content is shared only once."""
        key, data = content_key(value)
        ref = self._shared.get(key)
        if ref is None:
            ref = Shared(key, len(data))
            self._publish(ref, value, data)
            self._shared[key] = ref
        return ref

    def share_file(self, path: str | os.PathLike[str]) -> Shared[bytes]:
        """Share a file's bytes (read and hashed once per path, size and mtime)."""
        st = os.stat(path)
        memo = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
        ref = self._file_memo.get(memo)
        if ref is None:
            ref = self._file_memo[memo] = self.share(Path(path).read_bytes())
        return ref

    @abstractmethod
    def _publish(self, ref: Shared[Any], value: object, data: bytes) -> None: ...

    # running
    @property
    @abstractmethod
    def workers(self) -> int:
        """How many work units run at once."""

    @property
    def threads_per_task(self) -> int:
        """Intra-op threads each work unit should use."""
        return max(1, usable_cpus() // max(1, self.workers))

    @property
    def task_threads(self) -> int | None:
        """Threads a unit must use whatever its caller computed (None: the caller's choice stands). Remote
        workers' core counts are not the driver's."""
        return None

    @abstractmethod
    def map(
        self,
        fn: Callable[[T], R],
        items: Sequence[T],
        *,
        task: str = "work",
        progress: ProgressCallback | None = None,
        on_result: Callable[[int, R], None] | None = None,
    ) -> list[R]:
        """``[fn(x) for x in items]`` on the workers. ``on_result(i, r)`` is called on the driver as each
        finishes (in completion order), before ``map`` returns."""

    def close(self) -> None:
        self._shared.clear()
        self._file_memo.clear()

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class InProcessExecutor(Executor):
    """Runs every unit in this process, one after the other (tests; ``--executor inline``)."""

    name = "inline"

    def __init__(self) -> None:
        super().__init__()
        self._sources: dict[str, Any] = {}

    def _publish(self, ref: Shared[Any], value: object, data: bytes) -> None:
        self._sources[ref.key] = value

    @property
    def workers(self) -> int:
        return 1

    def map(self, fn, items, *, task="work", progress=None, on_result=None):  # type: ignore[no-untyped-def]
        cb = progress or no_progress
        cb(ProgressEvent(task, 0, len(items)))
        out = []
        for i, item in enumerate(items):
            r = run_unit(fn, item, self._sources)
            out.append(r)
            if on_result is not None:
                on_result(i, r)
            cb(ProgressEvent(task, i + 1, len(items)))
        return out

    def close(self) -> None:
        super().close()
        self._sources.clear()
