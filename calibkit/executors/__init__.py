"""Where work units run: in this process, in a local process pool (the default), or on a Dask cluster.

Chosen at the edge (the CLI's ``--executor``) and passed down; library code only sees :class:`Executor`.
"""

from __future__ import annotations

from calibkit.cpus import usable_cpus
from calibkit.errors import UsageError
from calibkit.executors.base import Executor, InProcessExecutor, Shared, fetch, materialize

__all__ = ["Executor", "InProcessExecutor", "Shared", "fetch", "materialize", "from_spec", "default_workers",
           "EXECUTOR_HELP"]

EXECUTOR_HELP = (
    "Where work units run: local (process pool of --workers processes, the default), local:N, inline "
    "(this process), dask://HOST:PORT (an existing Dask scheduler; needs calibkit[distributed]) or "
    "dask-local:N (a Dask cluster of N single-threaded worker processes on this machine)."
)


def default_workers() -> int:
    """One worker process per usable CPU: evaluations are split by texts into many small units (one ONNX
    Runtime session per worker serves every variant, evaluate.switchboard), so processes, not intra-op
    threads, are what keeps every core busy."""
    return usable_cpus()


def from_spec(spec: str | None, workers: int | None = None) -> Executor:
    """The executor an ``--executor`` value names (None or "local": a process pool of ``workers``)."""
    from calibkit.executors.pool import ProcessPoolExecutor

    s = (spec or "local").strip()
    if s == "inline":
        return InProcessExecutor()
    if s == "local" or s.startswith("local:"):
        n = _count(s[6:], s) if s.startswith("local:") else (workers or default_workers())
        return InProcessExecutor() if n <= 1 else ProcessPoolExecutor(n)
    if s.startswith("dask-local:"):
        from calibkit.executors.dask import DaskExecutor

        return DaskExecutor(local_workers=_count(s[len("dask-local:"):], s))
    if s.startswith("dask://"):
        from calibkit.executors.dask import DaskExecutor

        hostport = s[len("dask://"):]
        if ":" not in hostport or not hostport.rsplit(":", 1)[1].isdigit():
            raise UsageError(f"--executor {s!r} needs a port", hint="e.g. --executor dask://10.0.0.5:8786")
        return DaskExecutor(f"tcp://{hostport}")
    raise UsageError(f"unknown --executor {s!r}",
                     hint="use local, local:N, inline, dask://HOST:PORT or dask-local:N")


def _count(text: str, spec: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"--executor {spec!r}: the worker count must be a positive integer", hint="e.g. local:4")
    return int(text)
