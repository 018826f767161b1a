"""The pages a new user follows calibrate with the method calibkit recommends (calibrate's default), and each
page's later commands read the folder its calibrate wrote: the own-model page once led with ``--method
entropy``, which calibrate itself warns about on transformers (it clips attention Softmax and GELU outputs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from calibkit.calibrate.pipeline import DEFAULT_METHOD

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize("page", ["getting-started-own-model.md", "getting-started.md"])
def test_the_first_calibrate_uses_the_recommended_method(page: str) -> None:
    text = (DOCS / page).read_text(encoding="utf-8")
    calls = re.findall(r"^calibkit calibrate .*$", text, flags=re.M)
    assert calls, f"{page} shows no calibrate command"
    assert f"--method {DEFAULT_METHOD.value}" in calls[0], calls[0]
    assert not any("--method entropy" in c for c in calls)
    out = re.search(r"--out (runs/\S+)", calls[0])
    assert out is not None
    named = set(re.findall(r"(?:--qdq|--calibration|deploy) (runs/[\w.-]+)", text))
    assert named <= {out.group(1)} | {m for c in calls[1:] for m in re.findall(r"--out (runs/\S+)", c)}, named
    py = re.findall(r'ck\.calibrate\(.*method="(\w+)"', text)
    assert all(m == DEFAULT_METHOD.value for m in py), py


def test_no_page_but_the_measurements_calibrates_with_entropy() -> None:
    pages = [p for p in DOCS.glob("*.md") if p.name != "measured.md"]
    assert [p.name for p in pages if re.search(r"--method entropy|method=\"entropy\"", p.read_text())] == []
