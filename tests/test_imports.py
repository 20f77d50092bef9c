"""pipeline/'s imports, read from the code with `ast`: no cycles (lazy imports inside functions count), the analysis
wing's layers point one way, and no module imports another's private (leading-underscore) names."""
from __future__ import annotations

import ast

from . import import_graph as ig

# Private names still imported across files elsewhere in the package, each to be made public by its module's owner.
# (This list may only shrink.)
KNOWN_PRIVATE: set = set()

# The analysis wing: what each floor may import from pipeline/ (analyze.py, the entry, sits on all of them). The
# strategy catalog (torch-free, importing nothing from pipeline/) and the scratch-file namer (stdlib only) are below
# every floor; beneath the wing too, the sweep table's reader and the trial record whose schema types it, which
# import nothing of the wing.
BASE = {"pipeline.catalog", "pipeline.scratch"}
WING = {
    "pipeline.record": BASE,
    "pipeline.sweep_table": {"pipeline.record"} | BASE,
    "pipeline.stats": BASE,
    "pipeline.trial_rows": {"pipeline.sweep_table"} | BASE,
    "pipeline.tables": {"pipeline.stats", "pipeline.trial_rows"} | BASE,
    "pipeline.confidence": {"pipeline.tables", "pipeline.stats"} | BASE,
    "pipeline.summary": {"pipeline.tables"} | BASE,
    "pipeline.knobs": {"pipeline.tables"} | BASE,
    "pipeline.plots": {"pipeline.tables"} | BASE,
    "pipeline.report_host": {"pipeline.tables", "pipeline.emulated"} | BASE,
    "pipeline.report": {"pipeline.tables", "pipeline.confidence", "pipeline.report_host"} | BASE,
    "pipeline.projection": {"pipeline.tables", "pipeline.scaling_model"} | BASE,
    "pipeline.analyze": {"pipeline.trial_rows", "pipeline.tables", "pipeline.stats", "pipeline.summary",
                         "pipeline.knobs", "pipeline.plots", "pipeline.report", "pipeline.projection"} | BASE,
}


def test_catalog_imports_nothing_heavy():
    """pipeline/catalog.py is read by config validation and the analysis wing: no torch, optuna, mlflow, pandas,
    and nothing from pipeline/ (so it sits below every module that reads it)."""
    tree = ig.parse(ig.module_files()["pipeline.catalog"])
    imported = {a.name.partition(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").partition(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                 and not n.level}
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


def test_analysis_wing_points_one_way():
    g = ig.graph()
    for module, allowed in WING.items():
        assert g[module] <= allowed, f"{module} imports {sorted(g[module] - allowed)}; it may import {sorted(allowed)}"


def test_no_private_names_imported_across_modules():
    files = ig.module_files()
    found = set()
    for module, path in files.items():
        for node in ast.walk(ig.parse(path)):
            if isinstance(node, ast.ImportFrom):
                for target in ig.targets(node, module, path.name == "__init__.py", files):
                    found |= {(module, target, a.name) for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")}
    assert found <= KNOWN_PRIVATE, f"private names imported across modules: {sorted(found - KNOWN_PRIVATE)}"


OPTUNA_PRIVATE = {"_storage", "_trial_id", "_study_id", "_get_stale_trial_ids", "_pop_waiting_trial_id"}


def test_only_the_worker_queue_uses_optunas_private_api():
    """pipeline/claims.py is the one module that reaches into Optuna (study._storage, trial._trial_id, ...)."""
    found = sorted(f"{module}:{node.lineno} .{node.attr}" for module, path in ig.module_files().items()
                   if module != "pipeline.claims" for node in ast.walk(ig.parse(path))
                   if isinstance(node, ast.Attribute) and node.attr in OPTUNA_PRIVATE)
    assert not found, f"Optuna's private API outside pipeline/claims.py: {found}"
