"""MLflow, and only here: trial and analysis runs, the UI's shared view.

The face is lazy: importing one module of this folder does not load the others (torch, mlflow).
"""

import importlib

_FACE = {
    "Tracker": "client",
    "TrialRun": "trial_run",
    "log_analysis_run": "analysis_run",
    "publish_view": "ui_view",
}
__all__ = sorted(_FACE)


def __getattr__(name: str):
    if name in _FACE:
        return getattr(importlib.import_module(f"{__name__}.{_FACE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
