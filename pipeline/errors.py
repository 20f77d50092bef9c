"""The package's user-facing exceptions, and the handler that turns them into a one-paragraph message and an exit
status (no traceback). Torch-free, so that commands which never train (analyze) do not import torch to handle them."""
from __future__ import annotations

import contextlib
import sys
import textwrap


class DataError(RuntimeError):
    """User-facing error; its message is one paragraph naming the problem and the fix."""


class Infeasible(ValueError):
    """This trial cannot run on this host (skipped, with the reason)."""


class TrialFailed(RuntimeError):
    """The trial ran and failed; the message names the rank and the error."""

    def __init__(self, reason: str, kind: str = "error"):
        super().__init__(reason)
        self.kind = kind  # "diverged" | "worker_died" | "timeout" | "oom" | "error"


# modules of the optional extras (pyproject.toml), and the extra that installs each
EXTRAS = {"mlflow": "pipeline", "optuna": "pipeline", "dvc": "pipeline", "pandas": "pipeline",
          "matplotlib": "pipeline", "torchvision": "download"}


class _Status:
    code = 0


@contextlib.contextmanager
def user_errors():
    from .config import ConfigError
    status = _Status()
    try:
        yield status
    except (ConfigError, Infeasible, DataError) as e:
        _say(f"error: {e}")
        status.code = 2  # bad input: nothing was run
    except TrialFailed as e:
        _say(f"error: the trial failed ({e.kind}): {e}")
        status.code = 1
    except KeyboardInterrupt:
        _say("interrupted")
        status.code = 130
    except ModuleNotFoundError as e:
        top = (e.name or "").split(".")[0]
        if top not in EXTRAS:
            raise
        hint = ("; torchvision must be the build made for your torch (0.26 for torch 2.11, 0.29 for 2.14), so install "
                "the matching version by name rather than the newest" if top == "torchvision" else "")
        _say(f"error: this command needs {top}, which is not installed: the training core and `doctor` run without "
             f"it, the pipeline does not. Install the extra: pip install -e '.[{EXTRAS[top]}]' (or `make setup`, "
             f"which installs the tested set){hint}.")
        status.code = 2


def _say(msg: str) -> None:
    print(textwrap.fill(msg, width=100, break_long_words=False, break_on_hyphens=False), file=sys.stderr)
