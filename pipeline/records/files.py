"""Output files written whole or not at all, and what a write the host refused says: the trial's record and final
state are written through `replacing` (or `replaced`), the analysis stage's outputs as one generation through
`replacing_folder`; a message about a refused write names the folder and its free space with `free_text`.

A file is written to a temporary file beside it, then renamed over it (os.replace): a full disk, a crash or a kill
leaves the previous file, never a truncated or missing one, and a symlink placed where an output goes is replaced by
the file, never written through.

A generation: every file of an output folder is written into a new folder beside the output folder; its marker,
generation.json (MARKER), comes last and lists each file with its sha256, the time and the inputs' sha256; then the two
folders are exchanged in one atomic rename (Linux renameat2, RENAME_EXCHANGE) and the earlier generation, now under the
new folder's name, is removed. A kill at any moment leaves the output folder holding the whole earlier generation or the
whole new one, each with its marker (`check_generation` lists what does not match it); the folder a killed writer leaves
beside it is removed by the next writer (scratch.py).

Entries of the output folder that belong to no generation (not in the earlier marker, not written by the new one, not of
the `owns` patterns: a user's notes, DVC's .gitignore) are carried into the new one as hard links. Where the exchange
cannot be made (a system without renameat2, a file system without the exchange, an output folder that is a mount point,
holds a folder of its own, or whose parent refuses writes), the files are replaced one by one in the output folder
(`replacing`), the earlier marker removed first and the new one written last: a kill meanwhile leaves a folder without a
marker, never a marker that lists files of another generation.

renameat2 is called through ctypes: the standard library has no exchange of two paths, and a PyPI wrapper is one more
dependency for one call. Stdlib only.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fnmatch
import hashlib
import json
import os
import shutil
import stat
import time
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


# One generation of output files, swapped in whole
MARKER = "generation.json"
STAGING = ".generation-"  # the new generation's folder: `.<out>.generation-<pid>@<host>-*` beside it, or inside it
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


class _NoExchange(Exception):
    """The output folder cannot be exchanged whole: its files are replaced one by one."""


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def input_digests(paths) -> dict[str, str]:
    """Each existing input's sha256 by its path; a FIFO or device is named as such and never opened (it may block)."""
    out = {}
    for p in paths:
        p = Path(p)
        try:
            if not p.exists():
                continue
            out[str(p)] = sha256(p) if p.is_file() else "not a regular file"
        except OSError as e:
            out[str(p)] = f"unreadable ({e.strerror or type(e).__name__})"
    return out


def generation_marker(folder) -> dict | None:
    """The folder's generation.json, or None where it has none (or an unreadable one)."""
    try:
        found = json.loads((Path(folder) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and isinstance(found.get("files"), dict) else None


def check_generation(folder) -> list[str]:
    """What in `folder` does not match its generation.json (empty: every file it lists is there, as written)."""
    found = generation_marker(folder)
    if found is None:
        return [f"{Path(folder) / MARKER} is absent or unreadable"]
    problems = []
    for name, digest in found["files"].items():
        p = Path(folder) / name
        try:
            if sha256(p) != digest:
                problems.append(f"{name} differs from the one its generation wrote")
        except OSError as e:
            problems.append(f"{name}: {e.strerror or type(e).__name__}")
    return problems


@contextlib.contextmanager
def replacing_folder(out, inputs: dict, owns=()):
    """A new, empty folder to write a whole generation into; once the block ends without error it is marked and
    replaces `out`'s generation whole. On an error `out` keeps its earlier generation and the new folder is removed.
    `owns`: patterns of names that only a generation writes (an earlier one's leftovers are not carried over)."""
    real = Path(os.path.realpath(out))  # a symlinked output folder: its target is replaced, the link stays
    real.mkdir(parents=True, exist_ok=True)
    try:
        new, beside = Path(scratch.make(f".{real.name}{STAGING}", real.parent)), True
    except OSError:  # the parent refuses writes: the generation is staged inside the output folder
        new, beside = Path(scratch.make(STAGING, real)), False
    try:
        yield new
        written = sorted(p.name for p in new.iterdir())
        mark = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "inputs": inputs,
            "files": {name: sha256(new / name) for name in written},
        }
        write_text(new / MARKER, json.dumps(mark, indent=1) + "\n")
        try:
            if not beside:
                raise _NoExchange
            _carry(real, new, {*written, MARKER}, owns)
            os.chmod(new, stat.S_IMODE(os.stat(real).st_mode))  # the folder's mode, not mkdtemp's 0700
            _exchange(new, real)  # `new` now holds the earlier generation, removed below
        except _NoExchange:
            _replace_each(new, real, written, owns)
    finally:
        shutil.rmtree(new, ignore_errors=True)


def _owned(name: str, earlier: dict | None, owns) -> bool:
    return (
        name == MARKER
        or name in ((earlier or {}).get("files") or {})
        or STAGING in name
        or any(fnmatch.fnmatchcase(name, pat) for pat in owns)
    )


def _carry(real: Path, new: Path, written: set[str], owns) -> None:
    """Hard links in `new` to the entries of `real` no generation owns; a folder among them cannot be linked."""
    earlier = generation_marker(real)
    for e in os.scandir(real):
        if e.name in written or _owned(e.name, earlier, owns):
            continue
        if e.is_dir(follow_symlinks=False):
            raise _NoExchange
        try:
            os.link(e.path, new / e.name, follow_symlinks=False)
        except OSError:
            raise _NoExchange from None


def _exchange(a: Path, b: Path) -> None:
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError, TypeError):
        raise _NoExchange from None
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        raise _NoExchange  # EINVAL/ENOSYS (unsupported), EXDEV/EBUSY (a mount point): replaced one by one


def _replace_each(new: Path, real: Path, written: list[str], owns) -> None:
    """The new generation's files replace the earlier one's one by one, the marker removed first and written last;
    the earlier generation's files the new one lacks are removed."""
    earlier = generation_marker(real)
    (real / MARKER).unlink(missing_ok=True)
    for name in written:
        with open(new / name, "rb") as src, replacing(real / name, "wb") as dst:
            shutil.copyfileobj(src, dst)
    for e in os.scandir(real):
        if e.name not in written and STAGING not in e.name and _owned(e.name, earlier, owns) and e.name != MARKER:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(e.path)
    with open(new / MARKER, "rb") as src, replacing(real / MARKER, "wb") as dst:
        shutil.copyfileobj(src, dst)
