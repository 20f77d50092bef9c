"""Where the repository is: the root that mlruns/, runs/, results/, params.yaml and experiments/ hang from."""
from __future__ import annotations

import os
from pathlib import Path


def repo_root() -> Path:
    """The repository root: $DVC_ROOT under DVC (also `dvc exp run --temp`), else the nearest dir with dvc.yaml."""
    if os.environ.get("DVC_ROOT"):
        return Path(os.environ["DVC_ROOT"]).resolve()
    here = Path.cwd().resolve()
    for d in (here, *here.parents):
        if (d / "dvc.yaml").exists() or (d / "params.yaml").exists():
            return d
    return here


def option_path(text: str) -> Path:
    """argparse type of a path option (--out, --params, ...): never empty. Path("") is ".", so `--out ""` (an unset
    shell variable) would write, and clear old outputs, in whatever directory the command runs in."""
    if not text.strip():
        import argparse
        raise argparse.ArgumentTypeError("the path is empty (an unset shell variable?), and an empty path would "
                                         "silently mean the current directory. Give the path (`.` for the current "
                                         "directory). Nothing was run.")
    return Path(text)
