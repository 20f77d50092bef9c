"""What tests/sweep/test_scaleout.py runs against: a throwaway PostgreSQL cluster and an `mlflow server` on 127.0.0.1
(module fixtures), sweep workers and their killer, and docs/scale-out.md's commands with their shell variables.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO

BIN = Path(sys.executable).parent


GRACE_S = 8  # PARALLAX_GRACE_S for the workers: how long the survivor waits for the dead worker's heartbeat


# The page's commands (docs/scale-out.md, "The commands, exactly"), with its shell variables.
COMMANDS = {
    "initdb": "initdb -D $PGDATA -U parallax --pwfile=$PWFILE --auth=scram-sha-256 --locale=C -E UTF8",
    "hba": "host all parallax samenet scram-sha-256",  # the line appended to $PGDATA/pg_hba.conf
    "pg_start": 'pg_ctl -D $PGDATA -l $PGDATA/server.log -o "-c listen_addresses=$DB_HOST -c port=$DB_PORT -k $PGDATA" -w start',
    "createdb_optuna": "createdb -h $DB_HOST -p $DB_PORT -U parallax optuna",
    "createdb_mlflow": "createdb -h $DB_HOST -p $DB_PORT -U parallax mlflow",
    "mlflow_server": "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false mlflow server "
    "--backend-store-uri postgresql://parallax@$DB_HOST:$DB_PORT/mlflow "
    "--serve-artifacts --artifacts-destination $ARTIFACTS "
    "--host $MLFLOW_HOST --port $MLFLOW_PORT --allowed-hosts $MLFLOW_HOST:$MLFLOW_PORT",
    "create_study": "python -m pipeline sweep --strategy $STRATEGY --n-trials 0 "
    "--set sweep.storage=postgresql://parallax@$DB_HOST:$DB_PORT/optuna "
    "--set tracking.uri=http://$MLFLOW_HOST:$MLFLOW_PORT",
    "worker": "python -m pipeline sweep --strategy $STRATEGY "
    "--set sweep.storage=postgresql://parallax@$DB_HOST:$DB_PORT/optuna "
    "--set tracking.uri=http://$MLFLOW_HOST:$MLFLOW_PORT",
    "pg_stop": "pg_ctl -D $PGDATA -m fast -w stop",
}


PROFILE = """description: |
  Test profile (tests/sweep/test_scaleout.py): two sweep workers sharing one study; 6 points, a global budget of 5.
data: {train_limit: 2048, test_limit: 256}
train: {epochs: 3, warmup_steps: 1}
sweep:
  sampler: grid
  n_trials: 5
  spaces:
    single: {devices: [1], batch_size: [64, 128], lr: [0.05, 0.1, 0.2]}
analyze: {target_acc: 0.5}
"""


START = re.compile(r"\[sweep \w+\] trial \d+/\d+ \(#(\d+)\)")


DONE = re.compile(r"\[sweep \w+\] trial \d+/\d+ -> (.*)")


EPOCH = re.compile(r"\[sweep \w+\] trial \d+/\d+ epoch (\d+)/")


def figure(**kw) -> None:
    print("FIGURE " + json.dumps(kw))


def render(name: str, values: dict) -> tuple[dict, list[str]]:
    """The page's command `name` with its variables filled in: (leading VAR=value environment, argv)."""
    text = re.sub(r"\$([A-Z_]+)", lambda m: str(values[m.group(1)]), COMMANDS[name])
    words = shlex.split(text)
    env = {}
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    return env, words


def _required() -> bool:
    return os.environ.get("PARALLAX_REQUIRE_POSTGRES", "") not in ("", "0")


def _unavailable(reason: str):
    if _required():
        pytest.fail(f"PostgreSQL is required here (PARALLAX_REQUIRE_POSTGRES=1) but {reason}")
    pytest.skip(f"PostgreSQL scale-out test skipped: {reason}")


