"""IDX files that would train on the wrong split or crash the reader are refused with a DataError naming the
files: train and test files swapped (with the manifest recomputed to match), and a header whose dimensions overflow."""

from __future__ import annotations

import json
import shutil

import pytest

from pipeline.data import store
from pipeline.data.files import FILES, raw_dir
from pipeline.errors import DataError


def _swapped_copy(synthetic_root, tmp_path):
    root = tmp_path / "fm"
    shutil.copytree(synthetic_root, root)
    raw = raw_dir(root)
    for train, test in ((FILES[0], FILES[2]), (FILES[1], FILES[3])):
        (raw / train).rename(raw / "swap")
        (raw / test).rename(raw / train)
        (raw / "swap").rename(raw / test)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["files"] = {n: store._describe(raw / n) for n in FILES}  # recomputed: the md5 check passes
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def test_swapped_train_and_test_files_are_refused_naming_them(synthetic_root, tmp_path):
    root = _swapped_copy(synthetic_root, tmp_path)
    with pytest.raises(DataError) as e:
        store.load(root, "synthetic", verify=True)
    msg = " ".join(str(e.value).split())
    assert "train-images-idx3-ubyte" in msg and "t10k-images-idx3-ubyte" in msg and "swapped" in msg, msg
    assert "10000" in msg and "60000" in msg, msg


@pytest.mark.parametrize(
    "dims,payload",
    [
        ([2**31, 2**31, 4], b""),  # 2**64 elements: NumPy's int64 product wraps to 0, "no payload" looks right
        ([0, 2**32 - 1, 2**32 - 1], b""),  # no element, but strides beyond int64
        ([2**32 - 1] * 3, b"x" * 784),
    ],
)
def test_a_header_whose_dimensions_overflow_is_refused_naming_the_file(tmp_path, dims, payload):
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes((0x803).to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in dims) + payload)
    with pytest.raises(DataError) as e:
        store.read_idx(path)
    assert str(path) in str(e.value), str(e.value)
