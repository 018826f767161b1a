"""Type-check calibkit/engines/tensorrt against tensorrt-stubs.

    .venv/bin/python tools/mypy_tensorrt.py

Why a script: the tensorrt-stubs wheel (10.13.0.35.1) installs its stubs as plain ``tensorrt/`` and
``tensorrt_bindings/`` folders without ``py.typed``, so mypy silently treats ``tensorrt`` as untyped (Any), and
its ``tensorrt.pyi`` has syntax errors (parameters named ``in``; a required parameter after defaulted
ones in ``add_scale_nd``). This copies the stubs into a temporary folder, renames those parameters to
``in_`` (and makes ``channel_axis`` keyword-only), and runs mypy with that folder on MYPYPATH.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    spec = importlib.util.find_spec("tensorrt_stubs")
    if spec is None or spec.origin is None:
        print("tensorrt-stubs is not installed: pip install tensorrt-stubs", file=sys.stderr)
        return 2
    site = Path(spec.origin).parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        for pkg in ("tensorrt", "tensorrt_bindings"):
            shutil.copytree(site / pkg, Path(tmp) / pkg)
        for pyi in Path(tmp).rglob("*.pyi"):
            text = pyi.read_text(encoding="utf-8")
            text = re.sub(r"([(,]\s*)in(\s*:)", r"\1in_\2", text)
            # a required parameter after defaulted ones (add_scale_nd's channel_axis): make it keyword-only
            text = text.replace("= None, channel_axis: int)", "= None, *, channel_axis: int)")
            pyi.write_text(text, encoding="utf-8")
        config = Path(tmp) / "mypy.ini"
        # the project's [tool.mypy] settings, plus: don't report the stubs' own errors
        config.write_text(
            "[mypy]\npython_version = 3.11\nignore_missing_imports = True\n"
            "[mypy-tensorrt.*,tensorrt_bindings.*]\nignore_errors = True\n",
            encoding="utf-8",
        )
        env = {**os.environ, "MYPYPATH": tmp}
        args = sys.argv[1:] or [str(ROOT / "calibkit/engines/tensorrt")]
        return subprocess.call([sys.executable, "-m", "mypy", "--config-file", str(config), *args], env=env, cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main())
