"""Stores lost or full mid-sweep: an MLflow server whose process is gone, an Optuna database server that closes its
connections, an MLflow artifact folder that fills while the study's results are logged. Each ends in one paragraph
that names the store, says what ran and is recorded, and that a rerun resumes; a lost server is given up on within
a bound, saying what it waits for meanwhile.

    .venv/bin/python -m pytest tests/sweep/test_lost_stores.py
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import subprocess
import sys
import threading

import optuna
import sqlalchemy.exc
from optuna.storages._rdb import storage as rdb

from pipeline.cli import main
from pipeline.sweep.worker import Worker
from pipeline.tracking.client import Tracker
from pipeline.tracking.run_listener import MlflowListener

from . import test_faults
from .test_faults import _runs

repo = test_faults.repo  # the fixture (an assignment: an imported fixture used as an argument reads as F811)

HTTP_VARS = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR")

SERVER = """
import os, sys
from mlflow.server.constants import ARTIFACT_ROOT_ENV_VAR, BACKEND_STORE_URI_ENV_VAR
os.environ[BACKEND_STORE_URI_ENV_VAR], os.environ[ARTIFACT_ROOT_ENV_VAR] = sys.argv[1], sys.argv[2]
from mlflow.server import app
from mlflow.server.handlers import _get_tracking_store
from werkzeug.serving import make_server
_get_tracking_store()  # its tables made before the first request
server = make_server("127.0.0.1", int(sys.argv[3]), app, threaded=True)
print("ready", flush=True)
server.serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(base, port) -> subprocess.Popen:
    """An MLflow tracking server on 127.0.0.1:port, its own process (SQLite behind it), answering once it says so."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, f"sqlite:///{base}/server.db", str(base / "artifacts"), str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready", "the MLflow server did not start"
    return proc


def test_a_lost_mlflow_server_is_given_up_on_within_a_bound_said_while_waiting(repo, tmp_path, monkeypatch, capsys):
    """Proves: an MLflow server whose process is gone mid-trial (as when its machine stops) is retried a bounded
    number of times (MLflow's MLFLOW_HTTP_REQUEST_MAX_RETRIES, 3 unless the user sets it), each retry printing a line
    naming the server; the sweep then stops with one paragraph naming the server and its fault, and the rerun, with
    the server back, ends the trial's run and finishes the study. The user's own setting wins (backoff 0 here,
    which keeps the test short)."""
    for name in HTTP_VARS:
        monkeypatch.delenv(name, raising=False)  # restored as they were after the test
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")  # the user's: it wins
    repo(lrs="[0.1]")
    base, port = tmp_path / "server", _free_port()
    base.mkdir()
    url = f"http://127.0.0.1:{port}"
    server = _serve(base, port)
    real = MlflowListener.epoch

    def server_lost(self, trial, record):
        if server.poll() is None:
            server.kill()
            server.wait()
        return real(self, trial, record)

    monkeypatch.setattr(MlflowListener, "epoch", server_lost)
    try:
        code = main(["sweep", "--strategy", "single", "--set", f"tracking.uri={url}"])
        err = " ".join(capsys.readouterr().err.split())
        assert code == 1 and "Traceback (most recent" not in err and "error: unexpected" not in err, err
        assert f"waiting for the MLflow server {url} (retry 1/3: [Errno 111] Connection refused" in err, err
        assert "(retry 3/3" in err and "(retry 4/" not in err, err
        assert os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] == "0", "the user's setting was overridden"
        stop = err.split("error: ")[-1]
        assert f"the MLflow server {url} (tracking.uri): the store is unreachable ([Errno 111]" in stop, stop
        monkeypatch.setattr(MlflowListener, "epoch", real)
        server = _serve(base, port)  # the server is back: the rerun finishes the study and ends the trial's run
        assert main(["sweep", "--strategy", "single", "--set", f"tracking.uri={url}"]) == 0
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=f"sqlite:///{base}/server.db")
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        assert not [r for r in runs if r.info.status == "RUNNING"], [(r.info.run_name, r.info.status) for r in runs]
    finally:
        server.kill()
        server.wait()


def _connection_lost():
    try:
        raise sqlalchemy.exc.OperationalError(
            "UPDATE trials SET ...", {}, Exception("server closed the connection unexpectedly")
        )
    except sqlalchemy.exc.OperationalError as e:
        try:  # as Optuna's RDB storage reports it (its _create_scoped_session)
            raise optuna.exceptions.StorageInternalError(
                "An exception is raised during the commit. This typically happens due to invalid data in the "
                "commit, e.g. exceeding max length. "
            ) from e
        except optuna.exceptions.StorageInternalError as wrapped:
            return wrapped


def test_an_optuna_store_lost_mid_sweep_names_the_store_what_finished_and_that_a_rerun_resumes(
    repo, tmp_path, monkeypatch, capsys
):
    """Proves: the Optuna database server closing its connections during the second trial (PostgreSQL stopped: every
    storage call raises StorageInternalError from OperationalError) stops the sweep with one paragraph naming the
    Optuna store, how many trials finished and that a rerun resumes, exit 1; the study's parent run is ended, not
    left RUNNING."""
    repo()
    lost = threading.Event()
    real_session = rdb._create_scoped_session

    @contextlib.contextmanager
    def session(*a, **kw):
        if lost.is_set():
            raise _connection_lost()
        with real_session(*a, **kw) as s:
            yield s

    real_judge = Worker._judge

    def judged(self, trial):
        judge = real_judge(self, trial)

        def at_an_epoch(one, record):
            if trial.number == 1 and record is not None:
                lost.set()  # the server stops during the second trial
            return judge(one, record)

        return at_an_epoch

    monkeypatch.setattr(rdb, "_create_scoped_session", session)
    monkeypatch.setattr(Worker, "_judge", judged)
    code = main(["sweep", "--strategy", "single"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 1 and "Traceback (most recent" not in err and "error: unexpected" not in err, err
    stop = err.split("error: ")[-1]
    assert f"the Optuna store sqlite:///{tmp_path}/mlruns/optuna.db (sweep.storage)" in stop, stop
    assert "server closed the connection unexpectedly" in stop and "max length" not in stop, stop
    assert "it resumes the study, keeping the 1 trial(s) that ran to an end" in stop, stop
    (parent,) = [r for r in _runs(tmp_path) if r.data.tags.get("role") == "study"]
    assert parent.info.status == "FAILED", parent.info.status


def test_a_full_mlflow_artifact_folder_after_the_trials_says_what_ran_and_that_a_rerun_logs_it(
    repo, tmp_path, monkeypatch, capsys
):
    """Proves: the MLflow artifact folder filling while the study's parent run logs its table and plots (after every
    trial ran) is one paragraph naming the folder and its free space and saying truthfully what ran, exit 1; the
    parent run ends FAILED with the reason; the rerun with space logs them and ends it FINISHED, running no trial."""
    repo(lrs="[0.1]")
    real = Tracker.log_artifact
    folder = tmp_path / "mlruns" / "artifacts"

    def full(self, run_id, path, subdir=None):
        if subdir == "study":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder / "1" / run_id / "study" / "x.jsonl"))
        return real(self, run_id, path, subdir)

    monkeypatch.setattr(Tracker, "log_artifact", full)
    code = main(["sweep", "--strategy", "single"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 1 and "Traceback (most recent" not in err and "error: unexpected" not in err, err
    stop = err.split("error: ")[-1]
    assert "Nothing more was run" not in stop and "1 trial(s) of study" in stop and "ran and are recorded" in stop, stop
    assert f"artifact folder {folder}" in stop and " free of " in stop and "were not logged" in stop, stop
    assert "rerun" in stop, stop
    (parent,) = [r for r in _runs(tmp_path) if r.data.tags.get("role") == "study"]
    assert parent.info.status == "FAILED" and "not logged" in parent.data.tags["failure"], parent.data.tags

    monkeypatch.setattr(Tracker, "log_artifact", real)  # space again
    assert main(["sweep", "--strategy", "single"]) == 0
    runs = _runs(tmp_path)
    assert [r.info.status for r in runs if r.data.tags.get("role") == "study"] == ["FINISHED"]
    assert len([r for r in runs if "mlflow.parentRunId" in r.data.tags]) == 1  # no trial ran again
