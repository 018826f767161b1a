"""Shared fixtures. ``demo_assets_fast``: the fast demo assets, prepared once and reused across test runs;
``zoo``: the tiny transformers, built once per run. Both are built by one pytest-xdist worker while the others
wait on a file lock (``build_once``), then shared read-only: a test writes only under its own ``tmp_path``."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from filelock import FileLock

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parents[1]


def _hypothesis_profiles() -> None:
    """Budgets of the property-based tests (tests/test_safety_property.py), chosen with HYPOTHESIS_PROFILE:
    ``default`` (a few derandomized examples per test: the whole file well under a minute on 2 cores),
    ``ci`` (more, still derandomized) and ``slow`` (many, random, for a nightly or a hostile sweep)."""
    import os

    try:
        from hypothesis import HealthCheck, settings
    except ImportError:  # the dev extra is not installed: those tests are skipped by importorskip
        return
    common = dict(deadline=None, database=None, print_blob=True,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                         HealthCheck.data_too_large, HealthCheck.filter_too_much])
    settings.register_profile("default", max_examples=6, derandomize=True, **common)
    settings.register_profile("ci", max_examples=40, derandomize=True, **common)
    settings.register_profile("slow", max_examples=300, **common)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


_hypothesis_profiles()


def _one_share_of_the_cores_per_worker() -> None:
    """Under pytest-xdist each worker runs on its own share of the cores (gw0 the first, gw1 the next, ...).
    Unpinned, every worker's ONNX Runtime sessions took one thread per core of the machine and spun while idle,
    so two workers on two cores spent a good part of their CPU waiting on each other's threads. Pinned, calibkit
    sees the share as the machine (``calibkit.cpus.usable_cpus``), and child processes inherit it.
    ``CALIBKIT_TEST_PIN=0`` turns it off."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and count.isdigit()) or os.environ.get("CALIBKIT_TEST_PIN") == "0":
        return
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return
    share = len(cpus) // int(count)
    index = int(worker[2:])
    if share >= 1 and index < int(count):
        os.sched_setaffinity(0, cpus[index * share:(index + 1) * share])


_one_share_of_the_cores_per_worker()
FAST_ASSETS = REPO_ROOT / ".cache" / "test-assets" / "fast"


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of this run that every xdist worker sees: the run's base temporary folder (each worker's own
    base is a ``popen-gwN`` folder inside it); without xdist, the session's base."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def build_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], T]) -> T:
    """``build(folder)`` run once per test run, whichever worker asks first; the others wait on a file lock and
    get the same (pickled) value. What it builds is shared: tests must not write into ``folder``."""
    root = shared_root(tmp_path_factory)
    done = root / f"{name}.pickle"
    with FileLock(str(root / f"{name}.lock")):
        if done.is_file():
            return pickle.loads(done.read_bytes())
        value = build(root / name)
        done.write_bytes(pickle.dumps(value))
        return value


@pytest.fixture(scope="session")
def demo_assets_fast() -> Path:
    """The folder of ``calibkit demo prepare --fast`` (model/, data/, logs.jsonl). Mark users ``slow``.

    Prepared into ``.cache/test-assets/fast`` under the repository and reused while its prepare.json says it is
    complete and its files are unchanged (the first run takes 1-2 minutes); one xdist worker prepares it while
    the others wait on a lock beside it.
    """
    from calibkit.demo.prepare import PrepareOptions, is_complete, prepare_demo

    options = PrepareOptions(fast=True)
    FAST_ASSETS.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(FAST_ASSETS.parent / "fast.lock")):
        if not is_complete(FAST_ASSETS, options):
            prepare_demo(FAST_ASSETS, options)
    return FAST_ASSETS


@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Tiny random-initialised transformers exported the usual ways (tests/zoo.py), built once per run."""
    pytest.importorskip("torch")
    from zoo import build_zoo

    return build_once(tmp_path_factory, "zoo", lambda folder: build_zoo(folder))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files holding a ``longest`` test run first, then those holding a ``slow`` one, each group in its
    order: under xdist (``make test``: one file per worker at a time, ``--no-loadscope-reorder`` keeping this
    order) the longest files start at once on separate workers and the short ones fill in after, so the run
    ends soon after its longest file does. Tests keep their order inside a file."""
    def files(marker: str) -> list[Path]:
        return list(dict.fromkeys(item.path for item in items if item.get_closest_marker(marker) is not None))

    longest = files("longest")
    slow = [f for f in files("slow") if f not in longest]
    # The first longest file builds the fast demo assets, which the second waited 39 s for on a clean clone. xdist
    # gives each worker one file, then the next up front while the first has at most 2 tests left: so the
    # second worker starts on the file with the most slow tests that needs no assets, and takes the second
    # longest when that one is nearly done; the first worker's next is the second such file.
    waits = {item.path for item in items if "demo_assets_fast" in getattr(item, "fixturenames", ())}
    count = {f: sum(item.path == f and item.get_closest_marker("slow") is not None for item in items) for f in slow}
    free = sorted((f for f in slow if f not in waits), key=lambda f: -count[f])[:2]
    head = [longest[0], *free, *longest[1:]] if len(longest) > 1 and len(free) == 2 else longest
    order = {f: i for i, f in enumerate(dict.fromkeys([*head, *slow]))}
    items.sort(key=lambda item: order.get(item.path, len(order)))
