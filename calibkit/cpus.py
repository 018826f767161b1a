"""How many CPUs this process may use: its affinity mask (a container's, cgroup cpuset's or ``taskset``'s
share), not the host's count that ``os.cpu_count()`` gives."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)
