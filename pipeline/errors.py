"""The package's user-facing exceptions, each raised where its fault is found; pipeline.user_errors.user_errors
turns them into one paragraph and an exit status. Torch-free, so that commands which never train (analyze) do not
import torch to handle them."""

from __future__ import annotations

import signal


class DataError(RuntimeError):
    """User-facing error; its message is one paragraph naming the problem and the fix."""


class Infeasible(ValueError):
    """This trial cannot run on this host (skipped, with the reason)."""


class TrialFailed(RuntimeError):
    """The trial ran and failed; the message names the rank and the error."""

    def __init__(self, reason: str, kind: str = "error"):
        super().__init__(reason)
        self.kind = kind  # "diverged" | "worker_died" | "timeout" | "oom" | "error"


class PathError(RuntimeError):
    """An output path cannot be written (a directory where a file goes, an existing file, no permission)."""


class StoreError(RuntimeError):
    """The MLflow or Optuna store cannot be used: unreachable, corrupt, read-only or full. Names its (redacted)
    address and what to do."""


class Stopped(RuntimeError):
    """A command stopped on a fault after recording what it could: runs and trials closed FAILED with the reason."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or a termination signal: the process exits with 128 + the signal's number (130, 143)."""

    def __init__(self, signum: int = signal.SIGINT):
        self.signum = int(signum)
        super().__init__(f"interrupted by {signal.Signals(self.signum).name}")


def interruption(e: BaseException) -> Interrupted | None:
    """`e` as an Interrupted when it is one: Ctrl-C, or torch's elastic SignalException (a signal that reached the
    launcher's handlers, e.g. a second Ctrl-C while it tears a trial's workers down); None for any other error."""
    if isinstance(e, Interrupted):
        return e
    if isinstance(e, KeyboardInterrupt):
        return Interrupted(signal.SIGINT)
    sigval = getattr(e, "sigval", None)
    if type(e).__name__ == "SignalException" and sigval is not None:
        return Interrupted(sigval)
    return None
