"""Every module a docstring or comment names exists: a renamed or removed file leaves no pointer to nowhere.

Read in every tracked Python file: its docstrings and comments. A name `x.py` (or `wing/x.py`) must be a tracked
file; a dotted `pipeline.a.b` must start with a tracked module. Paths inside the libraries Parallax reads (`torch/...`,
`dvc/...`) and the few bare names of such files listed in ELSEWHERE are not the repository's.
"""

from __future__ import annotations

import ast
import re
import subprocess

from tests.project import REPO

LIBRARIES = ("torch/", "dvc/", "optuna/", "mlflow/", "torchvision/")
ELSEWHERE = {
    "d2l_reference.py": "the seeds' recipe, ../shared/peers/",
    "replicate.py": "torch/nn/parallel/replicate.py",
    "data_parallel.py": "torch/nn/parallel/data_parallel.py",
    "distributed_c10d.py": "torch/distributed/distributed_c10d.py",
}
PLACEHOLDERS = ("NAME", "pipeline.x.")
FILE = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.py)\b")
MODULE = re.compile(r"\bpipeline(?:\.\w+)+")


def _tracked() -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()


def _texts(src: str):
    """(line, text) of every docstring and comment of one module."""
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield getattr(node, "lineno", 1), doc
    for n, line in enumerate(src.splitlines(), 1):
        if "#" in line:
            yield n, line[line.index("#") :]


def stale_names(files: list[str], read) -> list[str]:
    """`file:line: name` for every module name that points nowhere."""
    names = {f.rsplit("/", 1)[-1] for f in files if f.endswith(".py")}
    modules = {f[:-3].replace("/", ".").removesuffix(".__init__") for f in files if f.endswith(".py")}
    out = []
    for f in (f for f in files if f.endswith(".py")):
        for line, text in _texts(read(f)):
            for name in FILE.findall(text):
                if name.startswith(LIBRARIES) or name in ELSEWHERE or any(p in name for p in PLACEHOLDERS):
                    continue
                if not (name in names if "/" not in name else any(g == name or g.endswith("/" + name) for g in files)):
                    out.append(f"{f}:{line}: {name}")
            for dotted in MODULE.findall(text):
                parts = dotted.split(".")
                if any(p in dotted for p in PLACEHOLDERS) or ".".join(parts[:2]) in modules:
                    continue
                out.append(f"{f}:{line}: {dotted}")
    return out


def test_every_named_module_exists():
    files = [f for f in _tracked() if f != "tests/architecture/test_module_names.py"]  # its examples are made up
    stale = stale_names(files, lambda f: (REPO / f).read_text())
    assert not stale, "docstrings and comments name modules that do not exist:\n" + "\n".join(stale)


def test_a_stale_name_is_found():
    """The check can fail: a docstring naming a removed module and a comment naming a dotted one are both found."""
    files = ["pipeline/a.py", "pipeline/__init__.py"]
    src = {
        "pipeline/a.py": '"""Built on gone.py and torch/nn/x.py."""\nx = 1  # see pipeline.gone.f\n',
        "pipeline/__init__.py": "",
    }
    assert stale_names(files, src.__getitem__) == ["pipeline/a.py:1: gone.py", "pipeline/a.py:2: pipeline.gone.f"]
