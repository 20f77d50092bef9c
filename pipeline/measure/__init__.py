"""What a trial measures: the throughput meter, the step breakdown, communication, memory, interference.

The face is lazy: importing one module of this folder does not load the others (torch, mlflow).
"""

import importlib

_FACE = {
    "Meter": "meter",
    "Breakdown": "breakdown",
    "NO_CLOCK": "breakdown",
    "NoComm": "comm_probes",
    "DDPStats": "comm_probes",
    "ProfiledComm": "comm_probes",
    "memory_meter": "memory",
    "Monitor": "interference",
}
__all__ = sorted(_FACE)


def __getattr__(name: str):
    if name in _FACE:
        return getattr(importlib.import_module(f"{__name__}.{_FACE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
