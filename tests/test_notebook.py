"""The walkthrough notebook runs top to bottom on the fast demo variant (nbclient, a real Jupyter kernel)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "walkthrough.ipynb"

# The walkthrough's evidence budgets, and the smaller ones this test runs it with: every cell and every call runs
# as written, on fewer texts and a shorter search (the notebook is the suite's second-longest test; at half its
# budgets it still took 9 of a loaded 2-core machine's 20 minutes). Each budget must be found as written, so a
# change to the notebook that this list no longer matches fails here instead of silently running the full budget.
BUDGETS = {"size=256": "size=64", "limit=300": "limit=100", "traffic_size=300": "traffic_size=100",
           "sensitivity_samples=64": "sensitivity_samples=16", "layer_samples=128": "layer_samples=32",
           "sensitivity_layers=6": "sensitivity_layers=3", "max_evaluations=10": "max_evaluations=6"}


def _smaller_budgets(nb) -> None:  # type: ignore[no-untyped-def]
    import re

    found = dict.fromkeys(BUDGETS, 0)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for old, new in BUDGETS.items():
            cell.source, n = re.subn(rf"\b{re.escape(old)}\b", new, cell.source)
            found[old] += n
    assert all(found.values()), f"budgets not found in the notebook: {[k for k, n in found.items() if not n]}"


@pytest.mark.slow
@pytest.mark.longest
def test_walkthrough_executes(demo_assets_fast: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("CALIBKIT_NOTEBOOK_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("CALIBKIT_DEMO_ASSETS", str(demo_assets_fast))
    monkeypatch.setenv("CALIBKIT_CACHE", str(tmp_path / "cache"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    _smaller_budgets(nb)
    client = nbclient.NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    images = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                 if o.output_type == "display_data" and "image/png" in o.get("data", {}))
    assert images >= 3  # length distribution, histogram with thresholds, per-layer SQNR
    assert (tmp_path / "run" / "reports" / "compare" / "report.html").is_file()
    assert (tmp_path / "run" / "tune" / "plan.json").is_file()
    assert os.environ["CALIBKIT_NOTEBOOK_DIR"].endswith("run")


def test_walkthrough_uses_only_the_public_api() -> None:
    """The notebook imports calibkit as ``ck`` and nothing below it: what it needs is on the public API."""
    import json

    code = "\n".join("".join(c["source"]) for c in json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
                     if c["cell_type"] == "code")
    imports = [line.strip() for line in code.splitlines() if "calibkit" in line and "import" in line]
    assert imports == ["import calibkit as ck"]
