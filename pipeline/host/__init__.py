"""What this host offers: devices, their capabilities, the loopback interface.

The face is lazy: importing one module of this folder does not load the others (torch, mlflow).
"""

import importlib

_FACE = {
    "probe": "devices",
    "Host": "devices",
    "device_for": "devices",
    "host_capabilities": "capabilities",
}
__all__ = sorted(_FACE)


def __getattr__(name: str):
    if name in _FACE:
        return getattr(importlib.import_module(f"{__name__}.{_FACE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
