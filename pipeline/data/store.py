"""Fashion-MNIST as in-memory uint8 tensors: checksummed download (torchvision, download.py), an explicit synthetic
stand-in for offline machines, IDX files, and the per-rank batch indices every strategy shares.

    python -m pipeline download            # the `download` stage (= dvc repro download)

Layout under data.dir (torchvision's, so `torchvision.datasets.FashionMNIST(dir)` reads it too):
FashionMNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte plus manifest.json naming the source.
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline import scratch
from pipeline.data.files import DOWNLOAD_TIMEOUT_S, FILES, open_regular, raw_dir  # noqa: F401 (DOWNLOAD_TIMEOUT_S: re-exported)
from pipeline.data.files import RERUN as _RERUN
from pipeline.data.synthetic import make_synthetic
from pipeline.errors import DataError  # defined torch-free, for the CLI's error handler
from pipeline.redact import redact

SOURCES = ("fashion-mnist", "synthetic")
MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST training-set pixel statistics
_MAGIC = {1: 0x00000801, 3: 0x00000803}  # IDX: 0x08 = unsigned byte, then the number of dimensions


@dataclass(frozen=True, eq=False)  # eq=False: tensors have no truth value, so compare fields explicitly
class Dataset:
    train_x: torch.Tensor  # uint8 [N, 28, 28]
    train_y: torch.Tensor  # int64 [N]
    test_x: torch.Tensor  # uint8 [M, 28, 28]
    test_y: torch.Tensor  # int64 [M]
    source: str  # "fashion-mnist" | "synthetic"


# ---------------------------------------------------------------- IDX files


def write_idx(path, tensor_uint8: torch.Tensor) -> None:
    t = torch.as_tensor(tensor_uint8)
    if t.dtype != torch.uint8 or t.dim() not in _MAGIC:
        raise ValueError(f"write_idx takes uint8 labels [N] or images [N, H, W], got {t.dtype} {list(t.shape)}")
    header = _MAGIC[t.dim()].to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in t.shape)
    Path(path).write_bytes(header + t.contiguous().numpy().tobytes())


def read_idx(path) -> torch.Tensor:
    """uint8 tensor backed by the file's bytes, mapped rather than read: no copy and no per-sample decoding, and a
    trial's ranks share the page cache's copy instead of reading 55 MB each. The mapping is private (copy-on-write):
    nothing written to the tensor reaches the file, and the download stage replaces files rather than rewriting them,
    so a mapped file never changes under a running trial."""
    path = Path(path)
    try:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else bytearray()
    except OSError as e:
        raise DataError(f"Cannot read {path} ({e.strerror or e}). Create the data with {_RERUN}.") from None
    magic = int.from_bytes(buf[:4], "big")
    if len(buf) < 4 or magic not in _MAGIC.values():
        raise DataError(
            f"{path} is not a uint8 IDX file: magic number 0x{magic:08x}, expected 0x00000803 (images) "
            f"or 0x00000801 (labels). The file is corrupt or not Fashion-MNIST; delete it and rerun {_RERUN}."
        )
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    dims = [int.from_bytes(buf[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    size = header + math.prod(dims)  # Python's integers: NumPy's int64 product wraps, and a wrapped size can match
    if math.prod(max(d, 1) for d in dims) >= 2**63:  # torch's sizes and strides are int64, even for no element
        raise DataError(
            f"{path} has a corrupt header: its dimensions {dims} overflow a 64-bit size, so no tensor can hold "
            f"them. The file is not Fashion-MNIST; delete it and rerun {_RERUN}."
        )
    if len(buf) != size:
        kind = "truncated" if len(buf) < size else "longer than its header says"
        raise DataError(
            f"{path} is {kind}: its header promises shape {dims} ({size} bytes) but the file has "
            f"{len(buf)} bytes. Delete it and rerun {_RERUN}."
        )
    if size == header:
        return torch.zeros(dims, dtype=torch.uint8)
    return torch.frombuffer(buf, dtype=torch.uint8, offset=header).view(dims)


# ---------------------------------------------------------------- download stage


def prepare(root, source: str, mirror: str = "", progress: bool = True) -> dict:
    """The `download` stage: put `source`'s four IDX files and manifest.json in `root`; returns the manifest.

    Idempotent: files that match the manifest are left alone. Everything is built in a temporary sibling of
    `root` and moved into place only on success, so a failure leaves `root` as it was.
    """
    if source not in SOURCES:
        raise DataError(f"Unknown data source {source!r}: data.source must be one of {', '.join(SOURCES)}.")
    root = Path(root)
    current = _current_manifest(root, source)
    if current is not None:
        return current
    home = root.resolve()
    home.parent.mkdir(parents=True, exist_ok=True)
    # named by this process: the next download removes the one a SIGKILLed download left
    tmp = Path(scratch.make(f".{home.name}.", home.parent, suffix=".partial"))
    try:
        raw = raw_dir(tmp)
        raw.mkdir(parents=True)
        if source == "synthetic":
            for name, t in zip(FILES, make_synthetic(seed=0)):
                write_idx(raw / name, t.to(torch.uint8))
            used = ""
        else:
            from pipeline.data.download import download  # torchvision: imported only by the download itself

            used = download(raw, root, mirror, progress)
        _read_checked(raw)  # never publish files that load() would reject
        manifest = {"source": source, "files": {n: _describe(raw / n) for n in FILES}, "mirror": redact(used)}
        _publish(tmp, root, manifest)
        return manifest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _describe(path: Path) -> dict:
    with open_regular(path) as f:
        return {"md5": hashlib.file_digest(f, "md5").hexdigest(), "bytes": path.stat().st_size}


def _changed(root: Path, files: dict) -> tuple[str, dict] | None:
    """The first of FILES whose size or md5 differs from manifest.json's `files` entry, with what it is now; None
    when all match. Sizes first: a changed size needs no hashing."""
    raw = raw_dir(root)
    for check in (lambda n: {"bytes": (raw / n).stat().st_size}, lambda n: _describe(raw / n)):
        for n in FILES:
            now = check(n)
            if any(now[k] != (files.get(n) or {}).get(k) for k in now):
                return n, _describe(raw / n)
    return None


def _read_manifest(root: Path):
    with open_regular(root / "manifest.json") as f:
        return json.loads(f.read().decode("utf-8"))


def _current_manifest(root: Path, source: str) -> dict | None:
    try:
        manifest = _read_manifest(root)
        files = manifest["files"]
        if manifest["source"] != source or sorted(files) != sorted(FILES):
            return None
        if _changed(root, files) is None:
            return manifest
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _publish(tmp: Path, root: Path, manifest: dict) -> None:
    raw = raw_dir(root)
    raw.mkdir(parents=True, exist_ok=True)
    # manifest.json goes first and comes back last: an interrupted publish reads as "not prepared", never as
    # one source's files under another source's manifest.
    (root / "manifest.json").unlink(missing_ok=True)
    for name in FILES + tuple(f"{n}.gz" for n in FILES):
        new, old = raw_dir(tmp) / name, raw / name
        if new.exists():
            os.replace(new, old)
        else:
            old.unlink(missing_ok=True)  # e.g. real .gz files when switching to synthetic: one source per dir
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp / "manifest.json", root / "manifest.json")


# ---------------------------------------------------------------- training-time access


def load(root, source: str, train_limit: int = 0, test_limit: int = 0, verify: bool = False) -> Dataset:
    """The prepared data as tensors; limits (0 = all) keep the first n samples (the order is class-shuffled).
    verify: check every file against manifest.json's md5 first (0.1 s for the four files on a 2-core Xeon; once per
    sweep or train command, not per rank), so a file changed after `download` is an error, not a silently different
    data set."""
    root = Path(root)
    make_it = f"Create it with {_RERUN} and data.source={source}."
    try:
        manifest = _read_manifest(root)
        found = manifest["source"]
    except FileNotFoundError:
        raise DataError(f"No prepared data in {root} (no manifest.json). {make_it}") from None
    except NotADirectoryError:
        raise DataError(
            f"{root} is not a directory, so its manifest.json is unreadable. Point data.dir at a "
            f"directory; {_RERUN} creates it."
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"{root / 'manifest.json'} is unreadable ({e}). Delete it and rerun {_RERUN}.") from None
    if found != source:
        raise DataError(
            f"{root} holds {found} data but data.source is {source}; synthetic data is never used in "
            f"place of the real set, or the other way round. Rerun {_RERUN} to prepare {source} data, "
            f"or set data.source={found} (`--set data.source={found}`)."
        )
    files = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
    try:
        changed = _changed(root, files) if verify else None
    except OSError:  # a missing or unreadable file: the IDX reader below names it
        changed = None
    if changed:
        (name, got), want = changed, files.get(changed[0]) or {}
        raise DataError(
            f"{raw_dir(root) / name} does not match {root / 'manifest.json'} (md5 {got['md5']}, "
            f"{got['bytes']} bytes; the manifest says md5 {want.get('md5')}, {want.get('bytes')} "
            f"bytes): it changed after the download stage wrote it. Delete {root} and rerun {_RERUN}."
        )
    x_train, y_train, x_test, y_test = _read_checked(raw_dir(root))
    return Dataset(
        _first(x_train, train_limit),
        _first(y_train, train_limit).long(),
        _first(x_test, test_limit),
        _first(y_test, test_limit).long(),
        source,
    )


def _read_checked(raw: Path) -> list[torch.Tensor]:
    tensors = [read_idx(raw / n) for n in FILES]
    for name, images, labels in (("train", *tensors[:2]), ("t10k", *tensors[2:])):
        if (
            images.dim() != 3
            or tuple(images.shape[1:]) != (28, 28)
            or labels.dim() != 1
            or len(images) != len(labels)
            or (len(labels) and int(labels.max()) > 9)
        ):
            raise DataError(
                f"{raw / f'{name}-images-idx3-ubyte'} and {raw / f'{name}-labels-idx1-ubyte'} do not "
                f"form a Fashion-MNIST split: shapes {list(images.shape)} and {list(labels.shape)}, "
                f"expected [N, 28, 28] and [N] with labels 0-9. Delete {raw} and rerun {_RERUN}."
            )
    n_train, n_test = len(tensors[0]), len(tensors[2])
    if n_train < n_test:  # the real set and its synthetic stand-in both hold 60000 training and 10000 test images
        raise DataError(
            f"{raw / FILES[0]} holds {n_train} images and {raw / FILES[2]} {n_test}: fewer training than test "
            f"images, so the train and test files (t10k-*) are swapped or mislabelled; Fashion-MNIST, and its "
            f"synthetic stand-in, has 60000 training and 10000 test images. Delete {raw} and rerun {_RERUN}."
        )
    return tensors


def _first(t: torch.Tensor, n: int) -> torch.Tensor:
    if n < 0:
        raise ValueError(f"sample limits must be >= 0 (0 = all), got {n}")
    return t[:n] if n else t


def epoch_batches(n: int, global_batch: int, epoch: int, seed: int, rank: int = 0, world_size: int = 1) -> torch.Tensor:
    """LongTensor [steps, global_batch // world_size]: this rank's sample indices for each step of `epoch`.

    Every rank draws the same permutation (seeded by seed and epoch) and takes the rank-th contiguous chunk of
    each global batch, which is how nn.DataParallel's scatter splits a batch: the sample -> device mapping is
    the same for every strategy. The last partial global batch is dropped.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
    if global_batch < 1 or global_batch % world_size:
        raise ValueError(f"global batch {global_batch} cannot be split evenly over {world_size} devices")
    if global_batch > n:
        raise ValueError(f"global batch {global_batch} is larger than the {n} training samples: no full step")
    steps = n // global_batch
    state = np.random.SeedSequence([seed, epoch]).generate_state(1, np.uint64)[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(state) >> 1))
    return perm[: steps * global_batch].view(steps, world_size, global_batch // world_size)[:, rank].contiguous()


def normalize(x_uint8_batch: torch.Tensor, device) -> torch.Tensor:
    """float [B, 1, 28, 28] on `device`; the uint8 batch crosses the bus (4x fewer bytes than float)."""
    x = x_uint8_batch.to(device, non_blocking=True)
    if x.dim() == 3:
        x = x.unsqueeze(1)
    return x.float().div_(255).sub_(MEAN).div_(STD)
