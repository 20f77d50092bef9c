"""The data set on disk and in memory: download or synthesise, check, load, shard into batches.

The face is lazy: importing one module of this folder does not load the others (torch, mlflow).
"""

import importlib

_FACE = {
    "prepare": "store",
    "load": "store",
    "Dataset": "store",
    "epoch_batches": "store",
    "normalize": "store",
    "make_synthetic": "synthetic",
}
__all__ = sorted(_FACE)


def __getattr__(name: str):
    if name in _FACE:
        return getattr(importlib.import_module(f"{__name__}.{_FACE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
