"""Nothing left outside the repository: a trial's files in the system temp dir are removed when it ends (success
and failure), and `pipeline ui` starts no MLflow job runners and leaves nothing in /dev/shm.

    .venv/bin/python -m pytest tests/trial/test_cleanup.py
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO

PROFILE = """
data: {train_limit: 2048, test_limit: 256}
train: {epochs: 1, warmup_steps: 1, check_every: 2}
sweep:
  spaces:
    ddp: {devices: [2], batch_size: [64], lr: [10000.0, 0.1]}
"""


@pytest.mark.slow
def test_trials_leave_nothing_in_the_temp_dir_on_success_or_failure(tmp_path, synthetic_root):
    root, systmp = tmp_path / "repo", tmp_path / "systmp"
    (root / "experiments").mkdir(parents=True)
    systmp.mkdir()
    (root / "experiments" / "t.yaml").write_text(PROFILE)
    (root / "params.yaml").write_text(f"profile: t\ndata: {{source: synthetic, dir: {synthetic_root}}}\n")
    env = {**os.environ, "DVC_ROOT": str(root), "PYTHONPATH": str(REPO), "TMPDIR": str(systmp)}
    p = subprocess.run(
        [sys.executable, "-m", "pipeline", "sweep", "--strategy", "ddp"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "trial 1/2 -> failed (diverged" in p.stderr, p.stderr[-3000:]
    assert "trial 2/2 -> " in p.stderr, p.stderr[-3000:]  # the count goes on after a failed trial
    assert sorted(os.listdir(systmp)) == [], "left in the temp dir: torchelastic_*, pytorch-errorfile-*, ..."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ui_starts_no_job_runners_and_leaves_nothing_in_dev_shm(make_cfg, tmp_path):
    make_cfg()
    shm = Path("/dev/shm")
    before = {p.name for p in shm.iterdir()} if shm.is_dir() else set()
    port = _free_port()
    env = {**os.environ, "DVC_ROOT": str(tmp_path), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "ui", "--set", "profile=", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            raise AssertionError("the UI did not answer within 120 s")
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        cmdlines = [" ".join(p.cmdline()) for p in tree]
        assert not [c for c in cmdlines if "huey" in c or "job" in c], cmdlines
        new = [n for n in ({p.name for p in shm.iterdir()} - before) if (shm / n).is_dir()] if shm.is_dir() else []
        assert not new, f"left in /dev/shm: {new}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    new = [n for n in ({p.name for p in shm.iterdir()} - before) if (shm / n).is_dir()] if shm.is_dir() else []
    assert not new, f"left in /dev/shm: {new}"
