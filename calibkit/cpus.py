"""How many CPUs this process may use: its affinity mask (a container's, cgroup cpuset's or ``taskset``'s
share), capped by a cgroup CPU quota (a container started with ``--cpus 2`` or a Kubernetes CPU limit on a
larger host), not the host's count that ``os.cpu_count()`` gives. Without the cap, a pod limited to 2 CPUs on
a 64-core host started 64 worker processes that the quota then throttled."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cpus() -> int:
    try:
        cpus = max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = max(1, os.cpu_count() or 1)
    quota = cgroup_cpu_quota()
    return cpus if quota is None else max(1, min(cpus, math.ceil(quota)))


def cgroup_cpu_quota(root: Path = CGROUP_ROOT) -> float | None:
    """CPUs' worth of time the cgroup this process sees as its root may use per period (cgroup v2 ``cpu.max``,
    or v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``); None when there is no quota or it cannot be read."""
    try:
        fields = (root / "cpu.max").read_text().split()
        if len(fields) == 2 and fields[0] != "max":
            return _ratio(fields[0], fields[1])
        if fields:
            return None
    except (OSError, ValueError):
        pass
    for v1 in (root / "cpu", root / "cpu,cpuacct"):
        try:
            return _ratio((v1 / "cpu.cfs_quota_us").read_text(), (v1 / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
    return None


def _ratio(quota: str, period: str) -> float | None:
    q, p = int(quota.strip()), int(period.strip())
    return q / p if q > 0 and p > 0 else None
