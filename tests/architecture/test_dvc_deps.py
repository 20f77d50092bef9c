"""dvc.yaml's code deps follow the code: each stage depends on exactly the pipeline/ modules its command imports.

DVC itself resolves dvc.yaml (foreach, matrix, a fixed list or `${...}` from params.yaml: any layout), so every
stage is checked as `dvc repro` sees it. A stage's command `python -m pipeline NAME` is `cmd_NAME` in
pipeline/cli/commands.py; the modules it loads are pipeline/__main__.py's and pipeline/cli/'s imports, the top-level
imports of commands.py, those of the functions `main` and `cmd_NAME` reach, and then every import of those modules,
transitively, imports inside functions included
(tests/architecture/import_graph.py). A module missing from the stage's deps means editing it would not rerun the stage.
"""

from __future__ import annotations

import ast
import re

import pytest

from ..conftest import REPO
from . import import_graph as ig

dvc_repo = pytest.importorskip("dvc.repo")

COMMAND = re.compile(r"python3?\s+-m\s+pipeline\s+([A-Za-z_]\w*)")


def _resolved_stages():
    """(name, [pipeline commands], deps, names of the stages it depends on), as DVC resolves dvc.yaml here."""
    with dvc_repo.Repo(str(REPO)) as repo:
        index = repo.index
        graph = index.graph  # edges run from a stage to the stages whose outputs it depends on
        out = []
        for s in index.stages:
            cmds = s.cmd if isinstance(s.cmd, list) else [s.cmd or ""]
            out.append(
                (
                    s.addressing,
                    [m for c in cmds for m in COMMAND.findall(c)],
                    [d.def_path for d in s.deps],
                    {u.addressing for u in graph.successors(s)},
                )
            )
        return out


STAGES = _resolved_stages()


def command_modules(command: str) -> set[str]:
    """The pipeline modules `python -m pipeline COMMAND` imports, transitively (parent packages included)."""
    files = ig.module_files()
    commands = "pipeline.cli.commands"
    tree = ig.parse(files[commands])
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assert f"cmd_{command}" in functions, (
        f"pipeline/cli/commands.py has no cmd_{command} (python -m pipeline {command})"
    )
    # main() dispatches through globals()[f"cmd_{...}"]: main and the command's function are roots of their own
    reached = [n for n in tree.body if n not in functions.values()] + [functions["main"], functions[f"cmd_{command}"]]
    seen = set()
    while True:
        names = {n.id for top in reached for n in ast.walk(top) if isinstance(n, ast.Name)}
        new = {f for f in names & functions.keys() if f not in seen and not f.startswith("cmd_")}
        if not new:
            break
        seen |= new
        reached += [functions[f] for f in new]
    # commands.py itself is loaded, but only the imports reached above: its graph entry holds every command's
    g = ig.graph()
    g[commands] = ig.imports_in(reached, commands, False, files) - {commands}
    return ig.closure(g, {"pipeline.__main__"})


def _path(module: str) -> str:
    return ig.module_files()[module].relative_to(REPO).as_posix()


def _covers(dep: str, path: str) -> bool:
    dep = dep.rstrip("/")
    return path == dep or path.startswith(dep + "/")


@pytest.mark.parametrize("stage", [s for s in STAGES if s[1]], ids=lambda s: s[0])
def test_stage_deps_are_the_modules_its_command_imports(stage):
    name, commands, deps, _ = stage
    needed = {_path(m) for c in commands for m in command_modules(c)}
    missing = sorted(p for p in needed if not any(_covers(d, p) for d in deps))
    command = f"python -m pipeline {', '.join(commands)}"
    assert not missing, f"dvc.yaml stage {name} ({command}) misses deps: {', '.join(missing)}"
    code = [d for d in deps if _covers("pipeline", d)]
    files = {
        p.relative_to(REPO).as_posix()
        for d in code
        for p in ([REPO / d] if (REPO / d).is_file() else (REPO / d).rglob("*.py"))
    }
    extra = sorted(files - needed)
    assert not extra, f"dvc.yaml stage {name} depends on {', '.join(extra)}, which its command does not import"


def test_analyze_depends_on_every_sweep_stage():
    """analyze reads the whole sweeps directory: in DVC's graph it follows every sweep stage, however many."""
    sweeps = {s[0] for s in STAGES if "sweep" in s[1]}
    analyze = [s for s in STAGES if "analyze" in s[1]]
    assert sweeps and analyze
    for name, _, _, upstream in analyze:
        assert sweeps <= upstream, f"{name} does not depend on {sorted(sweeps - upstream)}"


def test_closure_follows_imports_inside_functions():
    """cmd_analyze imports analyze and tracking inside the function; analyze imports the wing at its top."""
    mods = command_modules("analyze")
    assert {
        "pipeline.analysis.stage",
        "pipeline.tracking.client",
        "pipeline.analysis.report.document",
        "pipeline.analysis.plots.figures",
        "pipeline.analysis.tables.points",
        "pipeline.config.loader",
        "pipeline.errors",
        "pipeline.__main__",
        "pipeline",
    } <= mods
    assert "pipeline.sweep.stage" not in mods and "pipeline.trial.loop" not in mods
    # data.prepare imports download inside the function: the download stage depends on it
    assert "pipeline.data.download" in command_modules("download")
