"""Stores under faults: a full disk under mlruns/ during analyze, a locked tracking store and an unreachable Optuna
store mid-sweep, a store that accepts connections and never answers, and an `overlap.size` beyond any host.
Each gives one Parallax message that names the real cause, says only what is true about what was recorded, and
leaves no traceback and no run RUNNING that could have been ended.

    .venv/bin/python -m pytest tests/sweep/test_store_faults.py
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import optuna
import pytest

from pipeline.cli import main
from pipeline.config import loader
from pipeline.sweep.stage import load_study
from pipeline.tracking import client

from ..analysis.test_analyze import row, write
from . import test_faults
from .test_faults import _runs

repo = test_faults.repo  # the fixture (an assignment: an imported fixture used as an argument reads as F811)

REPO = Path(__file__).resolve().parents[2]


def _sweeps(tmp_path, synthetic_root) -> Path:
    (tmp_path / "params.yaml").write_text(f"profile: ''\ndata: {{source: synthetic, dir: {synthetic_root}}}\n")
    sweeps = tmp_path / "results" / "sweeps"
    sweeps.mkdir(parents=True)
    write([row("ddp", k=1, B=128, thr=1000), row("ddp", k=2, B=256, thr=1800)], sweeps / "ddp.jsonl")
    return sweeps


def test_a_full_disk_while_analyze_logs_artifacts_ends_its_run_failed_with_one_message(
    make_cfg, tmp_path, synthetic_root, monkeypatch, capsys
):
    """Proves: the file system under mlruns/ filling up while the analysis run's artifacts are copied ends that run
    FAILED (read back from the store), and the user reads one message naming the full disk and its path."""
    make_cfg()
    sweeps = _sweeps(tmp_path, synthetic_root)

    def full(self, run_id, path, subdir=None):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "mlruns" / "artifacts" / "x.png"))

    monkeypatch.setattr(client.Tracker, "log_artifacts", full)
    code = main(["analyze", "--sweeps", str(sweeps), "--out", str(tmp_path / "analysis")])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 1 and "Traceback (most recent" not in err and "unexpected" not in err, err
    assert "full" in err and str(tmp_path / "mlruns") in err, err
    (run,) = [r for r in _runs(tmp_path) if r.data.tags.get("stage") == "analyze"]
    assert run.info.status == "FAILED" and "ended FAILED" in err, err


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
        ).returncode
        == 0
    )


@pytest.mark.slow
def test_a_really_full_file_system_under_mlruns_leaves_no_analysis_run_running(tmp_path, synthetic_root):
    """Proves, on a real full file system (a 4 MiB tmpfs mounted on mlruns/, filled but for 100 KiB once the store
    exists): `analyze` leaves no analysis run RUNNING, prints no traceback and names the full disk. Needs root."""
    sweeps = _sweeps(tmp_path, synthetic_root)
    mlruns = tmp_path / "mlruns"
    if not _mount_tmpfs(mlruns, "4m"):
        pytest.skip("mounting a tmpfs needs root (and a kernel that allows it here)")
    env = {**os.environ, "DVC_ROOT": str(tmp_path), "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable,
        "-m",
        "pipeline",
        "analyze",
        "--params",
        str(tmp_path / "params.yaml"),
        "--sweeps",
        str(sweeps),
        "--out",
        str(tmp_path / "analysis"),
    ]
    try:
        assert subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, timeout=300).returncode == 0
        free = os.statvfs(mlruns).f_bavail * os.statvfs(mlruns).f_frsize
        with open(mlruns / "filler", "wb") as f:
            f.truncate(0)
            f.write(b"\0" * max(0, free - 100 * 1024))
        p = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        err = " ".join(p.stderr.split())
        assert p.returncode == 1 and "Traceback (most recent" not in err and "full" in err and str(mlruns) in err, err
        (mlruns / "filler").unlink()
        assert not [r for r in _runs(tmp_path) if r.info.status == "RUNNING"]
    finally:
        subprocess.run(["umount", "-l", str(mlruns)], capture_output=True)


def _locked():
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException

    cause = sqlalchemy.exc.OperationalError("UPDATE runs SET ...", {}, Exception("database is locked"))
    try:  # as MLflow's SQLAlchemy store reports it: a logged traceback, then MlflowException from the error
        raise cause
    except sqlalchemy.exc.OperationalError as e:
        logging.getLogger("mlflow.store.db.utils").exception(
            "SQLAlchemy database error. The following exception is caught.\n%s", e
        )
        err = MlflowException(message=e, error_code="TEMPORARILY_UNAVAILABLE")
        err.__cause__ = e
        return err


def test_a_locked_tracking_store_mid_sweep_says_so_and_claims_nothing_false(
    repo,
    tmp_path,
    monkeypatch,  # noqa: F811
    capsys,
):
    """Proves: mlflow.db locked by another process mid-sweep (every MLflow write fails "database is locked") gives
    one message naming the lock, no traceback, and the trial's MLflow run state as it is (never "ended FAILED"
    when its end could not be written)."""
    repo()

    def locked(*a, **kw):
        raise _locked()

    monkeypatch.setattr(client, "log_completed_run", locked)
    monkeypatch.setattr(client.Tracker, "end_run", locked)
    monkeypatch.setattr(client.Tracker, "set_tags", locked)
    code = main(["sweep", "--strategy", "single"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 1 and "Traceback (most recent" not in err, err
    assert "locked by another process" in err, err
    assert "ended FAILED" not in err and "RUNNING" in err, err
    (child,) = [r for r in _runs(tmp_path) if "mlflow.parentRunId" in r.data.tags]
    assert child.info.status == "RUNNING"  # what the message says


def _refused():
    import sqlalchemy.exc

    cause = sqlalchemy.exc.OperationalError(
        "SELECT ...",
        {},
        Exception('connection failed: connection to server at "127.0.0.1", port 5432 failed: Connection refused'),
    )
    err = optuna.exceptions.StorageInternalError(
        "An exception is raised during the commit. This typically happens due to invalid data in the commit, e.g. "
        "exceeding max length. "
    )
    err.__cause__ = cause
    return err


def test_an_unreachable_optuna_store_mid_sweep_names_the_cause_and_no_reenqueue_that_failed(
    repo, tmp_path, monkeypatch, capsys
):  # noqa: F811
    """Proves: the Optuna store going down mid-trial (Optuna wraps the driver's "Connection refused" into "... e.g.
    exceeding max length") is reported by its real cause, and the message claims a re-enqueue only if it happened."""
    cfg = repo()

    gone = threading.Event()  # the server goes down while the first trial's results are recorded

    def down(*a, **kw):
        gone.set()
        raise _refused()

    def unless_down(real):
        def call(*a, **kw):
            if gone.is_set():
                raise _refused()
            return real(*a, **kw)

        return call

    monkeypatch.setattr(client, "log_completed_run", down)
    for cls, name in (
        (optuna.study.Study, "tell"),
        (optuna.study.Study, "enqueue_trial"),
        (optuna.trial.Trial, "set_user_attr"),
    ):
        monkeypatch.setattr(cls, name, unless_down(getattr(cls, name)))
    code = main(["sweep", "--strategy", "single"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 1 and "Traceback (most recent" not in err, err
    assert "max length" not in err and "Connection refused" in err, err
    assert "enqueued again" not in err, err
    gone.clear()  # the server is back
    study = load_study(cfg, "single")
    assert len(study.trials) == 2  # nothing was re-enqueued, as the message says


def _black_hole():
    """A TCP listener that accepts connections and never sends a byte."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held = []

    def serve():
        while True:
            try:
                held.append(srv.accept()[0])
            except OSError:
                return

    threading.Thread(target=serve, daemon=True).start()
    return srv, held


def test_an_optuna_store_that_accepts_and_never_answers_fails_within_a_bound(make_cfg, tmp_path, synthetic_root):
    """Proves: a sweep whose PostgreSQL storage accepts the TCP connection and never answers says so within the
    store timeout (PARALLAX_STORE_TIMEOUT_S), having said what it waits for, instead of waiting without end."""
    make_cfg()
    (tmp_path / "params.yaml").write_text(
        f"profile: ''\ndata: {{source: synthetic, dir: {synthetic_root}, train_limit: 256, test_limit: 128}}\n"
    )
    srv, held = _black_hole()
    try:
        env = {**os.environ, "DVC_ROOT": str(tmp_path), "PYTHONPATH": str(REPO), "PARALLAX_STORE_TIMEOUT_S": "3"}
        url = f"postgresql://parallax@127.0.0.1:{srv.getsockname()[1]}/optuna"
        try:
            p = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pipeline",
                    "sweep",
                    "--strategy",
                    "single",
                    "--params",
                    str(tmp_path / "params.yaml"),
                    "--set",
                    f"sweep.storage={url}",
                ],
                env=env,
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=90,
            )
        except subprocess.TimeoutExpired:
            pytest.fail("the sweep waited 90 s on a store that never answers, without giving up")
        err = " ".join(p.stderr.split())
        assert p.returncode == 1 and "Traceback (most recent" not in err, err
        assert "did not answer within 3 s" in err and "sweep.storage" in err, err
        assert "waiting" in err.split("error:")[0], err  # said what it waits for before giving up
    finally:
        srv.close()
        for c in held:
            c.close()


def test_overlap_size_has_an_upper_bound_with_the_reason():
    """Proves: overlap.size beyond what a host can hold (size² floats per matrix, `items` of them pinned per arm)
    is refused with the bound and the reason, before anything runs."""
    with pytest.raises(loader.ConfigError, match=r"overlap.size.*<= 8192.*memory"):
        loader.load(None, ["overlap.size=100000"], root=REPO)
    assert loader.load(None, ["overlap.size=8192"], root=REPO).overlap.size == 8192


def test_ctrl_c_while_analyze_logs_its_run_ends_it_killed(make_cfg, tmp_path, synthetic_root, monkeypatch):
    """Ctrl-C (or SIGTERM, or the DVC that ran it gone) while the analysis run's artifacts are copied: the command
    exits 130 and the run ends KILLED with the reason, never left RUNNING."""
    import signal

    make_cfg()
    sweeps = _sweeps(tmp_path, synthetic_root)
    monkeypatch.setattr(client.Tracker, "log_artifacts", lambda *a, **k: signal.raise_signal(signal.SIGINT))
    assert main(["analyze", "--sweeps", str(sweeps), "--out", str(tmp_path / "analysis")]) == 130
    (run,) = [r for r in _runs(tmp_path) if r.data.tags.get("stage") == "analyze"]
    assert run.info.status == "KILLED" and "interrupted" in run.data.tags.get("failure", ""), run.data.tags
