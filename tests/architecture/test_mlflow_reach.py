"""Only pipeline/tracking/ reaches MLflow, read from the code with `ast` (nothing is imported or run): no module
outside it imports mlflow or reaches into a Tracker's MLflow client (`tracker.client`): the Tracker's own methods are
the way to the tracking store. (The sweep's and the trial's function sizes: test_function_size.py.)"""

from __future__ import annotations

import ast
from pathlib import Path

from ..conftest import REPO
from . import import_graph as ig

TRACKING = "pipeline.tracking"


def _imported_names(tree: ast.Module) -> set[str]:
    """The names a module's imports bind (`http` of `import http.client`, `b` of `from a import b`): a module's
    `client` (http.client) is no tracker's."""
    return {
        a.asname or a.name.partition(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }


def mlflow_reaches(root: Path = REPO) -> list[str]:
    """`module:line what` for every import of mlflow and every `<object>.client` (an object's MLflow client, never
    a module's `client` such as http.client) in pipeline/ outside pipeline/tracking/."""
    found = []
    for module, path in ig.module_files(root).items():
        if module == TRACKING or module.startswith(TRACKING + "."):
            continue
        tree = ig.parse(path)
        imported = _imported_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [f"{module}:{node.lineno} import {a.name}" for a in node.names if _is_mlflow(a.name)]
            elif isinstance(node, ast.ImportFrom) and not node.level and _is_mlflow(node.module or ""):
                found.append(f"{module}:{node.lineno} from {node.module} import")
            elif isinstance(node, ast.Attribute) and node.attr == "client" and _root(node) not in imported:
                found.append(f"{module}:{node.lineno} {ast.unparse(node)}")
    return sorted(found)


def _is_mlflow(name: str) -> bool:
    return name.partition(".")[0] == "mlflow"


def _root(node: ast.expr) -> str | None:
    """The name an attribute chain starts from (`tracker` of `self.tracker.client`: `self`), or None."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def test_only_tracking_reaches_mlflow():
    found = mlflow_reaches()
    assert not found, (
        f"MLflow reached outside pipeline/tracking/: {found}; give pipeline/tracking/client.py's Tracker a method "
        f"for it instead"
    )


def test_the_check_sees_what_it_forbids(tmp_path):
    """The check itself: a tracker's client and an mlflow import outside tracking/ are found; http.client and
    tracking's own client are not."""
    pkg = tmp_path / "pipeline"
    for folder in ("tracking", "cli"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "tracking" / "client.py").write_text("import mlflow\n\n\ndef f(self):\n    return self.client.get_run\n")
    (pkg / "cli" / "ui.py").write_text(
        "import http.client\nfrom mlflow import MlflowClient\n\n\n"
        "def f(tracker, e):\n    return tracker.client.get_run, http.client.HTTPException\n"
    )
    assert mlflow_reaches(tmp_path) == ["pipeline.cli.ui:2 from mlflow import", "pipeline.cli.ui:6 tracker.client"]
