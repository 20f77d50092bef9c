"""A copy of the project for the tests that run it whole (DVC, the pipeline, git): every tracked file as the working
tree has it (the code under test), except those a run of the pipeline or `dvc exp run -S` rewrites, taken as
committed, so that no test depends on what an earlier run or experiment left in the user's working tree. (So an edit
of params.yaml reaches these tests once it is committed.)"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = next(p for p in Path(__file__).resolve().parents if (p / "dvc.yaml").is_file())
RUN_STATE = ("params.yaml",)  # what `dvc exp run -S KEY=VALUE` writes into the workspace


def _committed(path: str) -> bytes | None:
    p = subprocess.run(["git", "show", f"HEAD:{path}"], cwd=REPO, capture_output=True)
    return p.stdout if p.returncode == 0 else None


def copy_tracked(dst: Path, extra: tuple[str, ...] = ()) -> Path:
    """dst holding the project's tracked files (and `extra` paths, tracked or not); returns dst."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
    for f in [*files, *extra]:
        if (REPO / f).is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, dst / f)
    for f in RUN_STATE:
        if (committed := _committed(f)) is not None:
            (dst / f).write_bytes(committed)
    return dst
