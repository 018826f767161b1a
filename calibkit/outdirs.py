"""Output folders: which ones calibkit may replace, which it must refuse, and where it can write at all.

Every folder calibkit writes as a whole carries a marker file (``MARKER``). A folder is replaced only when it
is empty or every file under it, recursively, is one the marker lists (or, for folders written before the
marker listed files, one of the names calibkit writes there); a folder holding any other file is refused, naming
the file, whatever ``--force`` says: calibkit never deletes, moves or overwrites a file it did not write.
Inputs are never outputs: an output that equals, contains or lies inside an input of the run, given or named by
the documents of one (:mod:`calibkit.provenance`), is refused whatever the flags; every writer of every command
asks :func:`guard_output_dir` or :func:`guard_output_file` first. Writability is checked before any work starts,
so a read-only folder fails in a second, not after an hour of calibration.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fnmatch
import glob
import hashlib
import json
import logging
import os
import shutil
import socket
import stat as _stat
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from calibkit.errors import UsageError
from calibkit.provenance import OUTPUT_MARKER, RunInput, RunInputs, resolved, run_inputs

log = logging.getLogger("calibkit.outdirs")

MARKER = OUTPUT_MARKER
MARKER_FORMAT = "calibkit-output/1"


def write_marker(folder: Path, what: str = "", entries: Iterable[str] | None = None, *,
                 digests: bool = False, files: Iterable[str] | None = None) -> None:
    """Mark ``folder`` as written by calibkit; the pid and host tell a stale temporary folder from a live one.

    ``entries`` (the names calibkit put in the folder) makes a later replace refuse a folder into which the
    user has since added files of their own; ``files`` (default with ``entries``: every file and empty folder
    under it, recursively, :func:`tree`) is the list a later replace checks, so a file added inside a subfolder
    is the user's too. ``digests`` records the sha256 of each top-level file, so a reader can tell a file
    swapped in later from the one calibkit wrote (:func:`changed_files`).
    """
    rec: dict = {"format": MARKER_FORMAT, "what": what, "pid": os.getpid(), "host": socket.gethostname()}
    if entries is not None:
        rec["entries"] = sorted(set(entries) - {MARKER})
        if digests:
            rec["sha256"] = {n: _sha256(folder / n) for n in rec["entries"]
                             if (folder / n).is_file() and not (folder / n).is_symlink()}
        if files is None:
            files = tree(folder)
    if files is not None:
        rec["files"] = sorted(set(files) - {MARKER})
    (folder / MARKER).write_text(json.dumps(rec, sort_keys=True) + "\n", encoding="utf-8")


def tree(folder: Path) -> list[str]:
    """Every file under ``folder`` (symbolic links and special files included, never followed) as a relative
    POSIX path, and every empty folder as ``NAME/``: what an ownership record lists."""
    out: list[str] = []
    for root, dirs, names in os.walk(folder):
        rel = Path(root).relative_to(folder)
        for d in list(dirs):
            if os.path.islink(os.path.join(root, d)):  # os.walk lists a link to a folder as a folder
                dirs.remove(d)
                names.append(d)
        out.extend((rel / n).as_posix() for n in names)
        if not dirs and not names and rel != Path("."):
            out.append(rel.as_posix() + "/")
    return sorted(out)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def changed_files(folder: Path, names: Iterable[str] | None = None) -> list[str]:
    """The files of a folder calibkit wrote whose bytes are not those it recorded in the marker (swapped,
    edited or removed since), among ``names`` (default: every recorded file). Empty when the folder records no
    digests (written by an older calibkit, or not by calibkit)."""
    rec = read_marker(folder)
    recorded = rec.get("sha256") if rec is not None else None
    if not isinstance(recorded, dict):
        return []
    wanted = recorded if names is None else [n for n in names if n in recorded]
    out = []
    for n in wanted:
        p = folder / n
        if not p.is_file() or p.is_symlink() or _sha256(p) != recorded[n]:
            out.append(n)
    return out


def read_marker(folder: Path) -> dict | None:
    """The folder's marker, when a regular file of calibkit's format stands there: a link (to another
    folder's marker, say), a FIFO or anything else is no marker, and its folder the user's."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(folder / MARKER, flags)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as fh:
            if not _stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return None
            rec = json.loads(fh.read(64 << 20).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return rec if isinstance(rec, dict) and rec.get("format") == MARKER_FORMAT else None


def is_replaceable(folder: Path, legacy_names: Iterable[str] = ()) -> bool:
    """True when every file under ``folder``, recursively, is one calibkit wrote (:func:`foreign_files` is
    empty): an empty folder, or one whose marker lists all it holds."""
    return not foreign_files(folder, legacy_names)


def foreign_files(folder: Path, legacy_names: Iterable[str] = ()) -> list[str]:
    """The files (and empty folders, as ``NAME/``) under ``folder`` that calibkit is not known to have written,
    as relative POSIX paths, recursively.

    Known to be calibkit's: what the folder's marker lists in ``files``. A marker of an older calibkit lists
    only the top-level ``entries``: those files are known, a listed subfolder only where it carries a marker of
    its own; a marker without any list (or none) knows nothing. Beyond that, ``legacy_names`` (names, or
    ``/``-separated patterns such as ``plots/*.png``, that the command writes) are taken as calibkit's, as for
    folders written before the marker existed. Anything else is the user's."""
    rec = read_marker(folder)
    listed = rec.get("files") if rec is not None else None
    if isinstance(listed, list):
        ours = {MARKER, *(str(n) for n in listed)}
        return [n for n in tree(folder) if n not in ours]
    entries = rec.get("entries") if rec is not None else None
    top = {str(n) for n in entries} if isinstance(entries, list) else set()
    legacy = tuple(legacy_names)
    out: list[str] = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        name = entry.name
        if entry.is_dir(follow_symlinks=False):
            sub = folder / name
            if name in top and read_marker(sub) is not None:
                out.extend(f"{name}/{n}" for n in foreign_files(sub))
                continue
            out.extend(n for n in (f"{name}/{r}" for r in tree(sub) or [""]) if not _legacy(n, legacy))
        elif not (name == MARKER and rec is not None) and name not in top and not _legacy(name, legacy):
            out.append(name)
    return out


def _legacy(rel: str, patterns: tuple[str, ...]) -> bool:
    parts = rel.rstrip("/").split("/")
    for pat in patterns:
        pp = pat.split("/")
        if len(pp) == len(parts) and all(fnmatch.fnmatchcase(a, b) for a, b in zip(parts, pp, strict=True)):
            return True
    return False


def foreign_entries(folder: Path, limit: int = 5, legacy_names: Iterable[str] = ()) -> str:
    """The files under ``folder`` that calibkit did not write (:func:`foreign_files`), as a short list."""
    foreign = foreign_files(folder, legacy_names)
    return ", ".join(foreign[:limit]) + (" …" if len(foreign) > limit else "")


def check_replaceable(path: str | os.PathLike[str], *, option: str = "--out", legacy_names: Iterable[str] = (),
                      force: bool = False) -> None:
    """Refuse an output path that is a file, or a folder holding a file calibkit did not write (:func:`foreign_files`).
    ``force`` does not lift this: it is accepted for the callers that pass it on, and changes nothing here."""
    p = Path(path)
    check_not_symlink(p, option=option)
    if not p.exists():
        return
    if not p.is_dir():
        raise UsageError(f"{option} {p} is an existing file, not a folder; calibkit will not replace it",
                         hint=f"pass a new folder path to {option}")
    foreign = foreign_files(p, legacy_names)
    if foreign:
        shown = ", ".join(foreign[:5]) + (" …" if len(foreign) > 5 else "")
        raise UsageError(
            f"{option} {p} holds files calibkit did not write ({shown}); calibkit replaces the folder as a whole "
            "and never deletes, moves or overwrites a file it did not write, --force or not",
            hint=f"pass a new or empty folder to {option}, or move those files out of {p} yourself",
        )


def check_not_symlink(p: Path, *, option: str = "--out") -> None:
    """Refuse an output folder that is a symbolic link (dangling, a loop, or to a folder): calibkit swaps a new
    folder in for the target as a whole, which would replace the link itself, so the run would be done and then
    refused at the swap (or would leave the folder it points to untouched)."""
    if not p.is_symlink():
        return
    real = Path(os.path.realpath(p))
    if _is_loop(p):
        what, hint = "a symbolic link loop", f"remove the link, or pass a real folder to {option}"
    elif not real.exists():
        what, hint = f"a dangling symbolic link (to {real})", f"pass a new folder to {option}"
    else:
        what, hint = f"a symbolic link to {real}", f"pass the folder itself: {option} {real}"
    raise UsageError(f"{option} {p} is {what}; calibkit replaces an output folder as a whole and would replace "
                     "the link, not write where it points", hint=hint)


def _is_loop(p: Path) -> bool:
    try:
        os.stat(p)
    except OSError as exc:
        import errno

        return exc.errno == errno.ELOOP
    return False


def _resolved(p: str | os.PathLike[str]) -> Path:
    """The absolute path with every symbolic link followed; a link loop stays as it is (never raises)."""
    return resolved(p)


def check_not_input(path: str | os.PathLike[str], inputs: Iterable[object] | RunInputs, *,
                    option: str = "--out", inside_ok: bool = False) -> None:
    """Refuse an output that is, contains or lies inside an input of the run (``--force`` does not lift this).

    ``inputs``: the paths the run was given (or values with a ``path``), expanded here to every file and folder
    their documents name (:func:`calibkit.provenance.run_inputs`): an engine's sidecar, model folder, tokenizer
    and calibrate folder, a calibration set's log, and so on. ``inside_ok``: a new single file may be added
    inside a folder given directly (an engine beside its model); never inside one found by provenance.
    """
    out = _resolved(path)
    hits: list[tuple[int, str, RunInput]] = []
    for inp in inputs if isinstance(inputs, RunInputs) else run_inputs(inputs):
        if out == inp.path:
            hits.append((0, "is", inp))
        elif inp.path.is_dir() and inp.path in out.parents and not (inside_ok and inp.direct):
            hits.append((1, "lies inside", inp))
        elif out in inp.path.parents:
            hits.append((2, "contains", inp))
    if not hits:
        return
    _, relation, inp = min(hits, key=lambda h: h[0])  # the closest relation names the input best
    why = f" ({inp.named_by})" if inp.named_by else ""
    raise UsageError(
        f"{option} {path} {relation} the input {inp.path}{why}; calibkit never writes over its inputs",
        hint=(f"pass {option} a new file name that is not one of the inputs" if inside_ok else
              f"pass {option} a folder outside the inputs, e.g. runs/<name>"),
    )


def check_writable(path: str | os.PathLike[str], *, option: str = "--out", is_file: bool = False) -> None:
    """Fail now, not after the work, when ``path`` (a folder or, with ``is_file``, a file) cannot be written.

    Probes by creating and removing a temporary file in the nearest existing folder, which works for root and
    read-only mounts alike (``os.access`` does not).
    """
    p = Path(path)
    if is_file and p.is_dir():
        raise UsageError(f"{option} {p} is a folder", hint=f"pass a file path to {option}, e.g. {p / 'out.json'}")
    if not is_file and p.exists() and not p.is_dir():
        raise UsageError(f"{option} {p} is an existing file, not a folder", hint=f"pass a new folder to {option}")
    # a folder is swapped in beside itself, so its parent must take new entries; a file likewise. An existing
    # folder is emptied after the swap, so it must be writable too.
    probe_in = p.absolute().parent
    while not probe_in.exists():
        if probe_in.parent == probe_in:
            break
        probe_in = probe_in.parent
    if not probe_in.is_dir():
        raise UsageError(f"{option} {p}: {probe_in} is a file, not a folder", hint=f"pass another path to {option}")
    for folder in (probe_in, *([p] if not is_file and p.is_dir() else [])):
        try:
            fd, probe = tempfile.mkstemp(prefix=".calibkit-probe.", suffix=".tmp", dir=folder)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise UsageError(
                f"{option} {p} cannot be written: {folder} is not writable ({exc.strerror or exc})",
                hint=f"pass an {option} in a folder you can write to, or fix its permissions",
            ) from None


def guard_output_dir(path: str | os.PathLike[str], *, inputs: Iterable[object] | RunInputs = (),
                     option: str = "--out", force: bool = False, legacy_names: Iterable[str] = ()) -> None:
    """All checks for a folder a command will write as a whole, before any work: a folder holding files calibkit
    did not write is refused, ``force`` or not (calibkit never moves a user's files)."""
    check_not_input(path, inputs, option=option)
    out, cwd = _resolved(path), Path.cwd().resolve()
    if out == cwd or out in cwd.parents:
        raise UsageError(f"{option} {path} is the current folder or one above it; it would be replaced as a whole",
                         hint=f"pass a subfolder to {option}, e.g. {option} runs/<name>")
    check_replaceable(path, option=option, legacy_names=legacy_names, force=force)
    check_writable(path, option=option)
    claim_output(Path(path), option=option)


_held_locks: list[int] = []  # descriptors held open for the life of the process


def hold_lock(path: Path, mode: int = 0o644) -> int | None:
    """Take an exclusive lock on ``path`` (created if missing) and hold it for the life of this process; the
    descriptor, or None when another process holds it, the platform has no ``flock``, or ``path`` cannot be
    opened without following a symbolic link."""
    try:
        import fcntl
    except ImportError:
        return None
    try:  # never through a symbolic link: the file is ours to create, not one a link points to
        fd = os.open(path, os.O_CREAT | os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    _held_locks.append(fd)
    return fd


LOCK_SUFFIX = ".calibkit-lock"
LOCK_FORMAT = "calibkit-lock/1"
# outputs this process holds the lock of -> (lock file, descriptor, the thread that claimed it)
_claims: dict[Path, tuple[Path, int, int]] = {}
_claims_mutex = threading.Lock()


def lock_path(path: str | os.PathLike[str]) -> Path:
    """Where the one-writer lock of an output lives: beside the output, in its (resolved) parent folder, as
    ``.NAME.calibkit-lock``. Keyed by the output's own location, not by anything of the environment (``TMPDIR``,
    the user, the container): every process that can write the output sees the same lock file."""
    target = _resolved(path)
    return target.parent / f".{target.name}{LOCK_SUFFIX}"


def claim_output(path: Path, *, option: str = "--out") -> bool:
    """One writer per output: hold an exclusive lock on :func:`lock_path` until the run ends and refuse when
    another live run, or another thread of this process, holds it; two runs into one --out used to both report
    success while one silently replaced the other, and so did two threads of one program. True when this call
    took the claim, False when the calling thread holds it already (or the platform has no ``flock``).

    The lock file lies beside the output because that is the one place every writer of the output shares: a
    lock in the temporary folder was missed by a second run with another ``TMPDIR``. The lock can never be
    turned against anyone (:func:`_take_lock`): it is written in full under a temporary name and linked into
    place (never opened through a link, never truncated), and whatever stands at the lock path that calibkit did
    not create there is refused by name. The kernel releases the lock however the process ends; the file is
    removed by :func:`release_claims` (end of the command, or exit) while still locked. A run killed with
    SIGKILL leaves the file: the next run finds that no process holds it and takes it over, saying so."""
    target = _resolved(path)
    me = threading.get_ident()
    with _claims_mutex:
        held = _claims.get(target)
        if held is not None:
            if held[2] == me:  # already ours
                return False
            raise UsageError(f"{option} {path} is being written by another thread of this process (pid "
                             f"{os.getpid()})", hint=f"wait for it to finish, or pass another {option}")
        lock = lock_path(target)
        try:
            import fcntl  # noqa: F401
        except ImportError:  # not POSIX: no claim (the atomic swap still protects the output)
            return False
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            fd = _take_lock(lock, option=option, output=path)
        except OSError:  # a parent that cannot take the lock cannot take the output either (checked before)
            return False
        first = not _claims
        _claims[target] = (lock, fd, me)
    if first:
        import atexit

        atexit.register(release_claims, every=True)
    return True


def _lock_record() -> bytes:
    rec = {"format": LOCK_FORMAT, "pid": os.getpid(), "host": socket.gethostname()}
    return (json.dumps(rec, sort_keys=True) + "\n").encode("ascii")


def _read_lock_record(fd: int) -> dict | None:
    """The record in a lock file calibkit wrote; None for anything else. Earlier calibkit versions wrote the
    bare pid."""
    data = os.pread(fd, 4096, 0).decode("ascii", "replace").strip()
    if data.isdigit():
        return {"pid": int(data)}
    try:
        rec = json.loads(data)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) and rec.get("format") == LOCK_FORMAT else None


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)


def _take_lock(lock: Path, *, option: str, output: str | os.PathLike[str]) -> int:
    """The descriptor of our lock at ``lock``, or a UsageError: held by a live run, or not calibkit's.

    Our lock is a new file, written and locked under a temporary name and hard-linked to ``lock``: the link
    fails when anything stands there, so no file (or link target) is ever opened for writing at the lock path.
    What stands there is opened without following links: a calibkit lock that a live process holds refuses
    this run; one that no process holds (its run was killed) is replaced by ours with a warning; anything else
    (a symbolic link, a folder, a file with other content or other names) is refused by name."""
    import fcntl

    fd, tmp = tempfile.mkstemp(prefix=f"{lock.name}.", suffix=".tmp", dir=lock.parent)
    try:
        os.fchmod(fd, 0o666 & ~umask())
        os.write(fd, _lock_record())
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held before the file is visible as the lock
        for _ in range(100):
            try:
                os.link(tmp, lock)
                return fd
            except FileExistsError:
                pass
            except OSError:  # a file system without hard links: created exclusively, never through a link
                made = _create_exclusively(lock)
                if made is not None:
                    os.close(fd)
                    return made
            if _replace_stale(lock, tmp, option=option, output=output):
                return fd
        raise OSError("the lock file keeps being replaced")
    except BaseException:
        os.close(fd)
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _create_exclusively(lock: Path) -> int | None:
    """Our lock created at ``lock`` with O_EXCL (where hard links are not supported); None when something
    stands there. Until its record is written another run reads an empty file: refused, never taken over."""
    import fcntl

    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_RDWR | _NOFOLLOW, 0o666 & ~umask())
    except FileExistsError:
        return None
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, _lock_record())
    return fd


