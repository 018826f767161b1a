"""Module-level work units for the executor tests (worker processes import them by name)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from calibkit.executors import fetch, materialize


def scaled_len(item: tuple[int, object]) -> tuple[int, int, int]:
    """(a * len(shared), pid, id of the shared value in this process)."""
    a, ref = item
    value = fetch(ref)
    return a * len(value), os.getpid(), id(value)


def die_once(item: tuple[int, str, object]) -> int:
    """Unit 3 kills its worker process the first time it runs (a marker file remembers); each returns its input
    plus the length of a shared value (None: 0)."""
    value, marker, ref = item
    extra = len(fetch(ref)) if ref is not None else 0
    if value == 3 and not Path(marker).exists():
        Path(marker).write_text("died")
        os._exit(1)
    return value + extra


def slow(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def materialized(item: tuple[float, object]) -> tuple[int, str]:
    """(pid, the folder this process materializes shared files in), after a pause so every worker gets one."""
    pause, ref = item
    path = materialize(ref)
    time.sleep(pause)
    return os.getpid(), str(path.parent)