def _pg_bin() -> Path | None:
    if os.environ.get("PARALLAX_PG_BIN"):  # a folder holding initdb, pg_ctl and createdb
        given = Path(os.environ["PARALLAX_PG_BIN"])
        return given if (given / "pg_ctl").exists() else None
    found = [Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin") if (Path(p) / "pg_ctl").exists()]
    if found:  # Debian's layout; the newest major version
        return max(found, key=lambda p: int(re.sub(r"\D", "", p.parent.name) or 0))
    on_path = shutil.which("pg_ctl")
    return Path(on_path).parent if on_path else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(argv, env=None, timeout=120, as_user=None) -> subprocess.CompletedProcess:
    if as_user:
        argv = ["runuser", "-u", as_user, "--", *argv]
    return subprocess.run(argv, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def postgres():
    """A throwaway PostgreSQL cluster on 127.0.0.1 with databases `optuna` and `mlflow`; values for the page's
    variables (DB_HOST, DB_PORT, PGPASSWORD)."""
    try:
        import psycopg  # noqa: F401  SQLAlchemy 2.1's driver for postgresql:// URLs (Optuna and MLflow)
    except ImportError:
        _unavailable("the driver is not installed (pip install 'psycopg[binary]', part of the test extra)")
    pg = _pg_bin()
    if pg is None:
        _unavailable("no PostgreSQL server binaries (initdb, pg_ctl); .ci/run installs Debian's `postgresql`")
    as_user = None
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root: the package's `postgres` user runs it
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            _unavailable("running as root and there is no `postgres` user to run the server as")
        if not shutil.which("runuser"):
            _unavailable("running as root and `runuser` is missing")
        as_user = "postgres"
    # as root, the folder is handed to `postgres`, which must be able to reach it: /tmp, not a private TMPDIR
    base = Path(tempfile.mkdtemp(prefix="parallax-pg-", dir="/tmp" if as_user else None))
    values = {
        "PGDATA": base / "data",
        "PWFILE": base / "pwfile",
        "DB_HOST": "127.0.0.1",
        "DB_PORT": _free_port(),
        "PGPASSWORD": "parallax-test-pw",
    }
    values["PWFILE"].write_text(values["PGPASSWORD"] + "\n")
    if as_user:
        pw = pwd.getpwnam(as_user)
        for p in (base, values["PWFILE"]):
            os.chown(p, pw.pw_uid, pw.pw_gid)
    client_env = {"PGPASSWORD": values["PGPASSWORD"]}
    started = False
    try:
        t0 = time.monotonic()
        _, argv = render("initdb", values)
        p = _run([str(pg / argv[0]), *argv[1:]], as_user=as_user)
        if p.returncode:
            _unavailable(f"initdb failed: {(p.stdout + p.stderr)[-1500:]}")
        with open(values["PGDATA"] / "pg_hba.conf", "a") as f:
            f.write(COMMANDS["hba"] + "\n")
        with open(values["PGDATA"] / "postgresql.conf", "a") as f:
            f.write("fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n")  # throwaway: speed only
        _, argv = render("pg_start", values)
        p = _run([str(pg / argv[0]), *argv[1:]], as_user=as_user)
        log = values["PGDATA"] / "server.log"
        if p.returncode:
            _unavailable(
                f"pg_ctl start failed: {(p.stdout + p.stderr)[-800:]} {log.read_text()[-1500:] if log.exists() else ''}"
            )
        started = True
        for db in ("createdb_optuna", "createdb_mlflow"):
            _, argv = render(db, values)
            p = _run([str(pg / argv[0]), *argv[1:]], env=client_env)
            assert p.returncode == 0, f"{argv} failed: {p.stdout}{p.stderr}"
        figure(postgres_ready_s=round(time.monotonic() - t0, 2), pg_bin=str(pg), run_as=as_user or "self")
        yield values
    finally:
        if started:
            _, argv = render("pg_stop", values)
            p = _run([str(pg / argv[0]), *argv[1:]], as_user=as_user)
            if p.returncode:  # never leave it running: immediate shutdown
                _run([str(pg / argv[0]), "-D", str(values["PGDATA"]), "-m", "immediate", "-w", "stop"], as_user=as_user)
        shutil.rmtree(base, ignore_errors=True)


def _health(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _stop_group(proc: subprocess.Popen) -> None:
    """End a process we started in a session of its own, with everything it started (uvicorn workers)."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def mlflow_server(postgres, tmp_path_factory):
    """`mlflow server` on 127.0.0.1, backed by the `mlflow` database, artifacts served from a shared folder."""
    base = tmp_path_factory.mktemp("mlflow-server")
    values = {**postgres, "ARTIFACTS": base / "artifacts", "MLFLOW_HOST": "127.0.0.1", "MLFLOW_PORT": _free_port()}
    env, argv = render("mlflow_server", values)
    log = base / "server.log"
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [str(BIN / argv[0]), *argv[1:]],
        cwd=base,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, **env, "PGPASSWORD": str(postgres["PGPASSWORD"])},
    )
    url = f"http://{values['MLFLOW_HOST']}:{values['MLFLOW_PORT']}"
    try:
        deadline = time.monotonic() + 180
        while not _health(url):
            assert proc.poll() is None, f"mlflow server exited (rc {proc.returncode}):\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"mlflow server did not answer in 180 s:\n{log.read_text()[-4000:]}"
            time.sleep(0.5)
        figure(mlflow_server_ready_s=round(time.monotonic() - t0, 2))
        yield {**values, "url": url, "log": log}
    finally:
        _stop_group(proc)


class Killer:
    """SIGKILLs the first worker seen in the middle of its second (or later) trial. Called by the workers' reader
    threads on every line, so the signal follows the worker's "epoch 1" line at once, long before the trial ends."""

    def __init__(self):
        self.lock, self.done = threading.Lock(), threading.Event()
        self.victim, self.trial, self.at = None, None, None

    def offer(self, worker: "Worker") -> None:
        if self.done.is_set() or not worker.mid_trial():
            return
        with self.lock:
            if self.victim is None:
                os.kill(worker.proc.pid, signal.SIGKILL)
                self.victim, self.trial, self.at = worker, worker.started()[-1], time.monotonic()
                self.done.set()


class Worker:
    """One `python -m pipeline sweep` process; its output lines are kept (and written to a log) as they come."""

    def __init__(self, name, argv, root, env, killer: Killer):
        self.name, self.root, self.killer = name, root, killer
        self.lines: list[str] = []
        self.log = open(root / f"{name}.log", "w")
        self.proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self.log.write(line)
            self.log.flush()
            self.killer.offer(self)

    def started(self) -> list[int]:
        return [int(m.group(1)) for line in list(self.lines) if (m := START.search(line))]

    def finished(self) -> list[str]:
        return [m.group(1) for line in list(self.lines) if (m := DONE.search(line))]

    def mid_trial(self) -> bool:
        """True once it has finished a trial and reported epoch 1 of the next one (so that one is mid-run)."""
        lines = list(self.lines)
        last_done = max((i for i, line in enumerate(lines) if DONE.search(line)), default=None)
        return last_done is not None and any(
            (m := EPOCH.search(line)) and m.group(1) == "1" for line in lines[last_done + 1 :]
        )

    def text(self) -> str:
        return "\n".join(self.lines)

    def wait(self, timeout) -> int:
        rc = self.proc.wait(timeout)
        self.reader.join(10)
        self.log.close()
        return rc

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
