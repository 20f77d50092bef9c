"""pipeline/'s module import graph, read from the source with `ast` (nothing but the catalog is imported or run).

Every `import` and `from ... import` counts, wherever it stands: at the top, inside a function (the lazy imports
that keep torchvision or matplotlib out of other stages), under `if`. Used by tests/architecture/test_imports.py (no
cycles,
the analysis wing's layers) and tests/architecture/test_dvc_deps.py (each stage's code deps).
"""

from __future__ import annotations

import ast
from pathlib import Path

from ..conftest import REPO

PACKAGE = "pipeline"


def module_files(root: Path = REPO) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under pipeline/ (a package is its __init__.py)."""
    out = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known) -> set[str]:
    """The pipeline modules one import statement names (`from .x import y`: x.y when y is a module, else x)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            here = module.split(".") if is_package else module.split(".")[:-1]
            base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    out = set()
    for name in names:
        while name and name not in known:  # `import pipeline.x.attr` and the like resolve upwards
            name = name.rpartition(".")[0]
        if name.partition(".")[0] == PACKAGE:
            out.add(name)
    return out


def imports_in(nodes, module: str, is_package: bool, known) -> set[str]:
    """Pipeline modules imported anywhere inside `nodes` (ast nodes), function bodies included."""
    out = set()
    for top in nodes:
        for node in ast.walk(top):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                out |= targets(node, module, is_package, known)
    return out


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def graph(root: Path = REPO) -> dict[str, set[str]]:
    """module -> the pipeline modules it imports (itself excluded). The strategy registry (pipeline/strategies/
    __init__.py) imports the module named after each catalog row by name, which no import statement shows: those
    edges come from the catalog (a torch-free table, the one module this reads by importing it)."""
    from pipeline import catalog

    files = module_files(root)
    g = {m: imports_in([parse(p)], m, p.name == "__init__.py", files) - {m} for m, p in files.items()}
    if f"{PACKAGE}.strategies" in g:
        g[f"{PACKAGE}.strategies"] |= {m for m in (f"{PACKAGE}.strategies.{n}" for n in catalog.NAMES) if m in files}
    return g


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for d in sorted(g.get(m, ())):
            if state.get(d) == "open":
                return stack[stack.index(d) :] + [d]
            if d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(g):
        if m not in state and (found := visit(m)):
            return found
    return None


def closure(g: dict[str, set[str]], roots) -> set[str]:
    """Every module loaded when `roots` are imported: their imports, transitively, and each one's parent packages
    (importing pipeline.strategies.ddp runs pipeline/__init__.py and pipeline/strategies/__init__.py first)."""
    seen, todo = set(), list(roots)
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        parts = m.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += g.get(m, ())
    return seen
