"""Triton's own model-config schema for the deploy tests, and a tiny calibrated model with its traffic log."""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest


@functools.cache
def model_config_pb2() -> ModuleType:
    """``tritonclient/grpc/model_config_pb2.py`` (Triton's model_config.proto, compiled). Loaded by file: the
    package's ``tritonclient.grpc`` imports grpcio first, which the schema does not need (dev installs
    ``tritonclient`` without its grpc extra, see pyproject.toml)."""
    spec = importlib.util.find_spec("tritonclient")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("tritonclient is not installed (pip install -e '.[dev]')")
    path = Path(next(iter(spec.submodule_search_locations))) / "grpc" / "model_config_pb2.py"
    mod_spec = importlib.util.spec_from_file_location("_triton_model_config_pb2", path)
    assert mod_spec is not None and mod_spec.loader is not None
    mod = importlib.util.module_from_spec(mod_spec)
    sys.modules[mod_spec.name] = mod
    mod_spec.loader.exec_module(mod)
    return mod


def parse_config(path: Path):  # type: ignore[no-untyped-def]
    """config.pbtxt parsed exactly as Triton parses it (text_format into inference.ModelConfig)."""
    from google.protobuf import text_format

    return text_format.Parse(path.read_text(encoding="utf-8"), model_config_pb2().ModelConfig())


def write_log(path: Path, texts: list[str], field: str = "text") -> Path:
    lines = []
    for t in texts:
        rec: dict = {}
        cur = rec
        parts = field.split(".")
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = t
        lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
