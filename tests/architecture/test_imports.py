"""pipeline/'s imports, read from the code with `ast`: no cycles (lazy imports inside functions count), the folders
point one way (FLOORS), the torch-free folders load no torch, and no module imports another's private
(leading-underscore) names."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from ..conftest import REPO
from . import import_graph as ig

# Private names still imported across files elsewhere in the package, each to be made public by its module's owner.
# (This list may only shrink.)
KNOWN_PRIVATE: set = set()

# The wings, lowest floor first: what each folder (or top-level module) of pipeline/ may import from pipeline/, by
# folder. Arrows only point down this list, so the folders import one another without a cycle (docs: LAYOUT).
TOP = {
    "catalog": set(),
    "paths": set(),
    "zoo": set(),
    "models": {"zoo"},
    "scratch": set(),
    "processes": set(),
    "rank_env": set(),
}
FLOORS = {
    "config": {"catalog", "paths", "zoo"},
    "errors": set(),
    "redact": set(),
    "store_faults": set(),
    "env": {"config"},
    "signals": {"errors"},
    "user_errors": {"config", "errors", "redact", "signals"},
    "lifeline": {"processes", "signals", "user_errors"},
    "preflight": {"errors", "env", "redact", "user_errors", "paths"},
    "records": {"scratch", "config", "catalog", "zoo"},
    "data": {"scratch", "errors", "redact"},
    "host": set(),
    "measure": {"host"},
    "strategies": {"host", "measure", "catalog", "models", "rank_env"},
    "trial": {
        "catalog",
        "scratch",
        "config",
        "records",
        "data",
        "host",
        "measure",
        "strategies",
        "errors",
        "store_faults",
        "paths",
        "models",
        "rank_env",
    },
    "tracking": {"scratch", "errors", "redact", "env", "store_faults", "paths", "preflight"},
    "scaling": {"catalog", "config", "data", "host", "strategies", "trial", "models", "paths", "rank_env", "zoo"},
    "sweep": {
        "processes",
        "config",
        "data",
        "records",
        "host",
        "measure",
        "strategies",
        "trial",
        "scaling",
        "tracking",
        "catalog",
        "errors",
        "redact",
        "env",
        "store_faults",
        "signals",
        "paths",
        "preflight",
        "zoo",
    },
    "analysis": {"records", "scaling", "catalog", "errors"},
    "doctor": {
        "scratch",
        "config",
        "data",
        "host",
        "measure",
        "strategies",
        "trial",
        "catalog",
        "errors",
        "paths",
        "models",
    },
    "cli": {
        "config",
        "records",
        "data",
        "host",
        "measure",
        "trial",
        "tracking",
        "scaling",
        "sweep",
        "analysis",
        "doctor",
        "errors",
        "redact",
        "store_faults",
        "user_errors",
        "lifeline",
        "paths",
        "preflight",
        "zoo",
    },
    "__main__": {"cli"},
    **TOP,
}
TORCH_FREE = ["pipeline.config", "pipeline.records", "pipeline.analysis", "pipeline.catalog", "pipeline.zoo"]


def wing(module: str) -> str:
    """pipeline.sweep.claims -> sweep; pipeline.errors -> errors; pipeline -> '' (the empty package)."""
    return module.split(".")[1] if "." in module else ""


def folder_graph() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, deps in ig.graph().items():
        out.setdefault(wing(module), set()).update(wing(d) for d in deps)
    return {w: deps - {w, ""} for w, deps in out.items()}


def test_folders_point_one_way():
    for w, deps in folder_graph().items():
        if w:
            assert w in FLOORS, f"pipeline/{w} is on no floor of tests/architecture/test_imports.py's FLOORS"
            assert deps <= FLOORS[w], (
                f"pipeline/{w} imports {sorted(deps - FLOORS[w])}; it may import {sorted(FLOORS[w])}"
            )


def test_the_floors_have_no_cycle():
    cycle = ig.find_cycle({w: set(d) for w, d in FLOORS.items()})
    assert cycle is None, "the floors of FLOORS import each other: " + " -> ".join(cycle)


@pytest.mark.parametrize("module", TORCH_FREE)
def test_torch_free_folders_load_no_torch(module):
    """config/, records/, analysis/ and catalog.py cost nothing to import: no torch, even through an __init__."""
    code = f"import sys, {module}; sys.exit('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"importing {module} loads torch" + run.stderr[-2000:]


# Inside the analysis wing, by what each part makes: tables/ the numbers (rows, tables, intervals, summary.json),
# report/ report.md and its sections, plots/ the figures; stage.py, the analyze stage, drives all three. The arrows
# point one way: report/ and plots/ read tables/, tables/ reads neither, and report/ and plots/ skip each other.
ANALYSIS = "pipeline.analysis"
ANALYSIS_PARTS = {
    "tables": set(),
    "report": {"tables"},
    "plots": {"tables"},
    "stage": {"tables", "report", "plots"},
    "": {"stage"},  # pipeline/analysis/__init__.py: the wing's face, `analyze`
}


def analysis_part(module: str) -> str:
    """pipeline.analysis.tables.points -> tables; pipeline.analysis.stage -> stage; pipeline.analysis -> ''."""
    return module.removeprefix(ANALYSIS).lstrip(".").partition(".")[0]


def analysis_breaches(g: dict[str, set[str]]) -> list[str]:
    """`module -> imported` for every import inside the analysis wing that its part may not make (lazy ones too)."""
    out = []
    for module, deps in sorted(g.items()):
        if module != ANALYSIS and not module.startswith(ANALYSIS + "."):
            continue
        part = analysis_part(module)
        if part not in ANALYSIS_PARTS:
            out.append(f"{module} is in no part of ANALYSIS_PARTS")
            continue
        for dep in sorted(d for d in deps if d.startswith(ANALYSIS + ".")):
            if analysis_part(dep) not in ANALYSIS_PARTS[part] | {part}:
                out.append(f"{module} -> {dep}")
    return out


def test_analysis_tables_imports_neither_report_nor_plots():
    """analysis/tables imports neither report nor plots: the numbers stand without the words and the figures."""
    g = ig.graph()
    tables = {m: deps for m, deps in g.items() if analysis_part(m) == "tables" and m.startswith(ANALYSIS + ".")}
    assert f"{ANALYSIS}.tables.points" in tables, "pipeline/analysis/tables/ holds no points.py"
    found = sorted(f"{m} -> {d}" for m, deps in tables.items() for d in deps if analysis_part(d) in ("report", "plots"))
    assert not found, f"analysis/tables imports report or plots: {found}"


def test_analysis_parts_point_one_way():
    """report/ and plots/ read tables/ and not each other; only stage.py reads all three."""
    breaches = analysis_breaches(ig.graph())
    assert not breaches, f"the analysis wing's arrows (ANALYSIS_PARTS) are broken: {breaches}"


def test_an_analysis_breach_is_found(tmp_path):
    """The check itself: a lazy import of report/ inside tables/, and a module beside stage.py, are both found."""
    pkg = tmp_path / "pipeline" / "analysis"
    for part in ("tables", "report"):
        (pkg / part).mkdir(parents=True)
        (pkg / part / "__init__.py").write_text("")
    for init in (tmp_path / "pipeline" / "__init__.py", pkg / "__init__.py"):
        init.write_text("")
    (pkg / "report" / "words.py").write_text("from pipeline.analysis.tables import numbers\n")
    (pkg / "tables" / "numbers.py").write_text("def f():\n    from pipeline.analysis.report import words\n")
    (pkg / "loose.py").write_text("")
    assert analysis_breaches(ig.graph(tmp_path)) == [
        "pipeline.analysis.loose is in no part of ANALYSIS_PARTS",
        "pipeline.analysis.tables.numbers -> pipeline.analysis.report.words",
    ]


def test_catalog_imports_nothing_heavy():
    """pipeline/catalog.py is read by config validation and the analysis wing: no torch, optuna, mlflow, pandas,
    and nothing from pipeline/ (so it sits below every module that reads it)."""
    tree = ig.parse(ig.module_files()["pipeline.catalog"])
    imported = {a.name.partition(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {
        (n.module or "").partition(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level
    }
    assert imported <= {"__future__", "dataclasses"}, f"catalog.py imports {sorted(imported)}"
    assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree)), "catalog.py imports pipeline/"


def test_no_import_cycles():
    cycle = ig.find_cycle(ig.graph())
    assert cycle is None, "import cycle in pipeline/: " + " -> ".join(cycle)


def test_a_lazy_import_closes_a_cycle(tmp_path):
    """The check itself: an import inside a function counts (today's analyze <-> plots cycle was one)."""
    pkg = tmp_path / "pipeline"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n    return a\n")
    (pkg / "c.py").write_text("import pipeline.a\nfrom pipeline import b\n")
    g = ig.graph(tmp_path)
    assert g["pipeline.c"] == {"pipeline.a", "pipeline.b"}
    assert ig.find_cycle(g) in (["pipeline.a", "pipeline.b", "pipeline.a"], ["pipeline.b", "pipeline.a", "pipeline.b"])


def test_no_private_names_imported_across_modules():
    files = ig.module_files()
    found = set()
    for module, path in files.items():
        for node in ast.walk(ig.parse(path)):
            if isinstance(node, ast.ImportFrom):
                for target in ig.targets(node, module, path.name == "__init__.py", files):
                    found |= {
                        (module, target, a.name)
                        for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")
                    }
    assert found <= KNOWN_PRIVATE, f"private names imported across modules: {sorted(found - KNOWN_PRIVATE)}"


OPTUNA_PRIVATE = {"_storage", "_trial_id", "_study_id", "_get_stale_trial_ids", "_pop_waiting_trial_id"}


def test_only_the_worker_queue_uses_optunas_private_api():
    """pipeline/sweep/claims.py is the one module that reaches into Optuna (study._storage, trial._trial_id, ...)."""
    found = sorted(
        f"{module}:{node.lineno} .{node.attr}"
        for module, path in ig.module_files().items()
        if module != "pipeline.sweep.claims"
        for node in ast.walk(ig.parse(path))
        if isinstance(node, ast.Attribute) and node.attr in OPTUNA_PRIVATE
    )
    assert not found, f"Optuna's private API outside pipeline/sweep/claims.py: {found}"
