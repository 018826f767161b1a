import sys

import pytest

from calibkit import _deps
from calibkit.errors import MissingDependencyError


def test_available_finds_real_modules_without_importing():
    sys.modules.pop("colorsys", None)
    assert _deps.available("colorsys")
    assert "colorsys" not in sys.modules
    assert not _deps.available("calibkit_no_such_module_xyz")


def test_namespace_folder_is_not_the_library(tmp_path, monkeypatch):
    (tmp_path / "fakelib_ns").mkdir()
    (tmp_path / "fakelib_ns" / "__init__.pyi").write_text("def f() -> int: ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert not _deps.available("fakelib_ns")
    with pytest.raises(MissingDependencyError):
        _deps.require("fakelib_ns")


def test_require_names_the_extra():
    with pytest.raises(MissingDependencyError) as info:
        _deps.require("tensorrt_definitely_missing")
    assert "pip install" in (info.value.hint or "")
    with pytest.raises(MissingDependencyError) as info:
        _deps.require("tensorrt") if not _deps.available("tensorrt") else pytest.skip("TensorRT is installed")
    assert "calibkit[tensorrt]" in (info.value.hint or "")
