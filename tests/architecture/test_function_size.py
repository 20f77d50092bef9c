"""The sweep's and the trial's functions stay small, read from the code with `ast` (nothing is imported or run): no
function (methods and nested ones too) of pipeline/sweep/ or pipeline/trial/ takes more than MAX_PARAMS parameters
(`self` and `cls` not counted; `*args` and `**kwargs` counted) or runs over MAX_LINES lines. A sweep's context
travels as one value (sweep/worker.py's Sweep, trial/lifecycle.py's How), never as loose parameters.

A step takes the run's Learner (strategies/base.py: the model, its criterion and optimizer, built once) and its
batch. The loop's `train` reads best inline as it is: the one exception in KNOWN, whose cap may only shrink."""

from __future__ import annotations

import ast
from pathlib import Path

from ..conftest import REPO
from . import import_graph as ig

MAX_PARAMS = 6
MAX_LINES = 60
FOLDERS = ("pipeline.sweep.", "pipeline.trial.")

# module.function -> (parameters, lines) it may have at most; a cap may only shrink
KNOWN = {
    "pipeline.trial.loop.train": (6, 63),
}


def sizes(root: Path = REPO) -> dict[str, tuple[int, int]]:
    """module.function -> (its parameters, its lines), for every function of pipeline/sweep/ and pipeline/trial/
    over either limit (the largest where one name is defined twice in a module)."""
    out: dict[str, tuple[int, int]] = {}
    for module, path in ig.module_files(root).items():
        if not module.startswith(FOLDERS):
            continue
        for node in ast.walk(ig.parse(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = (_params(node.args), node.end_lineno - node.lineno + 1)
                if size[0] > MAX_PARAMS or size[1] > MAX_LINES:
                    name = f"{module}.{node.name}"
                    out[name] = max(size, out.get(name, size))
    return out


def _params(args: ast.arguments) -> int:
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return len(names) - (1 if names and names[0] in ("self", "cls") else 0)


def test_no_sweep_or_trial_function_takes_too_many_parameters_or_lines():
    over = {
        f: size
        for f, size in sizes().items()
        if size[0] > KNOWN.get(f, (MAX_PARAMS, MAX_LINES))[0] or size[1] > KNOWN.get(f, (MAX_PARAMS, MAX_LINES))[1]
    }
    assert not over, (
        f"functions of pipeline/sweep/ or pipeline/trial/ over {MAX_PARAMS} parameters or {MAX_LINES} lines (or over "
        f"their cap in KNOWN), as (parameters, lines): {over}; pass the context they share as one value (a dataclass "
        f"built once) and split each by idea"
    )


def test_a_cap_that_is_no_longer_needed_comes_off_the_list():
    found = sizes()
    needed = {f: (max(n, MAX_PARAMS), max(lines, MAX_LINES)) for f, (n, lines) in found.items()}
    loose = {f: cap for f, cap in KNOWN.items() if cap != needed.get(f)}
    assert not loose, f"caps in KNOWN other than what the code needs (now {[needed.get(f) for f in loose]}): {loose}"


def test_the_check_sees_what_it_forbids(tmp_path):
    """The check itself: seven parameters and 61 lines are found, six parameters with self and 60 lines are not."""
    pkg = tmp_path / "pipeline"
    for folder in ("sweep", "trial", "cli"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    body = "".join(f"    x = {i}\n" for i in range(MAX_LINES - 2))
    (pkg / "sweep" / "wide.py").write_text(
        "def seven(a, b, c, d, e, f, *g):\n    pass\n\n\nclass C:\n    def six(self, a, b, c, d, e, f):\n        pass\n"
    )
    (pkg / "trial" / "long.py").write_text(
        f"def fits():\n{body}    return x\n\n\ndef over():\n{body}    x = 1\n    return x\n"
    )
    (pkg / "cli" / "free.py").write_text("def anything(a, b, c, d, e, f, g, h):\n    pass\n")
    assert sizes(tmp_path) == {"pipeline.sweep.wide.seven": (7, 2), "pipeline.trial.long.over": (0, MAX_LINES + 1)}
