"""Every third-party import in what the project ships (pipeline/, and benchmarks/, which the GPU bundle carries) comes
from a distribution that pyproject.toml declares: in [project.dependencies], or in the extra of the code that imports
it (EXTRAS). The imports are read with `ast`, lazy and optional ones included; importlib.metadata maps an import
name to the distributions that provide it. A package present only because another one pulls it in breaks when that
one drops it."""

from __future__ import annotations

import ast
import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ..conftest import REPO

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

SHIPPED = ("pipeline", "benchmarks")

# The extras a file's imports may come from, beside the core dependencies: the longest matching path prefix wins.
EXTRAS = {
    "pipeline/analysis/": {"pipeline"},
    "pipeline/sweep/": {"pipeline"},
    "pipeline/sweep/slurm.py": {"pipeline", "slurm"},
    "pipeline/tracking/": {"pipeline"},
    "pipeline/records/table.py": {"pipeline"},  # a sweep table read back as a DataFrame (the analysis)
    "pipeline/cli/compare.py": {"pipeline"},
    "pipeline/cli/dashboard.py": {"pipeline"},
    "pipeline/cli/repro_plan.py": {"pipeline"},  # DVC's own status and plan, before `dvc repro` starts
    "pipeline/data/download.py": {"download"},
    "pipeline/zoo.py": {"download"},  # torchvision's classifiers by name (none without it)
    "pipeline/models.py": {"download"},
    "pipeline/doctor/bundle.py": {"dev"},  # `make gpu-bundle` on the set-up host (tomli on Python 3.10)
    "pipeline/measure/interference.py": {"gpu"},  # NVML samples of a trial's GPUs
    "pipeline/measure/memory.py": {"gpu"},  # NVML-used memory of a trial's GPUs
    "benchmarks/gpu/": {"gpu"},
}

# import names whose distribution this environment may lack (so metadata cannot map them): the distribution that
# provides each
NOT_HERE = {"pynvml": "nvidia-ml-py", "tomli": "tomli"}


def imports(root=REPO) -> dict[str, set[str]]:
    """file (relative to root) -> the top-level names of its absolute imports that are not the standard library's
    and not the project's own."""
    own = {"pipeline", "benchmarks", "tests", "tools", "__future__"}
    out: dict[str, set[str]] = {}
    for folder in SHIPPED:
        for path in sorted((root / folder).rglob("*.py")):
            names = set()
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names |= {a.name.partition(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names.add(node.module.partition(".")[0])
            names -= own | set(sys.stdlib_module_names)
            if names:
                out[str(path.relative_to(root))] = names
    return out


def declared(pyproject: dict) -> dict[str, set[str]]:
    """'' (the core) and each extra -> the normalised names of the distributions it declares."""
    project = pyproject["project"]
    groups = {"": project.get("dependencies", []), **project.get("optional-dependencies", {})}
    return {k: {canonicalize_name(Requirement(r).name) for r in reqs} for k, reqs in groups.items()}


def extras_of(file: str) -> set[str]:
    found = [prefix for prefix in EXTRAS if file.startswith(prefix)]
    return EXTRAS[max(found, key=len)] if found else set()


def undeclared(found: dict[str, set[str]], groups: dict[str, set[str]], providers: dict) -> list[str]:
    """`file: name (distributions)` for every import no distribution of the core or the file's extras provides."""
    out = []
    for file, names in sorted(found.items()):
        allowed = set().union(groups[""], *(groups.get(e, set()) for e in extras_of(file)))
        for name in sorted(names):
            dists = {canonicalize_name(d) for d in providers.get(name, [])} or {
                canonicalize_name(NOT_HERE.get(name, name))
            }
            if not dists & allowed:
                out.append(f"{file}: {name} ({', '.join(sorted(dists))}; may come from {sorted(extras_of(file))})")
    return out


def test_every_import_is_declared_by_the_extra_that_uses_it():
    groups = declared(tomllib.loads((REPO / "pyproject.toml").read_text()))
    missing = undeclared(imports(), groups, metadata.packages_distributions())
    assert not missing, (
        "imported but not declared in pyproject.toml (the core or the file's extra, EXTRAS above): "
        + "; ".join(missing)
    )


def test_every_extra_named_here_is_declared():
    groups = declared(tomllib.loads((REPO / "pyproject.toml").read_text()))
    assert {e for x in EXTRAS.values() for e in x} <= groups.keys(), "EXTRAS names an extra pyproject.toml lacks"


def test_the_names_not_installed_here_are_named_rightly():
    """NOT_HERE stands in only where metadata cannot answer: where the distribution is installed, it agrees."""
    providers = metadata.packages_distributions()
    for name, dist in NOT_HERE.items():
        if name in providers:
            assert canonicalize_name(dist) in {canonicalize_name(d) for d in providers[name]}, (name, providers[name])


def test_an_undeclared_import_is_found(tmp_path):
    """The check itself: a lazy import of a package only another one pulls in is found, in the core and in an
    extra's file; one the file's extra declares is not."""
    for rel, text in {
        "pipeline/a.py": "def f():\n    import sqlalchemy\n",
        "pipeline/sweep/b.py": "import optuna\nfrom PIL import Image\n",
        "benchmarks/c.py": "import os, torch\n",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    groups = {"": {"torch"}, "pipeline": {"optuna"}}
    providers = {"sqlalchemy": ["SQLAlchemy"], "PIL": ["pillow"], "optuna": ["optuna"], "torch": ["torch"]}
    found = imports(tmp_path)
    assert found == {
        "pipeline/a.py": {"sqlalchemy"},
        "pipeline/sweep/b.py": {"optuna", "PIL"},
        "benchmarks/c.py": {"torch"},
    }
    assert [m.partition(" (")[0] for m in undeclared(found, groups, providers)] == [
        "pipeline/a.py: sqlalchemy",
        "pipeline/sweep/b.py: PIL",
    ]
