"""Shared fixtures. ``demo_assets_fast``: the fast demo assets, prepared once and reused across test runs."""

from __future__ import annotations

from pathlib import Path

import pytest

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
FAST_ASSETS = REPO_ROOT / ".cache" / "test-assets" / "fast"


@pytest.fixture(scope="session")
def demo_assets_fast() -> Path:
    """The folder of ``calibkit demo prepare --fast`` (model/, data/, logs.jsonl). Mark users ``slow``.

    Prepared into ``.cache/test-assets/fast`` under the repository and reused while its prepare.json says it is
    complete and its files are unchanged (the first run takes 1-2 minutes).
    """
    from calibkit.demo.prepare import PrepareOptions, is_complete, prepare_demo

    options = PrepareOptions(fast=True)
    if not is_complete(FAST_ASSETS, options):
        prepare_demo(FAST_ASSETS, options)
    return FAST_ASSETS


@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Tiny random-initialised transformers exported the usual ways (tests/zoo.py), built once per session."""
    pytest.importorskip("torch")
    from zoo import build_zoo

    return build_zoo(tmp_path_factory.mktemp("zoo"))
