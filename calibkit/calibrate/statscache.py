"""Statistics are collected once per (model, calibration set, its encoding, tapped tensors, bins) and reused.

Layout: ``$CALIBKIT_CACHE/stats/`` (default ``~/.cache/calibkit/stats/``), one folder per (model sha256,
set key, num_bins, collector version) and one ``.npz`` per tensor list. The set key (:func:`set_key`) is the
calibration-set id together with how its texts become tokens: the tokenizer's files and the truncation length,
so another ``model_max_length`` or vocabulary never reuses statistics of other token sequences. A saved store
whose tensors are a superset of the requested ones is reused too (e.g. after adding an ``--exclude``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from calibkit.calibrate.stats import StatsStore
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


def _tensors_of(path: Path) -> set[str]:
    with np.load(path, allow_pickle=False) as z:
        return set(json.loads(bytes(z["header"]).decode("utf-8"))["tensors"])


_UNREADABLE = (CalibrationError, OSError, ValueError, KeyError, TypeError, IndexError, EOFError, RecursionError,
               zipfile.BadZipFile)
_ENTRY = re.compile(r"[0-9a-f]{24}\.npz")


def _drop(path: Path) -> None:
    if _ENTRY.fullmatch(path.name):  # only a file named as calibkit names its cache entries
        with contextlib.suppress(OSError):
            path.unlink()


def find_stats(
    model_sha256: str, stats_set_key: str, tensors: Sequence[str], num_bins: int, root: Path | None = None
) -> tuple[StatsStore, Path] | None:
    """A saved store covering ``tensors`` (restricted to them), or None."""
    exact = stats_path(model_sha256, stats_set_key, tensors, num_bins, root)
    folder = exact.parent
    if not folder.is_dir():
        return None
    want = set(tensors)
    candidates = [exact] if exact.is_file() else []
    candidates += sorted(p for p in folder.glob("*.npz") if p != exact)
    for path in candidates:
        try:
            if not zipfile.is_zipfile(path):  # empty or truncated: np.load would leak its file handle
                raise zipfile.BadZipFile("not a complete .npz (zip) file")
            if path != exact and not want <= _tensors_of(path):
                continue
            store = StatsStore.load(path)
        except _UNREADABLE as exc:
            # truncated (BadZipFile), empty (EOFError: click would print only "Aborted."), or garbage: a miss.
            # The file is calibkit's own cache entry, so it is removed; the statistics are collected again.
            log.warning("statistics cache %s is unreadable (%s: %s); collecting the statistics again",
                        path, type(exc).__name__, exc)
            _drop(path)
            continue
        if store.meta.get("model_sha256") != model_sha256 or store.meta.get("stats_set_key") != stats_set_key:
            continue
        if want <= set(store):
            return store.subset(list(tensors)), path
    return None


def save_stats(store: StatsStore, tensors: Sequence[str], root: Path | None = None) -> Path | None:
    """Save into the cache; a cache that cannot be written only costs a re-run later (logged)."""
    path = stats_path(
        str(store.meta.get("model_sha256", "")), str(store.meta.get("stats_set_key", "")), tensors,
        store.num_bins, root,
    )
    try:
        return store.save(path)
    except OSError as exc:
        log.warning("could not save statistics to the cache %s: %s", path, exc)
        return None
