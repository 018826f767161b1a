"""The local process pool (the default): spawned worker processes that exit when their parent dies.

Spawn, not fork: ONNX Runtime's thread pools do not survive a fork. Each worker starts a watcher thread on its
parent's process sentinel and leaves with ``os._exit`` as soon as the parent is gone (a ``kill -9`` of
``calibkit`` included), so no orphaned worker keeps a core busy. Shared values are pickled once into a
driver-owned temporary folder and read by each worker once.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import tempfile
import threading
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from calibkit._io import mark_alive
from calibkit.errors import BackendError, UsageError
from calibkit.executors.base import (
    Executor,
    Shared,
    Spilled,
    check_spawn_safe,
    remove_scratch,
    run_unit,
    sweep_stale,
)
from calibkit.progress import ProgressEvent, no_progress

log = logging.getLogger("calibkit.executors")


def _watch_parent() -> None:
    # Ctrl-C reaches the whole process group: the parent cancels the work and stops the pool, so a worker
    # ignores it instead of dying with a KeyboardInterrupt traceback of its own
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def wait() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        remove_scratch()
        os._exit(1)

    threading.Thread(target=wait, name="calibkit-parent-watch", daemon=True).start()


class ProcessPoolExecutor(Executor):
    """``workers`` spawned processes on this machine. A worker that dies (killed, out of memory) breaks the
    pool; the pool is started again and the unfinished units resubmitted, at most ``retries`` times."""

    def __init__(self, workers: int, *, retries: int = 2) -> None:
        super().__init__()
        if workers < 1:
            raise UsageError(f"a process pool needs at least one worker, got {workers}")
        self._workers = workers
        self.retries = retries
        self.name = f"local:{workers}"
        self._pool: cf.ProcessPoolExecutor | None = None
        self._dir: Path | None = None
        self._sources: dict[str, Spilled] = {}

    @property
    def workers(self) -> int:
        return self._workers

    def _publish(self, ref: Shared[Any], value: object, data: bytes) -> None:
        if self._dir is None:
            sweep_stale("calibkit-shared-")
            self._dir = Path(tempfile.mkdtemp(prefix=f"calibkit-shared-{os.getpid()}-"))
            mark_alive(self._dir)
        path = self._dir / ref.key
        with open(path, "wb") as fh:
            pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
        self._sources[ref.key] = Spilled(str(path))

    def _ensure_pool(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            check_spawn_safe()
            ctx = multiprocessing.get_context("spawn")
            self._pool = cf.ProcessPoolExecutor(max_workers=self._workers, mp_context=ctx,
                                                initializer=_watch_parent)
        return self._pool

    def map(self, fn, items, *, task="work", progress=None, on_result=None):  # type: ignore[no-untyped-def]
        cb = progress or no_progress
        results: list[Any] = [None] * len(items)
        todo = list(range(len(items)))
        done = 0
        cb(ProgressEvent(task, 0, len(items)))
        attempts = 0
        while todo:
            pool = self._ensure_pool()
            futures = {pool.submit(run_unit, fn, items[i], dict(self._sources)): i for i in todo}
            try:
                for fut in cf.as_completed(futures):
                    i = futures[fut]
                    try:
                        r = fut.result()
                    except BrokenProcessPool:
                        continue
                    results[i] = r
                    todo.remove(i)
                    done += 1
                    if on_result is not None:
                        on_result(i, r)
                    cb(ProgressEvent(task, done, len(items)))
            except BaseException:
                self._kill()
                raise
            if todo:
                attempts += 1
                self._kill()
                if attempts > self.retries:
                    raise BackendError(
                        f"a worker process died {attempts} times; {len(todo)} of {len(items)} {task} units "
                        "did not finish",
                        hint="a unit may need more memory than a worker has: use fewer --workers",
                    )
                log.warning("a worker process died; restarting the pool and resubmitting %d units", len(todo))
        return results

    def _kill(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        procs = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self._sources.clear()
        super().close()
