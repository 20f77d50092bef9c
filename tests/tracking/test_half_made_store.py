"""An MLflow SQLite store whose creation stopped part-way (a disk that filled while MLflow made its tables) is named
as half-made, with what to do, rather than blamed on MLflow versions.

    .venv/bin/python -m pytest tests/tracking/test_half_made_store.py
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline.errors import StoreError
from pipeline.tracking import client

# MLflow makes its tables in a process whose files may grow to 300 KiB (the disk fills mid-migration), as
# `ulimit -f 300` does; SIGXFSZ ignored, so a write past the limit fails as on a full disk
FILL = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (300 * 1024, 300 * 1024))
from mlflow.tracking import MlflowClient
try:
    MlflowClient(sys.argv[1]).search_experiments()
except Exception as e:
    print(type(e).__name__)
else:
    print("made")
"""


def test_a_store_whose_creation_stopped_on_a_full_disk_is_named_half_made(make_cfg, tmp_path):
    """Proves: the store left by MLflow's creation cut short on a full disk (tables made, its schema version not)
    is a StoreError naming the store as half-made, saying it holds no run and that deleting it and rerunning makes
    it anew; not "a supported version"."""
    db = tmp_path / "m.db"
    made = subprocess.run([sys.executable, "-c", FILL, f"sqlite:///{db}"], capture_output=True, text=True, timeout=300)
    assert made.stdout.strip() not in ("", "made") and db.exists(), made.stdout + made.stderr[-2000:]
    cfg = make_cfg(f"tracking.uri=sqlite:///{db}")
    with pytest.raises(StoreError) as refused:
        client.Tracker(cfg)
    text = " ".join(str(refused.value).split())
    assert f"The MLflow store {db} (tracking.uri) is half-made" in text, text
    assert "Nothing in it is a finished run" in text and f"rm {db}" in text and "supported version" not in text, text
