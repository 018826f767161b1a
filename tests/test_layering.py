"""Every import inside calibkit follows the layering table of docs/architecture.md (import graph read with ast,
lazy imports in function bodies included): no import against the layers, and no import circle between modules."""

from __future__ import annotations

import ast
import functools
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "calibkit"
DOC = ROOT / "docs" / "architecture.md"
HEADER = "| layer | modules | may import |"


@dataclass(frozen=True)
class Row:
    """One row of the layering table: its name, the modules it holds and the rows it may import."""

    name: str
    files: tuple[str, ...]  # modules named by a file: that module alone
    folders: tuple[str, ...]  # modules named by a folder: every module under it
    imports: tuple[str, ...]


def _paths(cell: str) -> list[str]:
    """The backticked paths of a modules cell outside parentheses (`evaluate/`, `api.py`), in order; backticked
    names inside the parenthesised descriptions are prose."""
    found, depth, i = [], 0, 0
    while i < len(cell):
        if cell[i] == "`":
            j = cell.index("`", i + 1)
            token = cell[i + 1:j]
            if depth == 0 and re.fullmatch(r"[\w/]+(\.py|/)", token):
                found.append(token)
            i = j + 1
            continue
        depth += {"(": 1, ")": -1}.get(cell[i], 0)
        i += 1
    return found


def _dotted(path: str) -> str:
    parts = ["calibkit", *path.removesuffix("/").removesuffix(".py").split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def parse_table(text: str) -> list[Row]:
    """The rows of the table under ``HEADER`` in ``text``, top to bottom, with "everything below" spelled out."""
    lines = text.splitlines()
    if HEADER not in lines:
        raise ValueError(f"no table headed {HEADER!r}")
    body = itertools.takewhile(lambda line: line.startswith("|"), lines[lines.index(HEADER) + 2:])
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in body]
    names = [c[0] for c in cells]
    rows = []
    for k, (name, modules, may) in enumerate(cells):
        paths = _paths(modules)
        if may == "everything below":
            imports = tuple(names[k + 1:])
        elif may == "—":
            imports = ()
        else:
            imports = tuple(x.strip() for x in may.split(","))
            unknown = [x for x in imports if x not in names]
            if unknown:
                raise ValueError(f"row {name!r} may import {unknown}, which are no rows of the table")
        rows.append(Row(name, tuple(_dotted(p) for p in paths if p.endswith(".py")),
                        tuple(_dotted(p) for p in paths if p.endswith("/")), imports))
    return rows


ROWS = parse_table(DOC.read_text(encoding="utf-8"))
BY_NAME = {r.name: r for r in ROWS}


def place(module: str, rows: list[Row] = ROWS) -> str | None:
    """The row holding ``module``: the one naming its file, else the deepest folder above it; None if no row does."""
    for r in rows:
        if module in r.files:
            return r.name
    best, depth = None, -1
    for r in rows:
        for f in r.folders:
            if (module == f or module.startswith(f + ".")) and f.count(".") > depth:
                best, depth = r.name, f.count(".")
    return best


def _layer(module: str) -> str:
    name = place(module)
    if name is None:
        pytest.fail(f"{module} is in no row of the layering table of docs/architecture.md: add it there")
    return name


def _all_modules() -> list[str]:
    return sorted(_module(p) for p in PKG.rglob("*.py"))


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache  # read once for the module's tests (parsing every file is most of their time)
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
                found.update((a.name, node.lineno) for a in node.names
                             if a.name == "calibkit" or a.name.startswith("calibkit."))
    return out


def test_every_module_is_in_one_row_of_the_table() -> None:
    unplaced = [m for m in _all_modules() if place(m) is None]
    assert not unplaced, f"modules in no row of the table of docs/architecture.md: {unplaced}"


def test_every_path_of_the_table_exists() -> None:
    missing = [p for r in ROWS for p in (*r.files, *r.folders)
               if not (ROOT / (p.replace(".", "/") + ".py")).exists() and not (ROOT / p.replace(".", "/")).is_dir()]
    assert not missing, f"docs/architecture.md's layering table names modules that do not exist: {missing}"


def test_a_module_outside_every_row_is_not_placed() -> None:
    assert place("calibkit.brand_new_module") is None
    assert place("calibkit.evaluate.brand_new_step") == "evaluation"  # a folder holds what is put in it
    assert place("calibkit.engines.brand_new_backend") == "runners"
    assert place("calibkit.results.brand_new_result") == "results"
    assert place("calibkit.evidence.brand_new_rule") == "evidence"
    assert place("calibkit.requests.compare") == "evaluation"  # a file beats its folder
    assert place("calibkit") == "public API"  # the package face: nothing under the API imports it


#: folders whose modules sit in several rows, each with the reason; every other folder is one layer
SPLIT_FOLDERS = {
    # each request sits in the row of the code that reads it (it names that code's defaults): deploy's in
    # serving, export's in export, compare's and tune's in evaluation, calibrate's and smooth's in calibration,
    # build's in build, sample's in data; how a field declares its option sits below them all (declarations), the
    # shared traffic and resource options between
    "calibkit.requests": {"serving", "export", "evaluation", "calibration", "build", "data and graph", "requests",
                          "declarations"},
}


def test_a_folder_is_one_layer() -> None:
    rows: dict[str, set[str]] = {}
    for m in _all_modules():
        parts = m.split(".")
        if len(parts) > 2 or (PKG / parts[-1]).is_dir():  # a module inside a package folder of calibkit/
            rows.setdefault(".".join(parts[:2]), set()).add(_layer(m))
    split = {f: r for f, r in rows.items() if len(r) > 1 and r != SPLIT_FOLDERS.get(f)}
    assert not split, f"folders holding modules of several layers: {split}"


def test_the_table_parser_reads_paths_rows_and_permissions() -> None:
    text = f"""intro

{HEADER}
|---|---|---|
| top | `a/` (prose `b.py` in parentheses), `c.py` | everything below |
| middle | `d/e.py` (`f/`) | bottom |
| bottom | `__init__.py` | — |
"""
    rows = parse_table(text)
    assert rows == [Row("top", ("calibkit.c",), ("calibkit.a",), ("middle", "bottom")),
                    Row("middle", ("calibkit.d.e",), (), ("bottom",)),
                    Row("bottom", ("calibkit",), (), ())]
    with pytest.raises(ValueError, match="no rows"):
        parse_table(text.replace("| bottom |\n", "| nowhere |\n"))


def test_no_import_against_the_layering_table() -> None:
    wrong = []
    for mod, targets in _imports().items():
        layer = _layer(mod)
        allowed = BY_NAME[layer].imports
        for target, line in sorted(targets):
            other = _layer(target)
            if other != layer and other not in allowed:
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


def test_evidence_imports_nothing_of_evaluate() -> None:
    """The statistics of evidence sit below evaluation, which orchestrates them: no module of calibkit/evidence/
    imports calibkit/evaluate/ (or anything else of the evaluation row), and the table does not let one."""
    assert "evaluation" not in BY_NAME["evidence"].imports
    assert "evidence" in BY_NAME["evaluation"].imports
    wrong = [f"{m}:{line} imports {t}" for m, targets in _imports().items() if m.startswith("calibkit.evidence")
             for t, line in sorted(targets) if t.startswith("calibkit.evaluate") or _layer(t) == "evaluation"]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("module", ["calibkit.quantize.qdq", "calibkit.building"])
def test_the_former_violations_stay_fixed(module: str) -> None:
    targets = {t for t, _ in _imports()[module]}
    assert not any(t.startswith("calibkit.calibrate") for t in targets)
