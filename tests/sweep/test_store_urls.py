"""Where the stores of a URL land: a relative SQLite path resolves against the store root ($DVC_ROOT when set, else
the repository root), as the empty default does, never against the current directory or DVC's temporary checkout;
an in-memory SQLite store, whose results would vanish with the process, is refused."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline import preflight
from pipeline.errors import StoreError
from pipeline.sweep.claims import storage_url
from pipeline.tracking.client import tracking_uri
from tests.conftest import REPO


def test_a_relative_sqlite_url_resolves_against_the_store_root(make_cfg, tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # DVC's temp checkout, or a sub-directory: never where the stores go
    cfg = make_cfg("sweep.storage=sqlite:///o.db", "tracking.uri=sqlite+pysqlite:///sub/m.db?timeout=30")
    assert storage_url(cfg) == f"sqlite:///{tmp_path / 'o.db'}"
    assert tracking_uri(cfg) == f"sqlite+pysqlite:///{tmp_path / 'sub' / 'm.db'}?timeout=30"
    for absolute in (f"sqlite:///{tmp_path / 'abs.db'}", "postgresql://u@db:5432/o", "http://127.0.0.1:5000"):
        assert storage_url(make_cfg(f"sweep.storage={absolute}")) == absolute
        assert tracking_uri(make_cfg(f"tracking.uri={absolute}")) == absolute
    assert storage_url(make_cfg()) == f"sqlite:///{tmp_path / 'mlruns' / 'optuna.db'}"


@pytest.mark.parametrize(
    "url", ["sqlite://", "sqlite:///:memory:", "sqlite+pysqlite:///:memory:", "sqlite:///file:x?mode=memory&uri=true"]
)
@pytest.mark.parametrize("key", ["sweep.storage", "tracking.uri"])
def test_an_in_memory_store_is_refused(url, key):
    with pytest.raises(StoreError) as e:
        preflight.check_store(url, key)
    msg = " ".join(str(e.value).split())
    assert key in msg and "in memory" in msg and "vanish" in msg, msg


def test_the_sweep_writes_its_stores_at_the_root_when_run_elsewhere(tmp_path, synthetic_root):
    """The probe's A5 in small: cwd is a throw-away checkout, DVC_ROOT the repository; the stores land in the root
    and the message says where."""
    root, temp = tmp_path / "repo", tmp_path / "repo" / ".dvc" / "tmp" / "exps" / "tmp123"
    temp.mkdir(parents=True)
    (root / "experiments").mkdir()
    (root / "experiments" / "cpu.yaml").write_text((REPO / "experiments" / "cpu.yaml").read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "OPTUNA_", "DVC_"))}
    env.update(PYTHONPATH=str(REPO), DVC_ROOT=str(root))
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "sweep",
            "--strategy",
            "single",
            "--n-trials",
            "0",
            "--out",
            str(temp / "single.jsonl"),
            "--set",
            "data.source=synthetic",
            "--set",
            f"data.dir={synthetic_root}",
            "--set",
            "sweep.quiet_wait_s=0",
            "--set",
            "sweep.storage=sqlite:///optuna_rel.db",
            "--set",
            "tracking.uri=sqlite:///mlflow_rel.db",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=temp,
    )
    out = " ".join((p.stdout + p.stderr).split())
    assert p.returncode == 0, out[-3000:]
    assert (root / "optuna_rel.db").is_file() and (root / "mlflow_rel.db").is_file(), out[-3000:]
    assert not list(temp.glob("*.db")), list(temp.iterdir())
    assert f"sweep.storage=sqlite:///optuna_rel.db is relative: the store is {root / 'optuna_rel.db'}" in out, out
