"""Progress reporting without printing: library code calls a callback; the CLI renders it with rich."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

log = logging.getLogger("calibkit")


@dataclass(frozen=True)
class ProgressEvent:
    """``task`` advanced to ``done`` of ``total`` (``total`` is None when unknown)."""

    task: str
    done: int
    total: int | None = None
    message: str = ""


ProgressCallback = Callable[[ProgressEvent], None]

#: the task of an event whose message is a time estimate for the long part about to start: the CLI prints it as
#: a line of its own rather than a bar
ESTIMATE_TASK = "time estimate"


def no_progress(_: ProgressEvent) -> None:
    return None


def track(items: Iterable[T], task: str, total: int | None, progress: ProgressCallback | None) -> Iterator[T]:
    """Yield ``items`` and report each step to ``progress``."""
    cb = progress or no_progress
    cb(ProgressEvent(task, 0, total))
    done = 0
    for item in items:
        yield item
        done += 1
        cb(ProgressEvent(task, done, total))
