"""Shared fixtures. ``demo_assets_fast``: the fast demo assets, prepared once and reused across test runs."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
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
