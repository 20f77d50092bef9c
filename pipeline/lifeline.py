"""`lifeline`: a stage command run by DVC stops as on SIGTERM once the process that ran it is gone."""

from __future__ import annotations

import contextlib
import os
import signal
import threading

from pipeline.signals import threading_main
from pipeline.user_errors import say

# DVC runs a stage's cmd as `$SHELL -c CMD` (dvc/stage/run.py); a shell that does not exec the command stays between
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "fish", "ksh", "mksh", "busybox"})
LIFELINE_S = 1.0  # how often a stage command run by DVC looks for the process that ran it


def runner() -> tuple[int, str, str | None] | None:
    """The process that ran this stage command, as (pid, command name, start time): under DVC (which sets DVC_STAGE
    for every stage command) the nearest ancestor that is not a shell; None outside DVC. Start time None: the system
    does not show that process, and only the parent pid is watched."""
    if not os.environ.get("DVC_STAGE"):
        return None
    from pipeline import processes  # psutil: only a stage command run by DVC pays its import

    pid = os.getppid()
    for _ in range(8):
        name, ppid, start = processes.name(pid), processes.parent(pid), processes.started(pid)
        if name is None or ppid is None or start is None:
            return pid, "its parent", None
        if name not in _SHELLS or ppid <= 1:
            break
        pid = ppid
    return pid, name, start


def _is_gone(pid: int, start: str | None, parent: int) -> bool:
    if os.getppid() != parent:  # the parent (DVC, or the shell between) died: this process was re-parented
        return True
    if start is None:
        return False
    from pipeline import processes

    return processes.running(pid) is False or not processes.same_start(processes.started(pid), start)


@contextlib.contextmanager
def lifeline(poll_s: float = LIFELINE_S):
    """A stage command run by DVC stops as on SIGTERM once the process that ran it is gone. DVC has no SIGTERM
    handler: a `kill` of `dvc repro` or `dvc exp run` ends DVC at once and leaves its stage command running, a writer
    in the workspace that nobody records. Outside DVC (no DVC_STAGE) nothing is watched: a sweep started with nohup
    outlives its shell, by design."""
    found = runner() if threading_main() else None
    if found is None:
        yield
        return
    (pid, name, start), parent, stop = found, os.getppid(), threading.Event()

    def watch():
        while not stop.wait(poll_s):
            if _is_gone(pid, start, parent):
                try:
                    say(f"the process that ran this stage ({name}, pid {pid}) is gone: stopping as on SIGTERM")
                except (OSError, ValueError):  # its terminal or pipe went with it
                    pass
                os.kill(os.getpid(), signal.SIGTERM)  # the main thread unwinds as on `kill`: nothing left RUNNING
                return

    threading.Thread(target=watch, daemon=True, name="parallax-lifeline").start()
    try:
        yield
    finally:
        stop.set()
