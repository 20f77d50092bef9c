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


def _say(msg: str) -> None:
    print(textwrap.fill(msg, width=100, break_long_words=False, break_on_hyphens=False), file=sys.stderr)
