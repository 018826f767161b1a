"""The backend seam: a backend registered from this file alone (docs/architecture.md's worked example, run as
written) serves `compare` end to end for engines whose sidecar names it, with the same numbers ONNX Runtime's
own backend gives."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_compare_tiny import build_engines

from calibkit.enginefiles.artifact import EngineArtifact
from calibkit.enginefiles.registry import (
    BackendSpec,
    open_runner,
    register_backend,
    registered_backends,
    unregister_backend,
)
from calibkit.errors import ModelError, UsageError

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def _worked_example() -> str:
    section = DOC.read_text(encoding="utf-8").split("## Adding a backend", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the section holds one worked example"
    return blocks[0]


@pytest.fixture(scope="module")
def counting() -> Any:
    namespace: dict[str, Any] = {"__name__": "counting_backend"}
    exec(compile(_worked_example(), f"{DOC}:Adding a backend", "exec"), namespace)  # noqa: S102 - the doc's code
    yield namespace["CountingRunner"]
    unregister_backend("counting")


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_engines(tmp_path_factory.mktemp("seam"))


def _as_backend(engine: Path, backend: str, folder: Path) -> Path:
    """A copy of ``engine`` whose sidecar names ``backend``."""
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / engine.name
    copy.write_bytes(engine.read_bytes())
    replace(EngineArtifact.load(engine), path=copy, backend=backend).save()
    return copy


def _compare(a: Path, b: Path, eval_set: Path) -> Any:
    import calibkit.api as ck

    return ck.compare(a, b, eval_set, traffic=None, speed=False, sensitivity=False, workers=1, batch_size=16)


def test_a_backend_registered_from_a_test_serves_compare(counting: Any, engines: dict[str, Path],
                                                           tmp_path: Path) -> None:
    assert "counting" in registered_backends()
    a = _as_backend(engines["fp"], "counting", tmp_path / "counting")
    b = _as_backend(engines["int8"], "counting", tmp_path / "counting")
    before = counting.calls
    seen = _compare(a, b, engines["eval"])
    assert counting.calls > before  # the engines ran through the registered backend
    assert {e.backend for e in seen.engines} == {"counting"}
    assert EngineArtifact.load(a).backend == "counting"

    calls = counting.calls
    own = _compare(engines["fp"], engines["int8"], engines["eval"])
    assert counting.calls == calls  # ONNX Runtime's engines do not go through it
    assert {e.backend for e in own.engines} == {"onnxruntime"}
    for name in ("A", "B"):  # the same session options on the same batches: the same outputs, bit for bit
        assert np.array_equal(seen.per_text.by_engine[name], own.per_text.by_engine[name])
    assert seen.agreement == own.agreement
    assert seen.layers and [x.tensor for x in seen.layers] == [x.tensor for x in own.layers]  # tapped


def test_a_bare_file_finds_its_backend_by_suffix(counting: Any, engines: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "model.counting"
    path.write_bytes(engines["fp"].read_bytes())
    runner = open_runner(path)
    assert isinstance(runner, counting)


def test_an_engine_naming_no_registered_backend_is_refused(engines: dict[str, Path], tmp_path: Path) -> None:
    a = _as_backend(engines["fp"], "nowhere", tmp_path)
    with pytest.raises(ModelError) as err:
        open_runner(EngineArtifact.load(a))
    assert "nowhere" in err.value.message and "onnxruntime" in (err.value.hint or "")


def test_a_name_is_registered_once() -> None:
    spec = BackendSpec("onnxruntime", lambda path, art, names: open_runner(path))
    with pytest.raises(UsageError):
        register_backend(spec)
    with pytest.raises(UsageError):
        unregister_backend("tensorrt")
