"""The sweep's shape, read from the code with `ast` (nothing is imported or run): no function in pipeline/sweep/ is
longer than MAX_LINES (the worker's trial builder: 40), and no module outside pipeline/tracking/ imports mlflow or
reaches into a Tracker's MLflow client (`tracker.client`): the Tracker's own methods are the way to the tracking
store."""

from __future__ import annotations

import ast
from pathlib import Path

from ..conftest import REPO
from . import import_graph as ig

MAX_LINES = 60  # a function's lines, from its `def` to its last line

# Caps other than MAX_LINES: the worker builds a sweep trial, a lifecycle.Trial with its listeners, in 40 lines
# (a cap may only shrink)
LONG_FUNCTIONS = {"pipeline.sweep.worker._trial": 40}

TRACKING = "pipeline.tracking"


def long_functions(root: Path = REPO) -> dict[str, int]:
    """module.function -> its length in lines, for every function (methods and nested ones too) of pipeline/sweep/
    over MAX_LINES."""
    out = {}
    for module, path in ig.module_files(root).items():
        if module.startswith("pipeline.sweep."):
            for node in ast.walk(ig.parse(path)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_LINES:
                        out[f"{module}.{node.name}"] = max(lines, out.get(f"{module}.{node.name}", 0))
    return out


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


def test_no_sweep_function_is_longer_than_max_lines():
    over = {f: n for f, n in long_functions().items() if n > LONG_FUNCTIONS.get(f, MAX_LINES)}
    assert not over, (
        f"functions of pipeline/sweep/ over {MAX_LINES} lines (or over their cap in LONG_FUNCTIONS): {over}; split "
        f"each by idea into functions of its own"
    )


def test_only_tracking_reaches_mlflow():
    found = mlflow_reaches()
    assert not found, (
        f"MLflow reached outside pipeline/tracking/: {found}; give pipeline/tracking/client.py's Tracker a method "
        f"for it instead"
    )


def test_the_checks_see_what_they_forbid(tmp_path):
    """The checks themselves: a long function in pipeline/sweep/, a tracker's client and an mlflow import outside
    tracking/ are found; http.client, tracking's own client and a short function are not."""
    pkg = tmp_path / "pipeline"
    for folder in ("sweep", "tracking", "cli"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    body = "".join(f"    x = {i}\n" for i in range(MAX_LINES - 1))
    (pkg / "sweep" / "long.py").write_text(f"def fits():\n{body}\n\ndef over():\n{body}    return x\n")
    (pkg / "tracking" / "client.py").write_text("import mlflow\n\n\ndef f(self):\n    return self.client.get_run\n")
    (pkg / "cli" / "ui.py").write_text(
        "import http.client\nfrom mlflow import MlflowClient\n\n\n"
        "def f(tracker, e):\n    return tracker.client.get_run, http.client.HTTPException\n"
    )
    assert long_functions(tmp_path) == {"pipeline.sweep.long.over": MAX_LINES + 1}
    assert mlflow_reaches(tmp_path) == ["pipeline.cli.ui:2 from mlflow import", "pipeline.cli.ui:6 tracker.client"]
