"""The executor seam: results in order, shared values loaded once per worker process, a dying worker loses only
its unit, workers exit with their parent, clear errors for bad specs and unreachable schedulers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from executor_units import die_once, materialized, scaled_len, slow

from calibkit.errors import BackendError, UsageError
from calibkit.executors import InProcessExecutor, from_spec
from calibkit.executors.pool import ProcessPoolExecutor

TESTS = str(Path(__file__).parent)


def _check_shared_once(ex) -> None:  # noqa: ANN001
    ref = ex.share(b"x" * 1000)
    assert ex.share(b"x" * 1000) == ref  # same content: shared once
    seen: list[int] = []
    out = ex.map(scaled_len, [(i, ref) for i in range(12)], on_result=lambda i, r: seen.append(i))
    assert [r[0] for r in out] == [1000 * i for i in range(12)]
    assert sorted(seen) == list(range(12))
    ids_per_pid: dict[int, set[int]] = {}
    for _, pid, ident in out:
        ids_per_pid.setdefault(pid, set()).add(ident)
    assert all(len(v) == 1 for v in ids_per_pid.values())  # one copy per process, not one per task
    return None


def test_inline_executor_runs_in_this_process():
    with InProcessExecutor() as ex:
        _check_shared_once(ex)
        assert {r[1] for r in ex.map(scaled_len, [(1, ex.share(b"ab"))])} == {os.getpid()}


def test_process_pool_results_in_order_and_shared_once_per_worker():
    with ProcessPoolExecutor(2) as ex:
        _check_shared_once(ex)


def test_pool_workers_remove_their_materialized_files_when_they_exit():
    with ProcessPoolExecutor(2) as ex:
        ref = ex.share(b"model bytes")
        out = ex.map(materialized, [(0.3, ref)] * 4)
        dirs = {d for _, d in out}
        assert all(Path(d).is_dir() for d in dirs)
    assert not any(Path(d).exists() for d in dirs)


def test_folders_of_killed_processes_are_swept(tmp_path, monkeypatch):
    import tempfile

    from calibkit.executors.base import sweep_stale

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f"calibkit-worker-{int(dead.stdout)}-ab"
    live = tmp_path / f"calibkit-worker-{os.getpid()}-cd"
    other = tmp_path / "calibkit-worker-notes"
    young = tmp_path / f"calibkit-worker-{int(dead.stdout)}-young"  # unlocked and just made: maybe being locked
    for d in (stale, live, other, young):
        d.mkdir()
    old = time.time() - 3600
    os.utime(stale, (old, old))
    sweep_stale("calibkit-worker-")
    assert not stale.exists() and live.is_dir() and other.is_dir() and young.is_dir()


def test_sweep_trusts_the_owners_lock_over_its_pid(tmp_path, monkeypatch):
    """A folder named after a PID this process cannot see (another PID namespace sharing /tmp) stays while its
    owner holds the lock, and goes once the owner is gone, however young."""
    import tempfile

    from calibkit.executors.base import sweep_stale

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    held = tmp_path / f"calibkit-worker-{int(dead.stdout)}-ef"
    held.mkdir()
    code = ("import sys; from calibkit._io import mark_alive; mark_alive(sys.argv[1]); print('ok', flush=True); "
            "sys.stdin.read()")
    owner = subprocess.Popen([sys.executable, "-c", code, str(held)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "ok"
        sweep_stale("calibkit-worker-")
        assert held.is_dir()
    finally:
        assert owner.stdin is not None
        owner.stdin.close()
        owner.wait(timeout=30)
        owner.stdout.close()
    sweep_stale("calibkit-worker-")
    assert not held.exists()


def test_a_sweep_between_the_lock_file_and_its_lock_spares_a_live_folder(tmp_path, monkeypatch):
    """A worker's scratch folder vanished mid-run: another process swept it while its owner had created
    ``.calibkit-alive`` but not yet locked it, so the file read as a dead owner's. Here that sweep runs exactly
    there (the first flock, the owner's), from "another PID namespace" (the owner's PID looks dead)."""
    import fcntl
    import tempfile

    from calibkit._io import owner_alive
    from calibkit.executors import base

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(base, "_tmp", None)
    real = fcntl.flock
    swept: list[int] = []

    def other_namespace(pid: int, sig: int) -> None:
        raise ProcessLookupError(pid)

    def flock(fd: int, op: int) -> None:
        if not swept:
            swept.append(fd)
            with monkeypatch.context() as m:
                m.setattr(os, "kill", other_namespace)
                base.sweep_stale("calibkit-worker-")
        real(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    try:
        folder = base._scratch()
    finally:
        monkeypatch.setattr(fcntl, "flock", real)
    assert swept, "the owner never took its lock"
    assert folder.is_dir(), "a live process's scratch folder was swept"
    assert owner_alive(folder) is True
    with monkeypatch.context() as m:  # and it stays, as seen from anywhere, while its owner lives
        m.setattr(os, "kill", other_namespace)
        base.sweep_stale("calibkit-worker-")
    assert folder.is_dir()
    base.remove_scratch()


def test_a_folder_its_owner_removes_during_the_sweep_is_skipped(tmp_path, monkeypatch):
    """Another process's sweep must not fail because a folder it saw was removed by its leaving owner before
    the sweep read its age (it raised FileNotFoundError out of the worker's first shared-file read)."""
    import tempfile

    from calibkit.executors import base

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    leaving = tmp_path / "calibkit-worker-999999-zz"
    leaving.mkdir()

    def owner_leaves(folder):  # the owner removes its folder right after the sweep listed it
        leaving.rmdir()
        return None

    def other_namespace(pid: int, sig: int) -> None:
        raise ProcessLookupError(pid)

    monkeypatch.setattr(base, "owner_alive", owner_leaves)
    monkeypatch.setattr(os, "kill", other_namespace)
    base.sweep_stale("calibkit-worker-")
    assert not leaving.exists()


def test_process_pool_worker_death_loses_only_its_unit(tmp_path):
    marker = tmp_path / "died"
    with ProcessPoolExecutor(2) as ex:
        ref = ex.share(b"abc")
        assert ex.map(die_once, [(i, str(marker), ref) for i in range(6)]) == [i + 3 for i in range(6)]
    assert marker.exists()


def test_pool_workers_exit_when_the_parent_is_killed(tmp_path):
    script = (
        f"import sys; sys.path.insert(0, {TESTS!r})\n"
        "from executor_units import materialized, slow\n"
        "from calibkit.executors.pool import ProcessPoolExecutor\n"
        "if __name__ == '__main__':\n"
        "    ex = ProcessPoolExecutor(2)\n"
        "    ref = ex.share(b'model bytes')\n"
        "    print(';'.join(sorted({f'{p},{d}' for p, d in ex.map(materialized, [(0.3, ref)] * 4)})), flush=True)\n"
        "    ex.map(slow, [600, 600])\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        line = parent.stdout.readline()  # type: ignore[union-attr]
        pairs = [item.split(",", 1) for item in line.strip().split(";")]
        pids, dirs = [int(p) for p, _ in pairs], [Path(d) for _, d in pairs]
        assert len(pids) >= 1 and all(psutil.pid_exists(p) for p in pids) and all(d.is_dir() for d in dirs)
        time.sleep(0.5)  # both workers are now sleeping in their 600 s units
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 20
        alive = pids
        while alive and time.monotonic() < deadline:
            alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
            time.sleep(0.1)
        assert alive == [], f"orphaned workers still running: {alive}"
        assert not any(d.exists() for d in dirs)  # the leaving workers removed their materialized files
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        parent.stdout.close()  # type: ignore[union-attr]


def test_interrupted_pool_map_stops_its_workers():
    ex = ProcessPoolExecutor(2)
    pids = set(ex.map(slow, [0.3, 0.3, 0.3, 0.3]))

    def interrupt(i, r):  # noqa: ANN001
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ex.map(slow, [0.1, 600, 600], on_result=interrupt)
    deadline = time.monotonic() + 20
    while any(psutil.pid_exists(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(psutil.pid_exists(p) for p in pids)
    ex.close()


def test_ctrl_c_to_the_process_group_leaves_the_workers_to_the_parent():
    """A terminal's Ctrl-C reaches every worker too: they ignore it (no traceback of theirs); the parent decides."""
    with ProcessPoolExecutor(2) as ex:
        pids = set(ex.map(slow, [0.3, 0.3, 0.3, 0.3]))
        for p in pids:
            os.kill(p, signal.SIGINT)
        time.sleep(0.3)
        assert all(psutil.pid_exists(p) for p in pids)
        assert set(ex.map(slow, [0.2, 0.2, 0.2, 0.2])) <= pids, "the same workers carry on"


def test_specs_are_parsed_and_bad_ones_rejected():
    assert isinstance(from_spec("inline"), InProcessExecutor)
    assert isinstance(from_spec("local:1"), InProcessExecutor)
    with from_spec("local:3") as ex:
        assert isinstance(ex, ProcessPoolExecutor) and ex.workers == 3
    with from_spec(None, workers=2) as ex:
        assert ex.workers == 2
    for bad in ("ray://h:1", "local:x", "local:0", "dask://hostonly", "dask-local:"):
        with pytest.raises(UsageError) as info:
            from_spec(bad)
        assert info.value.hint


def test_unreachable_dask_scheduler_is_a_backend_error(monkeypatch):
    pytest.importorskip("distributed")
    import calibkit.executors.dask as dx

    monkeypatch.setattr(dx, "CONNECT_TIMEOUT_S", 1)
    with pytest.raises(BackendError) as info:
        from_spec("dask://127.0.0.1:9")  # the discard port: nothing listens
    assert "127.0.0.1:9" in str(info.value) and "dask scheduler" in (info.value.hint or "")


def test_a_cgroup_cpu_quota_caps_the_usable_cpus(tmp_path, monkeypatch):
    """A container limited to 1.5 CPUs (cgroup v2 cpu.max, or v1's quota and period) on a larger host uses 2
    workers, not one per core of the host; no quota, or an unreadable one, leaves the affinity count."""
    import os

    from calibkit import cpus

    v2, v1, none = tmp_path / "v2", tmp_path / "v1", tmp_path / "none"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")
    (v1 / "cpu,cpuacct").mkdir(parents=True)
    (v1 / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("250000\n")
    (v1 / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    (none / "cpu").mkdir(parents=True)
    (none / "cpu.max").write_text("max 100000\n")
    (none / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpus.cgroup_cpu_quota(v2) == 1.5 and cpus.cgroup_cpu_quota(v1) == 2.5
    assert cpus.cgroup_cpu_quota(none) is None and cpus.cgroup_cpu_quota(tmp_path / "missing") is None
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(cpus.cgroup_cpu_quota, "__defaults__", (v2,))
    assert cpus.usable_cpus() == 2
    monkeypatch.setattr(cpus.cgroup_cpu_quota, "__defaults__", (none,))
    assert cpus.usable_cpus() == 64
