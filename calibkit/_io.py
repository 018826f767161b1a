"""Atomic writes, hashing and stable JSON: nothing half-written is ever left behind."""

from __future__ import annotations

import contextlib
import contextvars
import errno
import functools
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from calibkit.outdirs import (
    check_replaceable,
    claim_output,
    clean_stale_tmp,
    hold_lock,
    release_claim,
    umask,
    write_marker,
)


class _Staged:
    """Outputs of one run written in full under temporary names, swapped in together by :func:`commit_together`."""

    def __init__(self) -> None:
        self.swaps: list[Callable[[], None]] = []  # renames only: nothing left that can fill a disk
        self.discards: list[Callable[[], None]] = []


_staged: contextvars.ContextVar[_Staged | None] = contextvars.ContextVar("calibkit_staged", default=None)


@contextlib.contextmanager
def commit_together() -> Iterator[None]:
    """The outputs of one run are committed together or not at all.

    Inside the block, :func:`atomic_open` (every file write here) and :func:`atomic_dir` write their outputs in
    full under temporary names beside their targets but do not swap them in; when the block ends without error
    all are renamed into place, one after the other (renames only: a full disk, a file-size limit or Ctrl-C
    while writing leaves every target as it was). On error every staged output is removed. ``compare --json
    X --report D`` used to replace X and then fail on D, leaving two outputs of two different runs."""
    if _staged.get() is not None:  # already inside one: its commit covers these outputs
        yield
        return
    staged = _Staged()
    token = _staged.set(staged)
    try:
        yield
    except BaseException:
        _staged.reset(token)
        for discard in reversed(staged.discards):
            discard()
        raise
    _staged.reset(token)
    try:
        for swap in staged.swaps:
            swap()
    finally:
        for discard in staged.discards:  # what was swapped in is gone from its temporary name: a no-op for it
            discard()


def _unlink_quietly(path: str | os.PathLike[str]) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path``; on success rename it over ``path``, on error remove it."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp makes 0600; outputs get the umask's permissions
        # text: a lone surrogate (from a file name that is not UTF-8) is written escaped, never a crash
        binary = "b" in mode
        with os.fdopen(fd, mode, encoding=None if binary else encoding,
                       errors=None if binary else "backslashreplace") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        staged = _staged.get()
        if staged is None:
            os.replace(tmp, target)
        else:  # swapped in with the run's other outputs (commit_together)
            staged.swaps.append(functools.partial(os.replace, tmp, target))
            staged.discards.append(functools.partial(_unlink_quietly, tmp))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_open(path, "wb") as fh:
        fh.write(data)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_open(path, "w") as fh:
        fh.write(text)


def utf8_path(path: str | os.PathLike[str]) -> bool:
    """Whether a path's name is valid UTF-8 (a name of other bytes reads as lone surrogates, ``\\udcff``)."""
    return not _SURROGATE.search(os.fspath(path))


def shown_path(path: str | os.PathLike[str]) -> str:
    """``path`` for a message or a log line: a name whose bytes are not UTF-8 shown escaped (``\\udcff``), so
    no stream or log handler meets a lone surrogate it cannot encode."""
    text = os.fspath(path)
    return text if utf8_path(text) else text.encode("utf-8", "backslashreplace").decode("utf-8")


def native_path(path: str | os.PathLike[str]) -> str:
    """``path`` as a string a native library (onnx, ONNX Runtime, tokenizers) can open: those take UTF-8 only,
    so a name whose bytes are not UTF-8 is a ModelError saying so (Python-side readers open such names fine;
    callers read the bytes themselves where they can)."""
    from calibkit.errors import ModelError

    text = os.fspath(path)
    if utf8_path(text):
        return text
    raise ModelError(f"{shown_path(text)}: the path holds bytes that are not UTF-8, which ONNX Runtime, onnx and "
                     "tokenizers cannot open",
                     hint="rename the file or folder to a UTF-8 name, or pass a symbolic link with a UTF-8 name that "
                          "points to it")


_SURROGATE = re.compile("[\ud800-\udfff]")


