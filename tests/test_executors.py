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
from executor_units import die_once, scaled_len

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


def test_process_pool_worker_death_loses_only_its_unit(tmp_path):
    marker = tmp_path / "died"
    with ProcessPoolExecutor(2) as ex:
        assert ex.map(die_once, [(i, str(marker)) for i in range(6)]) == list(range(6))
    assert marker.exists()


def test_pool_workers_exit_when_the_parent_is_killed(tmp_path):
    script = (
        f"import sys; sys.path.insert(0, {TESTS!r})\n"
        "from executor_units import slow\n"
        "from calibkit.executors.pool import ProcessPoolExecutor\n"
        "if __name__ == '__main__':\n"
        "    ex = ProcessPoolExecutor(2)\n"
        "    print(sorted(set(ex.map(slow, [0.2, 0.2, 0.2, 0.2]))), flush=True)\n"
        "    ex.map(slow, [600, 600])\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        line = parent.stdout.readline()  # type: ignore[union-attr]
        pids = [int(p) for p in line.strip().strip("[]").split(",")]
        assert len(pids) >= 1 and all(psutil.pid_exists(p) for p in pids)
        time.sleep(0.5)  # both workers are now sleeping in their 600 s units
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 20
        alive = pids
        while alive and time.monotonic() < deadline:
            alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
            time.sleep(0.1)
        assert alive == [], f"orphaned workers still running: {alive}"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        parent.stdout.close()  # type: ignore[union-attr]


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
