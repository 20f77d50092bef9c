"""Other processes on this host, through psutil (Linux and macOS alike): a process's start, an identity that a reused
pid does not share, and whether the process still runs. The sweep's claims (who holds a trial) and a DVC stage's
lifeline (is the process that ran it still there) both ask these two questions.

A start is the time from the host's boot to the process's start, in clock ticks (SC_CLK_TCK), as a decimal string.
On Linux it is the `starttime` field of /proc/<pid>/stat, the form claims in an Optuna store already hold, so a
claim written by any version reads the same. psutil gives a start as epoch seconds, which move with the wall clock
(an NTP step shifts every process's start); less the host's boot time, which moves with it, it stays put. Two
starts are the same process's when they differ by at most one second: a float's rounding, or a wall-clock step
between the two reads, moves a start by a tick or a second, and a pid is not reused within a second of its start.
"""

from __future__ import annotations

import os

import psutil

# clock ticks a second; 100 on Linux and macOS
HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def started(pid: int) -> str | None:
    """The process's start in clock ticks after boot (see the module's docstring); None where it cannot be read (gone,
    or another user's where the system hides it)."""
    try:
        since_boot = psutil.Process(pid).create_time() - psutil.boot_time()
    except (psutil.Error, OSError, TypeError, ValueError):
        return None
    return str(round(since_boot * HZ))


def same_start(a: str | None, b: str | None) -> bool:
    """Whether two starts (`started`) are one process's: within a second of each other."""
    if a is None or b is None:
        return a == b
    try:
        return abs(int(a) - int(b)) <= HZ
    except (TypeError, ValueError):
        return str(a) == str(b)


def running(pid: int) -> bool | None:
    """True if the process exists and has not exited (a zombie, not yet reaped by its parent, has exited); False if
    not; None where the system does not say (another user's process on a host that hides it counts as running)."""
    try:
        status = psutil.Process(pid).status()
    except psutil.NoSuchProcess:  # psutil.ZombieProcess too, where the system refuses a zombie's status
        return False
    except (psutil.AccessDenied, OSError, TypeError, ValueError):
        return None
    return status not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def parent(pid: int) -> int | None:
    """The parent pid of a process; None where it cannot be read."""
    try:
        return psutil.Process(pid).ppid()
    except (psutil.Error, OSError, TypeError, ValueError):
        return None


def name(pid: int) -> str | None:
    """The process's command name (the executable's base name); None where it cannot be read."""
    try:
        return psutil.Process(pid).name()
    except (psutil.Error, OSError, TypeError, ValueError):
        return None
