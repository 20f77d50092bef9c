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
