"""`calibkit --help` and `calibkit sample --help` must not import the heavy libraries."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import sys
sys.argv = ["calibkit", *{args!r}]
from calibkit.cli import main
try:
    main()
except SystemExit:
    pass
heavy = [m for m in ("torch", "onnxruntime", "transformers", "sklearn", "polars") if m in sys.modules]
print("HEAVY=" + ",".join(heavy))
"""


@pytest.mark.parametrize("args", [["--help"], ["sample", "--help"]])
def test_help_imports_no_heavy_modules(args):
    r = subprocess.run([sys.executable, "-c", CHECK.format(args=args)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "Usage" in r.stdout
    assert "HEAVY=\n" in r.stdout, r.stdout
