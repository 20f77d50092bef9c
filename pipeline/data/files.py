"""What data.dir holds and how it is made: the four IDX file names, torchvision's folder for them, the command that
writes them and the download's socket timeout. Torch-free, imported by data.py and download.py (so that neither
imports the other at the top: data.prepare imports download only when it fetches)."""
from __future__ import annotations

from pathlib import Path

FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
DOWNLOAD_TIMEOUT_S = 20.0  # per socket operation: an offline host fails in seconds, not minutes
RERUN = "`python -m pipeline download` (or `dvc repro download`)"


def raw_dir(root) -> Path:
    return Path(root) / "FashionMNIST" / "raw"
