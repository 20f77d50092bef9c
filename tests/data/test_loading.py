"""Training-time access to the data: loading with limits and verification, and the per-rank batch indices every strategy
shares.
"""

import shutil

import pytest
import torch

from pipeline.data import store
from pipeline.data.store import DataError


def test_load_limits_and_types(synthetic_root):
    root = synthetic_root
    ds = store.load(root, "synthetic", train_limit=1000, test_limit=300)
    assert ds.train_x.shape == (1000, 28, 28) and ds.test_x.shape == (300, 28, 28)
    assert ds.train_x.dtype == torch.uint8 and ds.train_y.dtype == ds.test_y.dtype == torch.int64
    full = store.load(root, "synthetic")
    assert len(full.train_y) == 60000 and torch.equal(full.train_x[:1000], ds.train_x)


def test_load_missing_dir(tmp_path):
    with pytest.raises(DataError, match="python -m pipeline download") as e:
        store.load(tmp_path / "nothing-here", "fashion-mnist")
    assert str(tmp_path / "nothing-here") in str(e.value)


def test_load_source_mismatch(synthetic_root):
    with pytest.raises(DataError, match="dvc repro download"):
        store.load(synthetic_root, "fashion-mnist")


def test_a_file_changed_after_download_fails_verification_naming_it(tmp_path, synthetic_root):
    """Same size, four bytes changed in the middle: the IDX header still reads, so only the manifest's md5 can tell."""
    root = tmp_path / "copy"
    shutil.copytree(synthetic_root, root)
    store.load(root, "synthetic", 8, 8, verify=True)  # an untouched copy passes
    images = store.raw_dir(root) / "train-images-idx3-ubyte"
    raw = bytearray(images.read_bytes())
    mid = len(raw) // 2
    raw[mid : mid + 4] = bytes(255 - b for b in raw[mid : mid + 4])
    images.write_bytes(bytes(raw))
    assert len(store.load(root, "synthetic", 8, 8).train_y) == 8  # per-rank loads do not hash (the command did)
    with pytest.raises(DataError, match="changed after the download stage wrote it") as e:
        store.load(root, "synthetic", 8, 8, verify=True)
    assert str(images) in str(e.value) and "manifest.json" in str(e.value)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_epoch_batches_cover_each_sample_once(world_size):
    n, batch = 768, 64
    ranks = [store.epoch_batches(n, batch, epoch=3, seed=7, rank=r, world_size=world_size) for r in range(world_size)]
    assert all(b.shape == (n // batch, batch // world_size) and b.dtype == torch.int64 for b in ranks)
    assert torch.equal(torch.cat(ranks, dim=1).flatten().sort().values, torch.arange(n))
    # rank r holds the r-th contiguous chunk of the same global batch (= nn.DataParallel's scatter)
    assert torch.equal(torch.cat(ranks, dim=1), store.epoch_batches(n, batch, epoch=3, seed=7))
    assert torch.equal(ranks[-1], store.epoch_batches(n, batch, 3, 7, world_size - 1, world_size))


def test_epoch_batches_seeding_and_dropped_tail():
    first = store.epoch_batches(1000, 64, epoch=0, seed=0)
    assert first.shape == (15, 64) and len(first.flatten().unique()) == 960
    assert torch.equal(first, store.epoch_batches(1000, 64, epoch=0, seed=0))
    assert not torch.equal(first, store.epoch_batches(1000, 64, epoch=1, seed=0))
    assert not torch.equal(first, store.epoch_batches(1000, 64, epoch=0, seed=1))
    assert not torch.equal(
        store.epoch_batches(1000, 64, epoch=1, seed=0), store.epoch_batches(1000, 64, epoch=0, seed=1)
    )


def test_epoch_batches_rejects_uneven_split():
    with pytest.raises(ValueError, match="evenly"):
        store.epoch_batches(1000, 66, epoch=0, seed=0, rank=0, world_size=4)
    with pytest.raises(ValueError):
        store.epoch_batches(1000, 64, epoch=0, seed=0, rank=2, world_size=2)
    with pytest.raises(ValueError, match="larger than"):
        store.epoch_batches(10, 64, epoch=0, seed=0)


def test_normalize():
    x = torch.zeros(2, 28, 28, dtype=torch.uint8)
    x[:, :, 1] = 255
    out = store.normalize(x, "cpu")
    assert out.shape == (2, 1, 28, 28) and out.dtype == torch.float32
    assert torch.allclose(out[0, 0, 0, :2], torch.tensor([-0.2860 / 0.3530, (1 - 0.2860) / 0.3530]))
