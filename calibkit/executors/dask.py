"""Dask distributed: work units on an existing cluster (``dask://HOST:PORT``) or a local one (``dask-local:N``).

Imported only when chosen (``calibkit/_deps.py``; extra ``distributed``). Shared values are scattered once with
``broadcast=True`` (every worker holds one copy in memory; tasks that name them read that copy, nothing is sent
per task). A task whose worker dies is rescheduled by the scheduler; one that raises is retried ``retries``
times. An interrupted driver cancels its futures, so the cluster is left with no orphaned tasks.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from calibkit import _deps
from calibkit.errors import BackendError, UsageError
from calibkit.executors.base import Executor, Shared, run_unit
from calibkit.progress import ProgressEvent, no_progress

if TYPE_CHECKING:  # pragma: no cover - types only
    import distributed

log = logging.getLogger("calibkit.executors")

CONNECT_TIMEOUT_S = 10


class DaskExecutor(Executor):
    """Runs work units on a Dask cluster. ``address``: ``tcp://HOST:PORT`` of a running scheduler, or None with
    ``local_workers=N`` to start a LocalCluster of N worker processes with one thread each (closed with the
    executor)."""

    def __init__(self, address: str | None = None, *, local_workers: int | None = None, retries: int = 2,
                 threads: int = 1) -> None:
        super().__init__()
        distributed = _deps.require("distributed")
        self.retries = retries
        self._threads = threads
        self._cluster: Any = None
        self._futures: dict[str, Any] = {}
        self._values: dict[str, Any] = {}
        if address is None:
            if not local_workers or local_workers < 1:
                raise UsageError("dask-local needs a worker count, e.g. --executor dask-local:4")
            self.name = f"dask-local:{local_workers}"
            self._cluster = distributed.LocalCluster(
                n_workers=local_workers, threads_per_worker=1, processes=True, dashboard_address=None,
                silence_logs=logging.WARNING,
            )
            self._client = distributed.Client(self._cluster)
            self._client.wait_for_workers(local_workers)
        else:
            self.name = f"dask {address}"
            try:
                self._client = distributed.Client(address, timeout=CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError, ValueError) as exc:
                raise BackendError(
                    f"cannot reach the Dask scheduler at {address} ({type(exc).__name__}: {exc})",
                    hint="start one with `dask scheduler` (and `dask worker ADDRESS` on each machine), check the "
                         "host and port, or use --executor dask-local:N for a cluster on this machine",
                ) from None
            if not self._client.nthreads():
                self._client.close()
                raise BackendError(f"the Dask scheduler at {address} has no workers",
                                   hint="start workers with `dask worker tcp://HOST:PORT --nthreads 1`")

    @property
    def client(self) -> distributed.Client:
        return self._client

    @property
    def workers(self) -> int:
        return max(1, sum(self._client.nthreads().values()))

    @property
    def threads_per_task(self) -> int:
        return self._threads

    @property
    def task_threads(self) -> int | None:
        return self._threads

    def _publish(self, ref: Shared[Any], value: object, data: bytes) -> None:
        self._values[ref.key] = value  # kept here too: a copy lost with its workers is scattered again
        (fut,) = self._client.scatter([value], broadcast=True, hash=False)
        self._futures[ref.key] = fut

    def _ensure_shared(self) -> None:
        """Every shared value alive and on every current worker (a restarted worker starts empty; a value whose
        last holder died is scattered again from this process)."""
        for key, fut in list(self._futures.items()):
            if fut.status != "finished":
                (self._futures[key],) = self._client.scatter([self._values[key]], broadcast=True, hash=False)
        if self._futures:
            self._client.replicate(list(self._futures.values()))

    def map(self, fn, items, *, task="work", progress=None, on_result=None):  # type: ignore[no-untyped-def]
        from concurrent.futures import CancelledError

        distributed = _deps.require("distributed")
        cb = progress or no_progress
        cb(ProgressEvent(task, 0, len(items)))
        results: list[Any] = [None] * len(items)
        todo = list(range(len(items)))
        done = 0
        attempts = 0
        while todo:
            self._ensure_shared()
            sources = dict(self._futures)
            futures = {self._client.submit(run_unit, fn, items[i], sources, pure=False, retries=self.retries): i
                       for i in todo}
            by_key = {f.key: i for f, i in futures.items()}
            lost: list[int] = []
            try:
                for fut in distributed.as_completed(list(futures)):
                    i = by_key[fut.key]
                    try:
                        r = fut.result()
                    except distributed.KilledWorker as exc:
                        raise BackendError(
                            f"a {task} unit killed every worker it ran on ({exc})",
                            hint="a unit may need more memory than a worker has; check the workers' logs",
                        ) from None
                    except CancelledError:  # its shared inputs died with their workers
                        lost.append(i)
                        continue
                    results[i] = r
                    done += 1
                    if on_result is not None:
                        on_result(i, r)
                    cb(ProgressEvent(task, done, len(items)))
            except BaseException:
                self._client.cancel(list(futures), force=True)
                raise
            todo = lost
            if todo:
                attempts += 1
                if attempts > self.retries:
                    raise BackendError(f"{len(todo)} {task} units lost their inputs with their workers "
                                       f"{attempts} times", hint="check the workers' logs (memory, restarts)")
                log.warning("%d units lost their shared inputs with a worker; sharing again and resubmitting",
                            len(todo))
        return results

    def close(self) -> None:
        futs = list(self._futures.values())
        self._futures.clear()
        self._values.clear()
        try:
            if futs:
                self._client.cancel(futs, force=True)
            self._client.close()
        finally:
            if self._cluster is not None:
                self._cluster.close()
                self._cluster = None
        super().close()
