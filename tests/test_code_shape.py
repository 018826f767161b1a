"""The shape of the code: no function of the package is over 80 lines (its docstring not counted)."""

from __future__ import annotations

import ast
from pathlib import Path

import calibkit

MAX_LINES = 80


def _long_functions(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value,
                                                                                                     str):
                lines -= first.end_lineno - first.lineno + 1  # type: ignore[operator]
            if lines > MAX_LINES:
                out.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_no_function_is_over_80_lines() -> None:
    assert _long_functions(Path(calibkit.__file__).parent) == []


def test_the_rule_sees_a_long_function(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES - 1))  # with its def line: 80 lines
    (pkg / "m.py").write_text(f'def short():\n    """doc\n    more"""\n{body}\n\ndef long():\n{body}\n    y = 0\n')
    assert [f.split()[1] for f in _long_functions(pkg)] == ["long"]
