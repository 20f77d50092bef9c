"""A throwaway installed package that registers a model through Parallax's entry-point group, as a user's own package
would: a module and its dist-info (METADATA, entry_points.txt) in a folder on sys.path, which is all
importlib.metadata reads (what `pip install` of a package with [project.entry-points."parallax.models"] leaves)."""

from __future__ import annotations

from pathlib import Path

NAME = "toynet"
MODULE = '''
from torch import nn


def build_toynet(num_classes=10):
    """A user's model: (N, 1, 28, 28) in, (N, num_classes) out."""
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, num_classes),
    )
'''


def install(where: Path) -> Path:
    """The package `toymodels` 0.1, registering `toynet`, installed into `where` (to be put on sys.path)."""
    (where / "toymodels").mkdir(parents=True, exist_ok=True)
    (where / "toymodels" / "__init__.py").write_text(MODULE)
    info = where / "toymodels-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toymodels\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[parallax.models]\n{NAME} = toymodels:build_toynet\n")
    return where
