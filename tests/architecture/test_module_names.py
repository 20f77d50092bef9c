"""Every module a docstring, comment or doc names exists: a renamed or removed file leaves no pointer to nowhere.

Read in every tracked Python file (its docstrings and comments) and in the docs (README.md, CONTRIBUTING.md,
docs/*.md). A name `x.py` (or `wing/x.py`) must be a tracked file; a dotted `pipeline.a.b.name` must resolve, read
with `ast` (nothing imported): its longest module prefix is a tracked module, the next part a name that module
defines at its top (a function, class, constant or import), and a part after a class a name in that class's body.
A short pointer `module.name` (`claims.claimed`, `points.timed`), where `module` is the file name of a pipeline/
module or folder, must name what one such module defines (at its top or in one of its classes), except where the
word is also a config section or a common object (AMBIGUOUS: `train.lr` is a key, `trial.number` Optuna's).
Paths inside the libraries Parallax reads (`torch/...`, `dvc/...`) and the few bare names of such files listed in
ELSEWHERE are not the repository's.
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
    "my_stores.py": "the user's own module, docs/usage.md",
}
PLACEHOLDERS = ("NAME", "pipeline.x.", "pipeline/x/")
FILE = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.py)\b")
MODULE = re.compile(r"\bpipeline(?:\.\w+)+")
DOCS = ("README.md", "CONTRIBUTING.md")
SHORT = re.compile(r"(?<![\w./-])([a-z_][a-z0-9_]*)\.([A-Za-z_]\w*)\b(?!\.\w|/|-)")
AMBIGUOUS = {"data", "train", "sweep", "tracking", "analyze", "overlap", "collectives", "slurm", "space", "spaces"}
AMBIGUOUS |= {"pipeline", "model", "trial", "report", "study", "run", "config", "store", "cfg", "self"}
SUFFIXES = {"py", "md", "json", "jsonl", "yaml", "yml", "csv", "png", "txt", "pt", "lock", "toml", "html", "db"}


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


def _lines(src: str):
    """(line, text) of every line of a doc."""
    yield from enumerate(src.splitlines(), 1)


def _names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """The names a module's (or a class's) body defines, each with the node that defines it."""
    out: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        out[n.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                out[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, (ast.If, ast.Try)):  # names defined under `if TYPE_CHECKING:` or `try: import`
            inner = node.body + node.orelse + [s for h in getattr(node, "handlers", []) for s in h.body]
            out.update(_names(inner))
    return out


def resolves(dotted: str, modules: dict[str, str], read) -> bool:
    """Whether `pipeline.a.b.name[.attr]` is a module, or a name defined in one (and, after a class, in its body)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in modules:
            break
    else:
        return False
    rest = parts[i:]
    if not rest:
        return True
    defined = _defined(modules[".".join(parts[:i])], read)
    node = defined.get(rest[0])
    if node is None:
        return False
    if len(rest) > 1 and isinstance(node, ast.ClassDef):
        return rest[1] in _names(node.body) or any(
            isinstance(n, ast.Attribute) and n.attr == rest[1] for n in ast.walk(node)
        )  # an instance attribute set in a method (self.name = ...)
    return True


_PARSED: dict[str, dict[str, ast.AST]] = {}


def _defined(path: str, read) -> dict[str, ast.AST]:
    if path not in _PARSED:
        _PARSED[path] = _names(ast.parse(read(path)).body)
    return _PARSED[path]


def _short_resolves(base: str, name: str, modules: dict[str, str], read) -> bool:
    """Whether a module (or package) whose file name is `base` defines `name`, at its top or in one of its classes."""
    for module, path in modules.items():
        if module.rsplit(".", 1)[-1] != base:
            continue
        defined = _defined(path, read)
        if name in defined or f"{module}.{name}" in modules:
            return True
        if any(isinstance(n, ast.ClassDef) and name in _names(n.body) for n in defined.values()):
            return True
    return False


def stale_names(files: list[str], read) -> list[str]:
    """`file:line: name` for every module name, file or dotted pointer that points nowhere."""
    _PARSED.clear()
    names = {f.rsplit("/", 1)[-1] for f in files if f.endswith(".py")}
    modules = {f[:-3].replace("/", ".").removesuffix(".__init__"): f for f in files if f.endswith(".py")}
    docs = [f for f in files if f in DOCS or (f.startswith("docs/") and f.endswith(".md"))]
    bases = {m.rsplit(".", 1)[-1] for m in modules if m.startswith("pipeline.")} - AMBIGUOUS
    out = []
    for f in [f for f in files if f.endswith(".py")] + docs:
        texts = _texts(read(f)) if f.endswith(".py") else _lines(read(f))
        for line, text in texts:
            for name in FILE.findall(text):
                if name.startswith(LIBRARIES) or name in ELSEWHERE or any(p in name for p in PLACEHOLDERS):
                    continue
                if not (name in names if "/" not in name else any(g == name or g.endswith("/" + name) for g in files)):
                    out.append(f"{f}:{line}: {name}")
            for dotted in MODULE.findall(text):
                if any(p in dotted for p in PLACEHOLDERS) or resolves(dotted.removesuffix(".py"), modules, read):
                    continue
                out.append(f"{f}:{line}: {dotted}")
            for base, name in SHORT.findall(text):
                if base in bases and name not in SUFFIXES and not _short_resolves(base, name, modules, read):
                    out.append(f"{f}:{line}: {base}.{name}")
    return out


def test_every_named_module_exists():
    files = [f for f in _tracked() if f != "tests/architecture/test_module_names.py"]  # its examples are made up
    stale = stale_names(files, lambda f: (REPO / f).read_text())
    assert not stale, "docstrings, comments and docs name modules that do not exist:\n" + "\n".join(stale)


def test_a_stale_name_is_found():
    """The check can fail: a docstring naming a removed module and a comment naming a dotted one are both found."""
    files = ["pipeline/a.py", "pipeline/__init__.py"]
    src = {
        "pipeline/a.py": '"""Built on gone.py and torch/nn/x.py."""\nx = 1  # see pipeline.gone.f\n',
        "pipeline/__init__.py": "",
    }
    assert stale_names(files, src.__getitem__) == ["pipeline/a.py:1: gone.py", "pipeline/a.py:2: pipeline.gone.f"]


def test_a_dotted_name_must_name_an_attribute():
    """`pipeline.a.f` and `pipeline.a.C.m` resolve to what module a defines, and so do the short `a.f` and `a.m`;
    `pipeline.a.g`, `pipeline.a.C.n`, `a.k` and the same in a doc's prose (or a path `pipeline/b.py`) do not."""
    files = ["pipeline/__init__.py", "pipeline/a.py", "pipeline/data.py", "docs/x.md"]
    src = {
        "pipeline/data.py": "",
        "pipeline/__init__.py": "",
        "pipeline/a.py": (
            '"""Uses pipeline.a.f, pipeline.a.C.m, pipeline.a.C.n and pipeline.a.g."""\n'
            "def f(): pass\n"
            "class C:\n"
            "    def m(self): pass\n"
        ),
        "docs/x.md": "See `pipeline.a.f`, `pipeline.a.h()` and pipeline/b.py.\nShort: `a.f`, `a.m`, `a.k`, `data.x`.\n",
    }
    assert stale_names(files, src.__getitem__) == [
        "pipeline/a.py:1: pipeline.a.C.n",
        "pipeline/a.py:1: pipeline.a.g",
        "docs/x.md:1: pipeline/b.py",
        "docs/x.md:1: pipeline.a.h",
        "docs/x.md:2: a.k",
    ]
