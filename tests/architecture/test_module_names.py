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

And a module's file name says what its importers call it: no file of pipeline/, tests/, tools/ or benchmarks/ imports
a pipeline module under another name (`from pipeline.config import loader as cfgmod`); it imports the module under
its own (`from pipeline.config import loader`), its package, or the names it uses (KNOWN: the exceptions, none).
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
ROOTS = ("pipeline/", "tests/", "tools/", "benchmarks/")
# Imports of a pipeline module under another name still in the code, `file: module as name`. (This list may only
# shrink; it is empty: every such import uses the module's own name.)
KNOWN: set[str] = set()


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


def renamed_imports(files: list[str], read) -> list[str]:
    """`file:line: import` for every import, in ROOTS, of a pipeline module under a name other than its own."""
    modules = {f[:-3].replace("/", ".").removesuffix(".__init__") for f in files if f.endswith(".py")}
    out = []
    for f in [f for f in files if f.endswith(".py") and f.startswith(ROOTS)]:
        package = f[:-3].split("/")[:-1]
        for node in ast.walk(ast.parse(read(f))):
            if isinstance(node, ast.Import):
                named = [(a.name, a) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                frm = ".".join([*base, *([node.module] if node.module else [])])
                named = [(f"{frm}.{a.name}", a) for a in node.names]
            else:
                continue
            for module, a in named:
                own = module.rsplit(".", 1)[-1]
                if a.asname and a.asname != own and module in modules and module.startswith("pipeline."):
                    out.append(f"{f}:{node.lineno}: {module} as {a.asname}")
    return out


def test_a_module_is_imported_under_its_own_name():
    renamed = {re.sub(r":\d+:", ":", r) for r in renamed_imports(_tracked(), lambda f: (REPO / f).read_text())}
    assert not renamed - KNOWN, "pipeline modules imported under another name (import each as its file is named):\n" + (
        "\n".join(sorted(renamed - KNOWN))
    )
    assert not KNOWN - renamed, f"KNOWN lists imports no longer in the code, drop them: {sorted(KNOWN - renamed)}"


def test_a_renamed_import_is_found(tmp_path):
    """The check can fail: a module imported under another name (from-import, relative, in a function, or `import ...
    as`) is found; the module under its own name, a function under another name, and a file outside ROOTS are not."""
    src = {
        "pipeline/__init__.py": "",
        "pipeline/config/__init__.py": "from . import loader as cfg\n",
        "pipeline/config/loader.py": "def load(): pass\n",
        "tests/test_x.py": (
            "from pipeline.config import loader as configmod\n"
            "from pipeline.config import loader\n"
            "from pipeline.config.loader import load as read\n"
            "import pipeline.config.loader as c\n"
            "import pipeline.config.loader as loader\n"
            "import numpy as np\n"
            "def f():\n"
            "    from pipeline import config as settings\n"
        ),
        "docs/x.py": "from pipeline.config import loader as elsewhere\n",
    }
    for f, text in src.items():
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text(text)
    assert renamed_imports(list(src), lambda f: (tmp_path / f).read_text()) == [
        "pipeline/config/__init__.py:1: pipeline.config.loader as cfg",
        "tests/test_x.py:1: pipeline.config.loader as configmod",
        "tests/test_x.py:4: pipeline.config.loader as c",
        "tests/test_x.py:8: pipeline.config as settings",
    ]
