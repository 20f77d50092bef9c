"""An output folder replaced whole, as one marked generation of files: the analysis stage's outputs.

Every file of a generation is written into a new folder beside the output folder; its marker, generation.json
(MARKER), comes last and lists each file with its sha256, the time and the inputs' sha256; then the two folders are
exchanged in one atomic rename (Linux renameat2, RENAME_EXCHANGE) and the earlier generation, now under the new
folder's name, is removed. A kill at any moment leaves the output folder holding the whole earlier generation or the
whole new one, each with its marker (`check` lists what does not match it); the folder a killed writer leaves beside it
is removed by the next writer (scratch.py).

Entries of the output folder that belong to no generation (not in the earlier marker, not written by the new one, not
of the `owns` patterns: a user's notes, DVC's .gitignore) are carried into the new one as hard links. Where the
exchange cannot be made (a system without renameat2, a file system without the exchange, an output folder that is a
mount point, holds a folder of its own, or whose parent refuses writes), the files are replaced one by one in the
output folder (records/files.py), the earlier marker removed first and the new one written last: a kill meanwhile
leaves a folder without a marker, never a marker that lists files of another generation.

renameat2 is called through ctypes: the standard library has no exchange of two paths, and a PyPI wrapper is one more
dependency for one call. Stdlib only.
"""

from __future__ import annotations

import contextlib
import ctypes
import fnmatch
import hashlib
import json
import os
import shutil
import stat
import time
from pathlib import Path

from pipeline import scratch
from pipeline.records import files

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


def marker(folder) -> dict | None:
    """The folder's generation.json, or None where it has none (or an unreadable one)."""
    try:
        found = json.loads((Path(folder) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and isinstance(found.get("files"), dict) else None


def check(folder) -> list[str]:
    """What in `folder` does not match its generation.json (empty: every file it lists is there, as written)."""
    found = marker(folder)
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
def writing(out, inputs: dict, owns=()):
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
        files.write_text(new / MARKER, json.dumps(mark, indent=1) + "\n")
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
    earlier = marker(real)
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
    earlier = marker(real)
    (real / MARKER).unlink(missing_ok=True)
    for name in written:
        with open(new / name, "rb") as src, files.replacing(real / name, "wb") as dst:
            shutil.copyfileobj(src, dst)
    for e in os.scandir(real):
        if e.name not in written and STAGING not in e.name and _owned(e.name, earlier, owns) and e.name != MARKER:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(e.path)
    with open(new / MARKER, "rb") as src, files.replacing(real / MARKER, "wb") as dst:
        shutil.copyfileobj(src, dst)
