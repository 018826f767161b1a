"""Module-level work units for the executor tests (worker processes import them by name)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from calibkit.executors import fetch


def scaled_len(item: tuple[int, object]) -> tuple[int, int, int]:
    """(a * len(shared), pid, id of the shared value in this process)."""
    a, ref = item
    value = fetch(ref)
    return a * len(value), os.getpid(), id(value)


def die_once(item: tuple[int, str]) -> int:
    """Kills its worker process the first time it runs (a marker file remembers), then returns its input."""
    value, marker = item
    if value == 3 and not Path(marker).exists():
        Path(marker).write_text("died")
        os._exit(1)
    return value


def slow(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()
