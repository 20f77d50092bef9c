"""Output files written whole or not at all, and what a write the host refused says: the trial's record and final
state and the analysis stage's outputs are written through `replacing` (or `replaced`); a message about a refused
write names the folder and its free space with `free_text`.

A file is written to a temporary file beside it, then renamed over it (os.replace): a full disk, a crash or a kill
leaves the previous file, never a truncated or missing one, and a symlink placed where an output goes is replaced by
the file, never written through. Stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path

from pipeline import scratch

# The host, not the trial, failed to write: a full disk, a quota, a read-only or a failing file system.
WRITE_FAULTS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG})
# How torch.save says a file it writes was cut short (its PyTorchStreamWriter on a full disk).
CUT_SHORT = ("unexpected pos", "pytorchstreamwriter failed")


@contextlib.contextmanager
def replacing(path, mode: str = "w", **open_kw):
    """A file to write `path` through: a temporary file in the same folder, renamed over `path` once the block ends
    without error; on an error it is removed and `path` keeps its previous contents (or stays absent). An OSError
    that names no file (a write refused) is raised naming `path`."""
    path = Path(path)
    tmp = scratch.file_name(f"{path.parent / ('.' + path.name)}.", ".tmp")  # a killed writer's is removed next time
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # this process's own, from a write that failed before
    # O_EXCL: never opened through a symlink someone placed at the temporary name
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
    try:
        with os.fdopen(fd, mode, **open_kw) as f:
            yield f
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno and e.filename in (None, tmp):
            raise OSError(e.errno, e.strerror or os.strerror(e.errno), str(path)) from e
        raise


@contextlib.contextmanager
def replaced(path):
    """`replacing` for a writer that takes a file name (matplotlib's savefig reads the format from it): a path of the
    same name in a new folder beside `path`, moved over `path` once the block ends without error."""
    path = Path(path)
    folder = Path(scratch.make(".parallax-write-", path.parent))  # a killed writer's is removed next time
    try:
        yield folder / path.name
        os.replace(folder / path.name, path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_text(path, text: str) -> None:
    """`path` holds `text`, written whole or not at all (see `replacing`)."""
    with replacing(path, "w", encoding="utf-8") as f:
        f.write(text)


def is_write_fault(e: BaseException) -> bool:
    """Whether `e` (or an exception it was raised from) is the host refusing a write: WRITE_FAULTS, or torch's file
    cut short."""
    seen = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in WRITE_FAULTS:
            return True
        if isinstance(cur, RuntimeError) and any(s in str(cur).lower() for s in CUT_SHORT):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


PROBE_BYTES = 1 << 20  # what a trial writes at the least (its record, progress, a LeNet state) is of this order


def refuses_writes(folder) -> str | None:
    """The host's refusal of a write of PROBE_BYTES in `folder` (its error text), or None when it takes one: after a
    trial failed some other way (a rank's peer died first), whether a full disk is the cause after all."""
    folder = Path(folder)
    probe = folder / f".parallax-write-probe-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"\0" * PROBE_BYTES)
            f.flush()
            os.fsync(f.fileno())
        return None
    except OSError as e:
        return f"{e.strerror or type(e).__name__}" if is_write_fault(e) else None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


def free_text(folder) -> str:
    """`180 KiB free of 600 KiB` on the file system that holds `folder` (its nearest existing parent)."""
    p = Path(folder).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        usage = shutil.disk_usage(p)
    except OSError as e:
        return f"free space unknown ({e.strerror or type(e).__name__})"
    return f"{_size(usage.free)} free of {_size(usage.total)}"


def _size(n: float) -> str:
    units = ("bytes", "KiB", "MiB", "GiB", "TiB")
    i = 0
    while n >= 1024 and i < len(units) - 1:
        n, i = n / 1024, i + 1
    return f"{n:.0f} bytes" if i == 0 else f"{n:.1f} {units[i]}"
