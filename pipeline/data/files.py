"""What data.dir holds and how it is made: the four IDX file names, torchvision's folder for them, the command that
writes them, the download's socket timeout, and the reader that refuses a special file among them. Torch-free,
imported by store.py and download.py (so that neither imports the other at the top: data.prepare imports download
only when it fetches)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from pathlib import Path

# Fashion-MNIST's training and test images (its synthetic stand-in makes as many): what a global batch can hold at most
TRAIN_IMAGES, TEST_IMAGES = 60_000, 10_000
FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
DOWNLOAD_TIMEOUT_S = 20.0  # per socket operation: an offline host fails in seconds, not minutes
RERUN = "`python -m pipeline download` (or `dvc repro download`)"


def raw_dir(root) -> Path:
    return Path(root) / "FashionMNIST" / "raw"


def content(root) -> dict | None:
    """What the prepared data in `root` holds, read from its manifest.json alone (the download stage writes it, and
    `load(verify=True)` refuses files that differ from it): `digest`, of the four files' md5s and sizes, and the
    number of `train` and `test` samples (a labels file is an 8-byte header, then one byte a sample). None where no
    readable manifest is. Torch-free and cheap: a study's identity reads it."""
    try:
        with open_regular(Path(root) / "manifest.json") as f:
            files = json.loads(f.read().decode("utf-8"))["files"]
        sums = {n: [str(files[n]["md5"]), int(files[n]["bytes"])] for n in FILES}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    digest = hashlib.sha1(json.dumps(sums, sort_keys=True).encode()).hexdigest()[:10]
    return {"digest": digest, "train": sums[FILES[1]][1] - 8, "test": sums[FILES[3]][1] - 8}


def whole(limit: int, n: int | None) -> int:
    """A sample limit as loading applies it (the first `limit` of `n` samples): 0 where it keeps them all (0, or n or
    more), so that limits that load the same samples read the same."""
    return 0 if n is not None and limit >= n else limit


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
