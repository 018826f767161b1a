"""Statistics are collected once per (model, calibration set, its encoding, tapped tensors, bins) and reused.

Layout: ``$CALIBKIT_CACHE/stats/`` (default ``~/.cache/calibkit/stats/``), one folder per (model sha256,
set key, num_bins, collector version) and one ``.npz`` per tensor list. The set key (:func:`set_key`) is the
calibration-set id together with how its texts become tokens: the tokenizer's files and the truncation length,
so another ``model_max_length`` or vocabulary never reuses statistics of other token sequences. A saved store
whose tensors are a superset of the requested ones is reused too (e.g. after adding an ``--exclude``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import stat
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from calibkit._io import file_kind
from calibkit.calibrate.stats import StatsStore, read_header, verify_store
from calibkit.consistency import TOKENIZER_FILES
from calibkit.errors import CalibrationError

log = logging.getLogger("calibkit.calibrate")

COLLECTOR_VERSION = 1  # bump when what the collector observes changes (e.g. padding masking)


def cache_root() -> Path:
    env = os.environ.get("CALIBKIT_CACHE")
    base = Path(env) if env else Path.home() / ".cache" / "calibkit"
    return base / "stats"


def _digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode("utf-8")).hexdigest()[:24]


def encoding_digest(tokenizer_path: Path, max_length: int) -> str:
    """Digest of how texts are encoded: the truncation length and every tokenizer file's bytes."""
    h = hashlib.sha256(f"max_length={max_length}\n".encode())
    folder = tokenizer_path if tokenizer_path.is_dir() else tokenizer_path.parent
    for f in sorted(folder.iterdir()) if folder.is_dir() else ():
        if f.is_file() and TOKENIZER_FILES.fullmatch(f.name):
            h.update(f.name.encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:16]


def set_key(calibration_set_id: str, tokenizer_path: Path, max_length: int) -> str:
    """The cache's name for a calibration set as the model sees it (its id plus its encoding)."""
    return f"{calibration_set_id}+enc:{encoding_digest(tokenizer_path, max_length)}"


def stats_key_dir(model_sha256: str, stats_set_key: str, num_bins: int, root: Path | None = None) -> Path:
    key = _digest({"model": model_sha256, "set": stats_set_key, "bins": num_bins, "v": COLLECTOR_VERSION})
    return (root or cache_root()) / key


def stats_path(
    model_sha256: str, stats_set_key: str, tensors: Sequence[str], num_bins: int, root: Path | None = None
) -> Path:
    return stats_key_dir(model_sha256, stats_set_key, num_bins, root) / f"{_digest(sorted(tensors))}.npz"


_UNREADABLE = (CalibrationError, OSError, ValueError, KeyError, TypeError, IndexError, EOFError, RecursionError,
               zipfile.BadZipFile)
_ENTRY = re.compile(r"[0-9a-f]{24}\.npz")


def _drop(path: Path) -> None:
    """Remove a cache entry that failed: only a regular file named as calibkit names its entries (a link, a FIFO
    or anything else standing there is left alone: calibkit did not make it)."""
    if _ENTRY.fullmatch(path.name):
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(path).st_mode):
                path.unlink()


def _not_a_folder(folder: Path) -> str | None:
    """Why the cache's key folder cannot be used (a symbolic link, which calibkit never makes there, or not a
    folder), or None: it is a real folder or absent."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    return None if stat.S_ISDIR(st.st_mode) else "not a folder"


@contextlib.contextmanager
def open_entry(path: Path) -> Iterator[Any]:
    """A cache entry opened for reading, only as the regular file calibkit wrote: checked with ``lstat`` first,
    then opened with ``O_NOFOLLOW | O_NONBLOCK`` (a link swapped in meanwhile fails, a FIFO never blocks) and
    checked again on the open file. Anything else raises :class:`SpecialEntry` naming what stands there."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise SpecialEntry(file_kind(st.st_mode))
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SpecialEntry("a symbolic link") from None
        raise
    with os.fdopen(fd, "rb") as fh:
        now = os.fstat(fh.fileno())
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise SpecialEntry(file_kind(now.st_mode) if not stat.S_ISREG(now.st_mode) else "replaced while opened")
        yield fh


