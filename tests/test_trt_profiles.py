"""A TensorRT repository's trt_profiles.json goes through the codec both ways (results.files.TrtProfiles)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibkit._io import write_json
from calibkit.deploy.engine import PROFILES_FILE, read_spec
from calibkit.errors import UsageError
from calibkit.results.codec import document_json
from calibkit.results.files import TrtProfiles

SPEC = TrtProfiles("model.int8.onnx", "1/model.plan", 4096,
                   ({"min_seq": 1, "opt_seq": 8, "max_seq": 8, "min_batch": 1, "opt_batch": 4, "max_batch": 8},))


def test_written_and_read_back_the_same(tmp_path: Path) -> None:
    write_json(tmp_path / PROFILES_FILE, document_json(SPEC))
    doc = json.loads((tmp_path / PROFILES_FILE).read_text())
    assert doc["format"] == "calibkit-trt-profiles/1" and doc["profiles"][0]["opt_batch"] == 4
    assert read_spec(tmp_path) == SPEC


@pytest.mark.parametrize("edit", [{"format": "calibkit-trt-profiles/0"}, {"workspace_mib": "lots"},
                                  {"onnx": None}, {"profiles": []}])
def test_a_broken_file_is_a_usage_error(tmp_path: Path, edit: dict[str, object]) -> None:
    doc = {k: v for k, v in {**document_json(SPEC), **edit}.items() if v is not None}
    write_json(tmp_path / PROFILES_FILE, doc)
    with pytest.raises(UsageError, match="cannot be read"):
        read_spec(tmp_path)
