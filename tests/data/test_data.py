"""pipeline.data.store: IDX parsing, checksummed download from a local mirror, offline failure, the synthetic
source, load() checks, and per-rank batches that cover each sample once.  pytest tests/data/test_data.py -q"""

import gzip
import hashlib
import json
import shutil
import socket
import urllib.error

import pytest
import torch
import torchvision
from torch import nn

from pipeline.data import download, store
from pipeline.data.store import FILES, DataError


def _leftovers(root):
    """Temporary download directories that prepare() failed to clean up."""
    return sorted(p.name for p in root.resolve().parent.glob(f".{root.name}.*"))


@pytest.fixture(scope="module")
def small():
    return store.make_synthetic(seed=3, n_train=600, n_test=100)


@pytest.fixture
def mirror(tmp_path, small, monkeypatch):
    """A local mirror holding small gzipped IDX files; the downloader's MD5s are set to theirs."""
    folder = tmp_path / "mirror"
    folder.mkdir()
    resources = []
    for name, t in zip(FILES, small):
        store.write_idx(tmp_path / name, t.to(torch.uint8))
        blob = gzip.compress((tmp_path / name).read_bytes(), mtime=0)
        (folder / f"{name}.gz").write_bytes(blob)
        resources.append((f"{name}.gz", hashlib.md5(blob).hexdigest()))
    monkeypatch.setattr(download, "RESOURCES", resources)
    return folder


# ---------------------------------------------------------------- IDX


def test_idx_round_trip_and_header(tmp_path):
    images = torch.randint(0, 256, (7, 28, 28), dtype=torch.uint8)
    labels = torch.randint(0, 10, (7,), dtype=torch.uint8)
    store.write_idx(tmp_path / "x", images)
    store.write_idx(tmp_path / "y", labels)
    assert (tmp_path / "x").read_bytes()[:8] == bytes([0, 0, 8, 3, 0, 0, 0, 7])
    assert (tmp_path / "y").read_bytes()[:4] == bytes([0, 0, 8, 1])
    assert torch.equal(store.read_idx(tmp_path / "x"), images)
    assert torch.equal(store.read_idx(tmp_path / "y"), labels)


