"""Signals in the main thread: SIGTERM raised as Interrupted (`on_sigterm`), and Ctrl-C and SIGTERM held over a few
store writes that must not be cut in two (`signals_deferred`)."""

from __future__ import annotations

import contextlib
import signal
import threading

from pipeline.errors import Interrupted


def on_sigterm(signum, frame):
    raise Interrupted(signum)  # unwinds like Ctrl-C: runs and trials are ended KILLED, nothing left RUNNING


@contextlib.contextmanager
def signals_deferred():
    """Hold Ctrl-C and SIGTERM over a few store writes that must not be cut in two (a trial's claim, its owner and
    first heartbeat); a signal that came meanwhile is raised again at the end, to the handler it would have met."""
    if not threading_main():
        yield
        return
    got: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)  # None: a handler set outside Python
        if got:
            signal.raise_signal(got[0])


def threading_main() -> bool:
    return threading.current_thread() is threading.main_thread()