def _replace_stale(lock: Path, ours: str, *, option: str, output: str | os.PathLike[str]) -> bool:
    """What stands at ``lock``: True when it was a stale calibkit lock, now replaced by ``ours``; False when it
    vanished meanwhile (try again); a UsageError when a live run holds it or calibkit did not create it."""
    import errno
    import fcntl
    import stat

    def foreign(what: str) -> UsageError:
        return UsageError(f"{option} {output}: {lock} is {what}, not a lock calibkit created; calibkit will not "
                          "write to it", hint=f"remove {lock} if it is not yours to keep, or pass another {option}")

    try:
        old = os.open(lock, os.O_RDONLY | _NOFOLLOW)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            with contextlib.suppress(OSError):
                raise foreign(f"a symbolic link (to {os.readlink(lock)})") from None
            raise foreign("a symbolic link") from None
        raise
    try:
        st = os.fstat(old)
        if not stat.S_ISREG(st.st_mode):
            raise foreign("a folder" if stat.S_ISDIR(st.st_mode) else "a special file")
        try:
            fcntl.flock(old, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            rec = _read_lock_record(old) or {}
            raise UsageError(f"{option} {output} is being written by another calibkit run (pid "
                             f"{rec.get('pid', '?')})",
                             hint=f"wait for it to finish, or pass another {option}") from None
        try:
            if os.lstat(lock).st_ino != st.st_ino:
                return False  # replaced since we opened it
        except FileNotFoundError:
            return False
        record = _read_lock_record(old)
        if record is None or st.st_nlink != 1:
            raise foreign("a file with other content" if record is None else "a file with other names (hard links)")
        os.rename(ours, lock)  # atomic: the lock path never stands empty or unlocked
        log.warning("%s %s: took over the lock %s of an earlier run (pid %s) that ended without releasing it",
                    option, output, lock, record.get("pid", "?"))
        return True
    finally:
        os.close(old)


def release_claims(*, every: bool = False) -> None:
    """Give up every output the calling thread claimed (``every``: every thread's, at exit): remove each lock
    file while still holding its lock, then close it (called at the end of each command and at exit)."""
    me = threading.get_ident()
    with _claims_mutex:
        mine = [t for t, (_lock, _fd, owner) in _claims.items() if every or owner == me]
    for target in mine:
        release_claim(target)


def release_claim(path: str | os.PathLike[str]) -> None:
    """Give up one claimed output (:func:`claim_output`); nothing when it is not claimed."""
    with _claims_mutex:
        held = _claims.pop(_resolved(path), None)
    if held is None:
        return
    lock, fd, _owner = held
    with contextlib.suppress(OSError):
        if os.lstat(lock).st_ino == os.fstat(fd).st_ino:
            os.unlink(lock)
    with contextlib.suppress(OSError):
        os.close(fd)


def guard_output_file(path: str | os.PathLike[str], *, inputs: Iterable[object] | RunInputs = (),
                      option: str, owned: Callable[[Path], bool] | None = None) -> None:
    """Checks for a single file a command will write (``compare --json``, ``build -o``): never an input, never
    a folder, writable; an existing file only when ``owned(path)`` says calibkit wrote it."""
    check_not_input(path, inputs, option=option, inside_ok=True)
    check_writable(path, option=option, is_file=True)
    p = Path(path)
    if owned is not None and os.path.lexists(p) and not (p.is_file() and not p.is_symlink() and owned(p)):
        raise UsageError(f"{option} {p} exists and was not written by calibkit; it will not be overwritten",
                         hint=f"pass a new file name to {option}, or move the file away first")


def default_report_dir(name: str, *, parent: Path = Path("reports")) -> Path:
    """A report folder the command line picks when none is given: ``PARENT/<YYYYmmdd-HHMMSS>-NAME``, with ``-2``,
    ``-3``… when that name is taken, claimed (:func:`claim_output`) before it is returned. Two runs started in the
    same second used to pick the same folder, and the second stopped with "being written by another run"."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    for k in range(1, 1000):
        folder = parent / (f"{stamp}-{name}" + (f"-{k}" if k > 1 else ""))
        if folder.exists() or lock_path(folder).exists():
            continue
        try:
            claim_output(folder, option="--report")
        except UsageError:  # another run claimed it between our look and our claim
            continue
        return folder
    raise UsageError(f"cannot find a free report folder name under {parent}", hint="pass --report")



def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def clean_stale_tmp(target: Path) -> list[Path]:
    """Remove ``.TARGET.*.tmp`` folders that calibkit made (marker inside) and whose writer process is gone."""
    removed: list[Path] = []
    with contextlib.suppress(OSError):
        for cand in target.parent.glob(f".{glob.escape(target.name)}.*.tmp"):
            if not cand.is_dir() or cand.is_symlink():
                continue
            rec = read_marker(cand)
            if rec is None or rec.get("host") != socket.gethostname():
                continue
            pid = rec.get("pid")
            if isinstance(pid, int) and not _pid_alive(pid):
                shutil.rmtree(cand, ignore_errors=True)
                removed.append(cand)
    return removed


def umask() -> int:
    """The process umask, read without changing it where the platform allows (Linux ``/proc``)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def work_folder(path: str | os.PathLike[str]) -> Path:
    """Make (or keep) a run's work folder, such as tune's ``.OUT.tune`` beside its output, and return it. It is
    made as a plain folder; what stands at ``path`` already must be one: a symbolic link (to a folder or not)
    would have the run write through it into another folder, and a file or special file is no folder, so both
    are refused with a :class:`~calibkit.errors.UsageError` naming what is there (``lstat``: never followed)."""

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(p, 0o777)
    st = os.lstat(p)
    if _stat.S_ISDIR(st.st_mode):
        return p
    what = ("a symbolic link" + (f" to {os.readlink(p)}" if _stat.S_ISLNK(st.st_mode) else "")
            if _stat.S_ISLNK(st.st_mode) else "a FIFO" if _stat.S_ISFIFO(st.st_mode) else "a file, not a folder")
    raise UsageError(f"the work folder {p} is {what}; calibkit writes its work there only into a folder it makes",
                     hint=f"remove or rename {p} (calibkit did not make it), then run again")
