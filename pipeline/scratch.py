"""Scratch folders named by the process that owns them, and the removal of those whose process is gone.

A process killed with SIGKILL removes nothing: its scratch folder stays. Naming each folder
`<prefix><pid>@<host>-<random>` lets the next run of the same command remove the folders of processes of this host
that no longer run, and leave alone those of a live one (a second run beside it) and those of other hosts (a folder
on a shared file system). Stdlib only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from pathlib import Path


def remove_orphaned(prefix: str, parent=None, suffix: str = "") -> int:
    """Remove the folders (or files) `<prefix><pid>@<host>-*<suffix>` of this host in `parent` (default: the temp
    dir) whose pid no longer runs; returns how many. One of another host, or whose pid runs (or belongs to another
    user), or whose name is not of this form, is kept."""
    parent = Path(parent if parent is not None else tempfile.gettempdir())
    removed = 0
    for d in parent.glob(f"{glob_escape(prefix)}*@*-*{suffix}"):
        owner = d.name[len(prefix) : len(d.name) - len(suffix)].rpartition("-")[0]
        pid, _, host = owner.partition("@")
        if pid.isdigit() and host == host_tag() and not d.is_symlink() and not alive(int(pid)):
            if d.is_dir():
                shutil.rmtree(d, ignore_errors=True)
            else:
                d.unlink(missing_ok=True)
            removed += 1
    return removed


def file_name(prefix: str, suffix: str) -> str:
    """The path `<prefix><pid>@<host>-w<suffix>` of this process's scratch file (`prefix` a path); the files that
    killed processes left under the same prefix are removed first."""
    parent, name = os.path.split(prefix)
    remove_orphaned(name, parent or ".", suffix)
    return f"{prefix}{os.getpid()}@{host_tag()}-w{suffix}"


def make(prefix: str, parent=None, suffix: str = "") -> str:
    """A new folder `<prefix><pid>@<host>-<random><suffix>` in `parent` (default: the temp dir), after removing the ones
    killed processes left there."""
    remove_orphaned(prefix, parent, suffix)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}@{host_tag()}-", suffix=suffix, dir=parent)


@contextlib.contextmanager
def folder(prefix: str):
    """A scratch folder in the temp dir (see `make`) for the duration of the block, removed at its end."""
    path = make(prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def host_tag() -> str:
    """This host's name (letters, digits, `.` and `-` only) and its PID namespace: the processes whose pids
    `alive` can see. Two containers sharing a host name (host networking) have different PID namespaces."""
    name = "".join(c for c in socket.gethostname() if c.isalnum() or c in ".-") or "host"
    try:
        return f"{name}.{''.join(c for c in os.readlink('/proc/self/ns/pid') if c.isdigit())}"
    except OSError:
        return name


def alive(pid: int) -> bool:
    """Whether process `pid` of this PID namespace runs (this one included; another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    return True


def glob_escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)
