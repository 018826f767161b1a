"""The wheel's metadata reads well on a package index and the version is written in one place."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import calibkit
from calibkit import _version

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

ROOT = Path(__file__).resolve().parents[1]


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_the_version_is_calibkits_and_the_changelog_opens_with_it() -> None:
    doc = _project()
    assert "version" in doc["project"]["dynamic"] and "version" not in doc["project"]
    assert doc["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "calibkit._version.__version__"}
    assert calibkit.__version__ == _version.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", calibkit.__version__)
    releases = re.findall(r"^## (\d+\.\d+\.\d+)\b", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)
    assert releases and releases[0] == calibkit.__version__


def test_index_page_metadata() -> None:
    p = _project()["project"]
    assert p["license"] == "Apache-2.0" and (ROOT / p["license-files"][0]).is_file()  # PEP 639 expression
    assert not any(c.startswith("License ::") for c in p["classifiers"])  # superseded by the expression
    assert p["readme"] == {"file": "README.md", "content-type": "text/markdown"}
    assert {"int8", "quantization", "onnx", "tensorrt"} <= set(p["keywords"])
    assert "calibkit[docs]" in p["optional-dependencies"]["dev"]  # make test installs what the docs test needs
    assert any(r.startswith("mkdocstrings[python]") for r in p["optional-dependencies"]["docs"])