def test_idx_wrong_magic_names_the_file(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    store.write_idx(path, torch.zeros(2, 28, 28, dtype=torch.uint8))
    path.write_bytes(b"\x00\x00\x0d\x03" + path.read_bytes()[4:])  # 0x0d = float, not uint8
    with pytest.raises(DataError, match="magic number 0x00000d03") as e:
        store.read_idx(path)
    assert str(path) in str(e.value)


@pytest.mark.parametrize("keep", [3, 10, 28 * 28 + 15])
def test_idx_truncated_names_the_file(tmp_path, keep):
    path = tmp_path / "t10k-images-idx3-ubyte"
    store.write_idx(path, torch.ones(2, 28, 28, dtype=torch.uint8))
    path.write_bytes(path.read_bytes()[:keep])
    with pytest.raises(DataError, match="truncated|not a uint8 IDX") as e:
        store.read_idx(path)
    assert str(path) in str(e.value)


# ---------------------------------------------------------------- synthetic source


def test_synthetic_is_deterministic_and_seeded(small):
    again = store.make_synthetic(seed=3, n_train=600, n_test=100)
    assert all(torch.equal(a, b) for a, b in zip(small, again))
    other = store.make_synthetic(seed=4, n_train=600, n_test=100)
    assert not torch.equal(small[0], other[0])


def test_synthetic_shape_balance_and_order(synthetic_root):
    train_x, train_y, test_x, test_y = store.make_synthetic()
    assert train_x.shape == (60000, 28, 28) and test_x.shape == (10000, 28, 28)
    assert train_x.dtype == test_x.dtype == torch.uint8 and train_y.dtype == test_y.dtype == torch.int64
    assert torch.bincount(train_y).tolist() == [6000] * 10
    assert torch.bincount(test_y).tolist() == [1000] * 10
    assert len(set(train_y[:100].tolist())) == 10  # shuffled, so a prefix (train_limit) has every class
    assert (train_y[1:] == (train_y[:-1] + 1) % 10).float().mean() < 0.2  # and not merely cycled
    pixels = train_x.float() / 255  # roughly Fashion-MNIST's statistics, which normalize() assumes
    assert abs(pixels.mean().item() - store.MEAN) < 0.05 and abs(pixels.std().item() - store.STD) < 0.05
    # prepare(source="synthetic") (conftest's session fixture) writes exactly these, readable by torchvision
    manifest = json.loads((synthetic_root / "manifest.json").read_text())
    assert manifest["source"] == "synthetic" and sorted(manifest["files"]) == sorted(FILES)
    tv = torchvision.datasets.FashionMNIST(synthetic_root, train=True, download=False)
    assert torch.equal(tv.data, train_x) and torch.equal(tv.targets, train_y)


def test_synthetic_is_learnable_by_lenet():
    train_x, train_y, test_x, test_y = store.make_synthetic(seed=0, n_train=12000, n_test=2000)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Conv2d(1, 20, 3),
            nn.ReLU(),
            nn.AvgPool2d(2),
            nn.Conv2d(20, 50, 5),
            nn.ReLU(),
            nn.AvgPool2d(2),
            nn.Flatten(),
            nn.Linear(800, 128),
            nn.ReLU(),
            nn.Linear(128, 10),
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.2)
        for idx in store.epoch_batches(len(train_y), 128, epoch=0, seed=0):
            loss = nn.functional.cross_entropy(model(store.normalize(train_x[idx], "cpu")), train_y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            acc = (model(store.normalize(test_x, "cpu")).argmax(1) == test_y).float().mean().item()
    finally:
        torch.set_num_threads(threads)
    assert 0.3 < acc < 0.97, acc  # learnable, and not trivially separable


# ---------------------------------------------------------------- download stage


def test_prepare_from_local_mirror_then_idempotent(tmp_path, mirror, small):
    root = tmp_path / "data" / "fashion-mnist"
    manifest = store.prepare(root, "fashion-mnist", mirror=str(mirror), progress=False)
    raw = root / "FashionMNIST" / "raw"
    assert manifest["source"] == "fashion-mnist" and manifest["mirror"] == mirror.resolve().as_uri() + "/"
    assert json.loads((root / "manifest.json").read_text()) == manifest
    for name in FILES:
        assert manifest["files"][name] == {
            "md5": hashlib.md5((raw / name).read_bytes()).hexdigest(),
            "bytes": (raw / name).stat().st_size,
        }
    ds = store.load(root, "fashion-mnist")
    assert ds.source == "fashion-mnist" and ds.train_y.dtype == torch.int64
    assert all(torch.equal(a, b.to(a.dtype)) for a, b in zip((ds.train_x, ds.train_y, ds.test_x, ds.test_y), small))
    assert _leftovers(root) == []

    # second run: verified files are kept as they are, the mirror is not even consulted
    stamps = {p.name: p.stat().st_mtime_ns for p in raw.iterdir()}
    for gz in mirror.iterdir():
        gz.unlink()
    assert store.prepare(root, "fashion-mnist", mirror=str(mirror), progress=False) == manifest
    assert {p.name: p.stat().st_mtime_ns for p in raw.iterdir()} == stamps


def test_prepare_accepts_file_url_mirror(tmp_path, mirror):
    root = tmp_path / "fm"
    manifest = store.prepare(root, "fashion-mnist", mirror=mirror.as_uri(), progress=False)
    assert manifest["mirror"] == mirror.as_uri() + "/"
    assert len(store.load(root, "fashion-mnist").train_y) == 600


def test_corrupt_archive_is_removed_and_rerun_recovers(tmp_path, mirror):
    root = tmp_path / "fm"
    gz = mirror / "train-labels-idx1-ubyte.gz"
    good = gz.read_bytes()
    gz.write_bytes(good[:-20])  # truncated download
    with pytest.raises(DataError) as e:
        store.prepare(root, "fashion-mnist", mirror=str(mirror), progress=False)
    message = str(e.value)
    assert "train-labels-idx1-ubyte.gz" in message and "removed" in message and "\n" not in message
    assert not list(root.rglob("train-labels-idx1-ubyte*")) and not (root / "manifest.json").exists()
    assert _leftovers(root) == []

    gz.write_bytes(good)
    store.prepare(root, "fashion-mnist", mirror=str(mirror), progress=False)
    assert len(store.load(root, "fashion-mnist").train_y) == 600


def test_offline_without_mirror_explains_both_ways_out(tmp_path, monkeypatch):
    with socket.socket() as s:  # a local port that was free a moment ago: connection refused, at once
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/"
    monkeypatch.setattr(download, "MIRRORS", [url])
    root = tmp_path / "fm"
    with pytest.raises(DataError) as e:
        store.prepare(root, "fashion-mnist", progress=False)
    message = str(e.value)
    assert "data.mirror" in message and "data.source=synthetic" in message and url in message
    assert "make pipeline-offline" in message  # the way out for users of make/dvc, not only the CLI
    assert "\n" not in message
    assert not root.exists() and _leftovers(root) == []


def test_failed_download_never_falls_back_to_synthetic(tmp_path, synthetic_root, mirror):
    root = tmp_path / "fm"
    shutil.copytree(synthetic_root, root)
    manifest = json.loads((root / "manifest.json").read_text())
    (mirror / "t10k-images-idx3-ubyte.gz").unlink()
    with pytest.raises(DataError, match="t10k-images-idx3-ubyte.gz"):
        store.prepare(root, "fashion-mnist", mirror=str(mirror), progress=False)
    assert json.loads((root / "manifest.json").read_text()) == manifest  # the synthetic set is untouched...
    with pytest.raises(DataError, match="holds synthetic data but data.source is fashion-mnist"):
        store.load(root, "fashion-mnist")  # ...and is not served as Fashion-MNIST


def test_switching_source_replaces_the_files(tmp_path, mirror, small, monkeypatch):
    monkeypatch.setattr(
        store, "make_synthetic", lambda seed=0: tuple((t + 1) % 10 if t.dim() == 1 else t for t in small)
    )
    root = tmp_path / "fm"
    raw = root / "FashionMNIST" / "raw"
    store.prepare(root, "fashion-mnist", mirror=str(mirror), progress=False)
    assert len(list(raw.glob("*.gz"))) == 4
    assert store.prepare(root, "synthetic", progress=False)["source"] == "synthetic"
    assert sorted(p.name for p in raw.iterdir()) == sorted(FILES)  # no Fashion-MNIST archive left beside it
    assert torch.equal(store.load(root, "synthetic").train_y, (small[1] + 1) % 10)
    store.prepare(root, "fashion-mnist", mirror=str(mirror), progress=False)
    assert torch.equal(store.load(root, "fashion-mnist").train_y, small[1])


def test_each_request_is_bounded_and_the_process_socket_default_is_kept(tmp_path, monkeypatch):
    """Every request of the download carries DOWNLOAD_TIMEOUT_S itself: the process's socket default (which other
    threads' sockets use) is never changed, and no torchvision global is patched."""
    seen = []

    def fake_urlopen(url, timeout=None):
        seen.append((timeout, socket.getdefaulttimeout()))
        raise urllib.error.URLError("timed out")

    monkeypatch.setattr(download.urllib.request, "urlopen", fake_urlopen)
    tv_tqdm = torchvision.datasets.utils.tqdm
    before = socket.getdefaulttimeout()
    socket.setdefaulttimeout(7.0)
    try:
        with pytest.raises(DataError, match="timed out"):
            store.prepare(tmp_path / "fm", "fashion-mnist", progress=False)
    finally:
        socket.setdefaulttimeout(before)
    assert seen == [(store.DOWNLOAD_TIMEOUT_S, 7.0)] * len(download.FashionMNIST.mirrors)  # torchvision's mirrors
    assert torchvision.datasets.utils.tqdm is tv_tqdm


def test_bad_mirror_value(tmp_path):
    with pytest.raises(DataError, match="data.mirror"):
        store.prepare(tmp_path / "fm", "fashion-mnist", mirror=str(tmp_path / "nowhere"), progress=False)
    with pytest.raises(DataError, match="unsupported scheme"):
        store.prepare(tmp_path / "fm", "fashion-mnist", mirror="ftp://example.org/", progress=False)


# ---------------------------------------------------------------- load


def test_wrong_shapes_are_neither_published_nor_loaded(tmp_path, mirror, monkeypatch):
    root = tmp_path / "fm"
    store.prepare(root, "fashion-mnist", mirror=str(mirror), progress=False)
    bad = root / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte"
    store.write_idx(bad, torch.zeros(99, dtype=torch.uint8))  # 100 test images, 99 labels
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte"):
        store.load(root, "fashion-mnist")

    monkeypatch.setattr(
        store,
        "make_synthetic",
        lambda seed=0: (torch.zeros(5, 28, 28), torch.zeros(5), torch.zeros(3, 28, 28), torch.zeros(2)),
    )
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte"):
        store.prepare(tmp_path / "syn", "synthetic", progress=False)
    assert not (tmp_path / "syn").exists() and _leftovers(tmp_path / "syn") == []


# ---------------------------------------------------------------- batches and normalization
