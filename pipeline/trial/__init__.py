"""One training trial: the loop, its launch in-process or on elastic ranks.

The face is lazy: importing one module of this folder does not load the others (torch, mlflow).
"""

import importlib

_FACE = {
    "run_trial": "launch",
    "check_feasible": "launch",
    "check_batch_fits": "launch",
    "train": "loop",
}
__all__ = sorted(_FACE)


def __getattr__(name: str):
    if name in _FACE:
        return getattr(importlib.import_module(f"{__name__}.{_FACE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
