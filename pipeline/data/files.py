"""What data.dir holds and how it is made: the four IDX file names, torchvision's folder for them, the command that
writes them, the download's socket timeout, and the reader that refuses a special file among them. Torch-free,
imported by store.py and download.py (so that neither imports the other at the top: data.prepare imports download
only when it fetches)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
DOWNLOAD_TIMEOUT_S = 20.0  # per socket operation: an offline host fails in seconds, not minutes
RERUN = "`python -m pipeline download` (or `dvc repro download`)"


def raw_dir(root) -> Path:
    return Path(root) / "FashionMNIST" / "raw"


def open_regular(path):
    """`path` opened for binary reading if it is a regular file; else OSError naming its kind. Opened non-blocking
    and checked before any read: a FIFO in data.dir would otherwise block the reader for good, in silence."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else "a special file"
        raise OSError(errno.EINVAL, f"not a regular file ({kind})", str(path))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")