def dumps_json(obj: object) -> str:
    """Stable JSON: sorted keys, two-space indent, trailing newline, no NaN (written as null).

    A lone surrogate (a file name whose bytes are not UTF-8, read by Python as ``\\udcff``) is written as its
    JSON escape, so the file is valid UTF-8 and reads back to the same string (and the same path)."""
    text = json.dumps(_finite(obj), indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"
    return text if text.isascii() else _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def write_json(path: str | os.PathLike[str], obj: object) -> None:
    write_text(path, dumps_json(obj))


def read_json(path: str | os.PathLike[str]) -> Any:
    """The JSON document in the file ``path``. Anything but a regular file there (a FIFO, a device) is an
    OSError naming what it is: opened without blocking, so a FIFO never hangs the run and ``/dev/zero`` is
    never read without end."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"{file_kind(mode)}, not a regular file", os.fspath(path))
        fh = os.fdopen(fd, encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise
    with fh:
        return json.load(fh)


def file_kind(mode: int) -> str:
    """What an ``st_mode`` that is not a regular file's stands for, in words ("a FIFO", "a folder", ...)."""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def not_own_file(path: str | os.PathLike[str]) -> str | None:
    """Why what stands at ``path`` cannot be a file calibkit made there (a symbolic link, a FIFO, a folder or
    another special file, or a regular file with other names: hard links), looked at with ``lstat``, never
    followed; None when it is a plain regular file or nothing stands there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return file_kind(st.st_mode) + (f" (to {os.readlink(path)})" if stat.S_ISLNK(st.st_mode) else "")
    return "a file with other names (hard links)" if st.st_nlink != 1 else None


def _finite(obj: object) -> object:
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return _finite(obj.item())
    return obj


def text_lines(text: str) -> list[str]:
    """The lines of a JSON Lines (or other line-based) text, split at ``\\n`` only (a ``\\r`` before it dropped).

    ``str.splitlines`` also splits at U+0085, U+2028, U+2029, ``\\x1c``-``\\x1e`` and form feeds, which JSON
    writers (``ensure_ascii=False``) leave raw inside strings: a text holding one was cut in two lines."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str], *, what: str = "", legacy_names: Iterable[str] = ()) -> Iterator[Path]:
    """Build a directory under a temporary name and swap it into place only when complete.

    The new folder carries calibkit's marker file (``outdirs.MARKER``). An existing ``path`` is replaced only
    after the new folder is fully written, and only when it is empty, carries the marker or holds nothing but
    ``legacy_names`` (folders written before the marker existed); anything else raises UsageError, as does an
    existing file. Temporary folders left by a killed earlier writer are removed first.
    """
    target = Path(path)
    check_replaceable(target, legacy_names=legacy_names)
    target.parent.mkdir(parents=True, exist_ok=True)
    # one writer per output, across threads and processes; a folder inside one being built is ours already
    inside_ours = any(t == here or t in here.parents for here in [target.resolve()] for t in _building)
    claimed = not inside_ours and claim_output(target, option="the output")
    release = functools.partial(release_claim, target) if claimed else _nothing
    clean_stale_tmp(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        os.chmod(tmp, 0o777 & ~umask())  # mkdtemp makes 0700
        write_marker(tmp, what)
        staged = _staged.get()
        inside = _staged.set(None)  # files inside the new folder are written in place: the folder is the unit
        _building[tmp.resolve()] = Path(os.path.abspath(target))
        try:
            yield tmp
        finally:
            _staged.reset(inside)
            _building.pop(tmp.resolve(), None)
        write_marker(tmp, what, entries=(p.name for p in tmp.iterdir()), digests=True)
        if staged is None:
            _swap_dir(tmp, target, legacy_names)
            release()
        else:  # swapped in with the run's other outputs (commit_together)
            staged.swaps.extend((functools.partial(_swap_dir, tmp, target, tuple(legacy_names)), release))
            staged.discards.extend((functools.partial(shutil.rmtree, tmp, ignore_errors=True), release))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        release()
        raise


def _nothing() -> None:
    pass


_building: dict[Path, Path] = {}  # temporary folders of atomic_dir being written -> where they will be


def final_path(path: str | os.PathLike[str]) -> Path:
    """Where ``path`` will be once written: a path inside a folder :func:`atomic_dir` is building lives, after the
    swap, inside the target (absolute); any other path is its own absolute path."""
    p = Path(os.path.abspath(path))
    here = p.resolve()
    for tmp, target in _building.items():
        if here == tmp or tmp in here.parents:
            return target / here.relative_to(tmp)
    return p


def record_path(document: str | os.PathLike[str], target: str | os.PathLike[str], *, max_up: int = 2) -> str:
    """How the document at ``document`` names ``target``: relative to the document's own folder (where it will
    be, :func:`final_path`) when that takes at most ``max_up`` steps up, so the folder can be moved or copied
    with what lies near it; absolute otherwise. Either way the reader checks the file by its recorded sha256."""
    home = Path(os.path.realpath(final_path(document).parent))
    dest = Path(os.path.realpath(final_path(target)))
    try:
        rel = os.path.relpath(dest, home)
    except ValueError:  # another drive (Windows)
        return str(dest)
    return rel if Path(rel).parts[: max_up + 1].count("..") <= max_up else str(dest)


def _swap_dir(tmp: Path, target: Path, legacy_names: Iterable[str]) -> None:
    check_replaceable(target, legacy_names=legacy_names)  # again: it may have changed while we worked
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
        os.replace(target, old)  # onto the empty placeholder; the old folder is ours (checked above)
        os.replace(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)


_ALIVE = ".calibkit-alive"


def mark_alive(folder: str | os.PathLike[str]) -> None:
    """Hold an exclusive lock on ``folder/.calibkit-alive`` for the life of this process.

    The kernel drops the lock when the process ends, however it ends, so :func:`owner_alive` can tell a live
    owner from a dead one even where a PID check cannot (processes in another PID namespace sharing one /tmp
    look dead to ``os.kill(pid, 0)``; a recycled PID looks alive).

    The file is locked under a name of this process's own and only then renamed to ``.calibkit-alive``: a file
    that appeared before its lock read as a dead owner's to a sweep landing between the two (the folder of a
    live worker was removed mid-run), and that sweep's own brief lock could make the owner's attempt fail."""
    staged = Path(folder) / f"{_ALIVE}.{os.getpid()}.{threading.get_ident()}"
    if hold_lock(staged, 0o600) is None:  # not POSIX: callers fall back to their PID check
        staged.unlink(missing_ok=True)
        return
    os.replace(staged, Path(folder) / _ALIVE)  # the lock is on the file, not its name: it stays held


def owner_alive(folder: str | os.PathLike[str]) -> bool | None:
    """Whether the process that called :func:`mark_alive` on ``folder`` still runs; ``None`` when the folder
    has no such lock (made by an older calibkit, or its owner has not locked it yet)."""
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fd = os.open(Path(folder) / _ALIVE, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError:
        return True  # cannot tell (a symbolic link is not a lock calibkit made): never remove
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # also releases the lock just taken
    return False
