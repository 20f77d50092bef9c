"""pipeline/'s imports, read from the code with `ast`: no cycles (lazy imports inside functions count), the analysis
wing's layers point one way, and no module imports another's private (leading-underscore) names."""
from __future__ import annotations

import ast

from . import import_graph as ig

# Private names still imported across files elsewhere in the package, each to be made public by its module's owner.
# (This list may only shrink.)
KNOWN_PRIVATE: set = set()

# The analysis wing: what each floor may import from pipeline/ (analyze.py, the entry, sits on all of them).
WING = {
    "pipeline.tables": set(),
    "pipeline.summary": {"pipeline.tables"},
    "pipeline.knobs": {"pipeline.tables"},
    "pipeline.plots": {"pipeline.tables"},
    "pipeline.report_host": {"pipeline.tables", "pipeline.emulated"},
    "pipeline.report": {"pipeline.tables", "pipeline.report_host"},
    "pipeline.projection": {"pipeline.tables", "pipeline.scaling_model"},
    "pipeline.analyze": {"pipeline.tables", "pipeline.summary", "pipeline.knobs", "pipeline.plots",
                         "pipeline.report", "pipeline.projection"},
}


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
