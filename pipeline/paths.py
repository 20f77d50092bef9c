"""Where things are: the checkout a command runs in, and the root its shared stores hang from; and whether a path
fits the file system (too_long).

The checkout (repo_root) holds params.yaml, experiments/, data/, results/ and runs/; the store root (store_root)
holds mlruns/: the MLflow and Optuna databases, MLflow's artifacts and the lock that serializes their creation.
They are one directory except under DVC's `dvc exp run --temp` and queued (`--queue`, `dvc queue start -j N`)
executors: DVC runs the stage in a temp checkout of the experiment (cwd = the stage's wdir there, under
<repo>/.dvc/tmp/exps/) and sets $DVC_ROOT to the parent repository. The experiment's params and results are the
checkout's (DVC collects its outputs from there); its runs go to the parent's stores, one MLflow and one Optuna
store for every experiment, which outlive the temp checkout.
"""

from __future__ import annotations

import os
from pathlib import Path


def _nearest_project(start: Path) -> Path | None:
    """The nearest directory, from start upwards, that holds dvc.yaml or params.yaml."""
    for d in (start, *start.parents):
        if (d / "dvc.yaml").exists() or (d / "params.yaml").exists():
            return d
    return None


def repo_root() -> Path:
    """The checkout being run. Under DVC ($DVC_STAGE set) the project the stage's working directory is in: the
    workspace, or the executor's temp checkout. Otherwise $DVC_ROOT if set, else the nearest directory with
    dvc.yaml or params.yaml, else the current one."""
    here = Path.cwd().resolve()
    if os.environ.get("DVC_STAGE") and (found := _nearest_project(here)):
        return found
    if os.environ.get("DVC_ROOT"):
        return Path(os.environ["DVC_ROOT"]).resolve()
    return _nearest_project(here) or here


def store_root() -> Path:
    """Where mlruns/ hangs from: $DVC_ROOT if set (the parent repository under every DVC executor, the workspace
    itself under `dvc repro` and a plain `dvc exp run`), else repo_root()."""
    if os.environ.get("DVC_ROOT"):
        return Path(os.environ["DVC_ROOT"]).resolve()
    return repo_root()


# one name of a path at most 255 bytes (ext4, xfs, btrfs, tmpfs), a whole path at most 4096 (Linux's PATH_MAX)
NAME_MAX_BYTES = 255
PATH_MAX_BYTES = 4096


def too_long(path) -> str | None:
    """Why the file system refuses `path` ("has a name of 300 bytes ..."), or None when it fits. Checked before a
    path from the user is used, so that the refusal names the setting or option instead of an OSError ("File name too
    long") from wherever the path is first opened."""
    text = os.fsencode(os.path.abspath(os.fspath(path)))
    name = max(text.split(b"/"), key=len)
    if len(name) > NAME_MAX_BYTES:
        shown = os.fsdecode(name)
        return (
            f"has a name of {len(name)} bytes ({shown[:20]}...{shown[-20:]}), longer than the {NAME_MAX_BYTES} "
            f"bytes a file system allows for one name"
        )
    if len(text) > PATH_MAX_BYTES:
        return f"is {len(text)} bytes long (made absolute), longer than the {PATH_MAX_BYTES} bytes Linux allows"
    return None
