"""What a study's figures were computed with, beyond its settings: the code that runs and measures a trial, the
prepared data's content and the torch release. Each is part of the study's identity (space.identity), so changed code,
data or torch starts a new study, and each is recorded, under one name everywhere (FACTS), on the study, its MLflow
parent run and every row of its sweep table. Torch-free and cheap: the code is read once per process, the data from
its manifest, torch's version from its installed metadata.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
from pathlib import Path

from pipeline import paths
from pipeline.data import files
from pipeline.records.trial import PROVENANCE as FACTS  # the names on the study, its runs and its table

# What a trial computes and measures, under pipeline/: the models, the strategies, the loop and its CUDA graphs (their
# capture step: config/settle.py), the measurements, and the batches and their normalisation (data/store.py). The
# rest (launching ranks, the stores, the views) decides where and how a figure is kept, not the figure.
TRIAL_CODE = (
    "models.py",
    "zoo.py",
    "strategies",
    "trial/loop.py",
    "trial/graphs.py",
    "config/settle.py",
    "measure",
    "data/store.py",
)
PACKAGE = Path(__file__).resolve().parents[1]


def sources_digest(package: Path = PACKAGE, parts=TRIAL_CODE) -> str:
    """The source files of `parts` (files, or folders read whole) under `package`, as bytes, in sorted order, with
    their paths: one edit to any of them gives another digest."""
    h = hashlib.sha1()
    for part in parts:
        where = package / part
        for f in sorted(where.rglob("*.py")) if where.is_dir() else [where]:
            h.update(f.relative_to(package).as_posix().encode() + b"\0")
            h.update(f.read_bytes() + b"\0")
    return h.hexdigest()[:10]


@functools.cache
def code_digest() -> str:
    return sources_digest()


def torch_version() -> str:
    try:
        return importlib.metadata.version("torch")  # no torch import: its metadata says which release is installed
    except importlib.metadata.PackageNotFoundError:
        return "none"


def data_root(cfg) -> Path:
    """data.dir as the trials read it (relative to the project), resolved: `data/x`, `./data/x`, `data/x/` and the
    absolute path are one folder."""
    return (paths.repo_root() / cfg.data.dir).resolve()


def data_content(cfg) -> dict | None:
    """The prepared data's digest and sizes (data.files.content); None where data.dir holds none yet."""
    return files.content(data_root(cfg))


def facts(data: dict | None) -> dict:
    """FACTS of a sweep whose prepared data is `data` (data_content; its digest "none" where there is none yet)."""
    found = {"code_digest": code_digest(), "data_digest": data["digest"] if data else "none"}
    return {k: {**found, "torch_version": torch_version()}[k] for k in FACTS}