class SpecialEntry(Exception):
    """What stands at a cache entry's path is not the regular file calibkit writes (never opened through)."""


def _read(path: Path, want: set[str] | None) -> StatsStore | None:
    """The store at ``path`` (None when ``want`` is given and the file does not cover it)."""
    with open_entry(path) as fh:
        if not zipfile.is_zipfile(fh):  # empty or truncated
            raise zipfile.BadZipFile("not a complete .npz (zip) file")
        fh.seek(0)
        with np.load(fh, allow_pickle=False) as z:
            if want is not None and not want <= set(read_header(z, path)["tensors"]):
                return None
            return StatsStore.from_npz(z, path)


def find_stats(
    model_sha256: str, stats_set_key: str, tensors: Sequence[str], num_bins: int, root: Path | None = None
) -> tuple[StatsStore, Path] | None:
    """A saved store covering ``tensors`` (restricted to them), or None. Every entry is verified before it is
    used (:func:`~calibkit.calibrate.stats.verify_store`, its tensors, model and set); one that fails is a miss,
    logged with what failed, and is removed when it is a regular file calibkit named; a link, FIFO or other
    special file at an entry's name is never opened, and a key folder that is a link is never entered."""
    exact = stats_path(model_sha256, stats_set_key, tensors, num_bins, root)
    folder = exact.parent
    why = _not_a_folder(folder)
    if why is not None:
        log.warning("statistics cache folder %s is %s; not used (calibkit makes it as a plain folder): "
                    "collecting the statistics again", folder, why)
        return None
    if not folder.is_dir():
        return None
    want = set(tensors)
    candidates = [exact] if os.path.lexists(exact) else []
    candidates += sorted(p for p in folder.iterdir() if p != exact and _ENTRY.fullmatch(p.name))
    for path in candidates:
        try:
            store = _read(path, None if path == exact else want)
        except SpecialEntry as exc:
            log.warning("statistics cache %s is %s, not a file calibkit wrote; not read", path, exc)
            continue
        except _UNREADABLE as exc:
            # truncated (BadZipFile), empty (EOFError: click would print only "Aborted."), or garbage: a miss.
            # The file is calibkit's own cache entry, so it is removed; the statistics are collected again.
            log.warning("statistics cache %s is unreadable (%s: %s); collecting the statistics again",
                        path, type(exc).__name__, exc)
            _drop(path)
            continue
        if store is None:
            continue
        if store.meta.get("model_sha256") != model_sha256 or store.meta.get("stats_set_key") != stats_set_key:
            if path == exact:  # an entry of another model or set under this one's name (copied in)
                log.warning("statistics cache %s holds the statistics of another model or calibration set; "
                            "collecting the statistics again", path)
                _drop(path)
            continue
        if not want <= set(store):
            if path == exact:
                log.warning("statistics cache %s failed verification (it lacks %d of the tensors asked, e.g. %r); "
                            "collecting the statistics again", path, len(want - set(store)),
                            sorted(want - set(store))[0])
                _drop(path)
            continue
        problems = verify_store(store, num_bins=num_bins)
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            log.warning("statistics cache %s failed verification (%s%s); collecting the statistics again",
                        path, "; ".join(problems[:3]), more)
            _drop(path)
            continue
        return store.subset(list(tensors)), path
    return None


def save_stats(store: StatsStore, tensors: Sequence[str], root: Path | None = None) -> Path | None:
    """Save into the cache; a cache that cannot be written only costs a re-run later (logged)."""
    path = stats_path(
        str(store.meta.get("model_sha256", "")), str(store.meta.get("stats_set_key", "")), tensors,
        store.num_bins, root,
    )
    why = _not_a_folder(path.parent)
    if why is not None:
        log.warning("statistics cache folder %s is %s; the statistics are not saved there", path.parent, why)
        return None
    try:
        return store.save(path)
    except OSError as exc:
        log.warning("could not save statistics to the cache %s: %s", path, exc)
        return None
