"""Every import inside calibkit follows the layering table of docs/architecture.md (import graph read with ast,
lazy imports in function bodies included): no import against the layers, and no import circle between modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "calibkit"

FOUNDATION = ("calibkit.types", "calibkit.errors", "calibkit._deps", "calibkit._io", "calibkit.outdirs",
              "calibkit.cpus", "calibkit.progress", "calibkit")  # "calibkit": __version__ only
RUNNERS = ("calibkit.engines.base", "calibkit.engines.onnxruntime", "calibkit.engines.cpu",
           "calibkit.engines.tensorrt", "calibkit.engines")
# layer -> (its modules, the layers it may import); docs/architecture.md's table, top to bottom
LAYERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "cli": (("calibkit.cli", "calibkit.__main__"), ("*",)),
    "demo": (("calibkit.demo",), ("*",)),
    "serving": (("calibkit.deploy",), ("build", "quantize", "data", "engines.files", "runners", "foundation")),
    "api": (("calibkit.api",), ("exporter", "report", "results", "evaluate", "resources", "build", "calibrate",
                                 "quantize", "executors", "data", "engines.files", "runners", "foundation")),
    "exporter": (("calibkit.exporter",), ("evaluate", "results", "data", "engines.files", "runners", "foundation")),
    "report": (("calibkit.report",), ("results", "foundation")),
    "results": (("calibkit.evaluate.results", "calibkit.evaluate.flags", "calibkit.evaluate.uncertainty"),
                ("foundation",)),
    "evaluate": (("calibkit.evaluate",), ("results", "resources", "calibrate", "quantize", "executors", "data",
                                          "engines.files", "runners", "foundation")),
    "resources": (("calibkit.resources",), ("executors", "data", "engines.files", "runners", "foundation")),
    "build": (("calibkit.engines.build",), ("quantize", "data", "engines.files", "runners", "foundation")),
    "calibrate": (("calibkit.calibrate",), ("resources", "quantize", "executors", "data", "engines.files", "runners",
                                            "foundation")),
    "quantize": (("calibkit.quantize",), ("data", "runners", "foundation")),
    "executors": (("calibkit.executors",), ("foundation",)),
    "engines.files": (("calibkit.engines.registry", "calibkit.engines.artifact"), ("data", "runners", "foundation")),
    "data": (("calibkit.data", "calibkit.graph", "calibkit.names"), ("runners", "foundation")),
    "runners": (RUNNERS, ("foundation",)),
    "foundation": (FOUNDATION, ()),
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    best, length = "", -1
    for name, (prefixes, _) in LAYERS.items():
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > length:
                best, length = name, len(p)
    assert best, f"{module} belongs to no layer of the table"
    return best


def _imports() -> dict[str, set[tuple[str, int]]]:
    out: dict[str, set[tuple[str, int]]] = {}
    for path in sorted(PKG.rglob("*.py")):
        mod = _module(path)
        found = out.setdefault(mod, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module == "calibkit":  # from calibkit import __version__ / a submodule
                    for a in node.names:
                        sub = f"calibkit.{a.name}"
                        found.add((sub if (PKG / a.name).exists() or (PKG / f"{a.name}.py").exists() else "calibkit",
                                   node.lineno))
                elif node.module.startswith("calibkit."):
                    found.add((node.module, node.lineno))
            elif isinstance(node, ast.Import):
                found.update((a.name, node.lineno) for a in node.names if a.name.startswith("calibkit."))
    return out


def test_no_import_against_the_layering_table() -> None:
    wrong = []
    for mod, targets in _imports().items():
        if mod == "calibkit":
            continue  # the package's lazy re-exports of the public API
        layer = _layer(mod)
        allowed = LAYERS[layer][1]
        for target, line in sorted(targets):
            other = _layer(target)
            if other == layer or "*" in allowed or other in allowed:
                continue
            wrong.append(f"{mod}:{line} ({layer}) imports {target} ({other})")
    assert not wrong, "\n".join(wrong)


def test_no_import_circle_between_modules() -> None:
    graph = {m: {t for t, _ in ts if t != m} for m, ts in _imports().items() if m != "calibkit"}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph.get(m, ())):
            if t not in graph:
                continue
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t] if t in stack else [m, t])
            elif t not in state:
                visit(t, [*stack, t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    # a package's __init__ re-exporting its own modules is not a circle of meaning
    real = [c for c in cycles if not any(x.count(".") < c[0].count(".") and c[0].startswith(x) for x in c)]
    assert not real, "\n".join(" -> ".join(c) for c in real)


@pytest.mark.parametrize("module", ["calibkit.quantize.qdq", "calibkit.engines.build"])
def test_the_former_violations_stay_fixed(module: str) -> None:
    targets = {t for t, _ in _imports()[module]}
    assert not any(t.startswith("calibkit.calibrate") for t in targets)
