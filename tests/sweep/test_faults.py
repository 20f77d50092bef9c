"""Faults that can only happen once runs are open (a store that fails mid-sweep), and trials whose heartbeat is
late: runs and trials are closed with the reason, never left RUNNING, never recorded twice; no traceback.

    .venv/bin/python -m pytest tests/sweep/test_faults.py
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import threading
import time

import optuna
import pytest
from optuna.trial import TrialState

from pipeline.cli import main
from pipeline.config import loader
from pipeline.records.table import point_of
from pipeline.sweep import claims
from pipeline.sweep.claims import storage_url
from pipeline.sweep.space import Space
from pipeline.sweep.stage import load_study, open_storage
from pipeline.tracking import client

PROFILE = """
data: {{train_limit: {n}, test_limit: 256}}
train: {{epochs: {epochs}, warmup_steps: 1}}
sweep:
  spaces:
    single: {{devices: [1], batch_size: [64], lr: {lrs}}}
"""


@pytest.fixture
def repo(make_cfg, tmp_path, synthetic_root, monkeypatch):
    def make(n=512, epochs=1, lrs="[0.1, 0.2]"):
        (tmp_path / "experiments" / "f.yaml").write_text(PROFILE.format(n=n, epochs=epochs, lrs=lrs))
        (tmp_path / "params.yaml").write_text(  # no wait for, and no flag of, a host the suite's own load keeps busy
            f"profile: f\ndata: {{source: synthetic, dir: {synthetic_root}}}\n"
            "train: {interference_threshold: 1.0e+6}\nsweep: {quiet_wait_s: 0}\n"
        )
        make_cfg(profile="f")  # DVC_ROOT, the profile
        return loader.load(None, [], root=tmp_path)  # as `main(["sweep", ...])` reads it: the same study name

    make_cfg()
    monkeypatch.chdir(tmp_path)
    return make


def _runs(tmp_path):
    from mlflow.tracking import MlflowClient

    mlflow_client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    exps = [e.experiment_id for e in mlflow_client.search_experiments()]
    return mlflow_client.search_runs(exps, max_results=1000)


def test_a_store_failing_mid_sweep_closes_the_trial_and_the_parent_failed_with_the_reason(
    repo, tmp_path, monkeypatch, capsys
):
    cfg = repo()
    real = client.log_completed_run

    def disk_full(*a, **kw):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(client, "log_completed_run", disk_full)
    code = main(["sweep", "--strategy", "single"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 1 and "Traceback" not in err, err
    assert "The sweep stopped in trial #0" in err and "database or disk is full" in err, err
    study = load_study(cfg, "single")
    (failed,) = study.get_trials(states=(TrialState.FAIL,))
    assert "database or disk is full" in failed.user_attrs["reason"]
    assert not study.get_trials(states=(TrialState.RUNNING,))
    runs = _runs(tmp_path)
    assert not [r for r in runs if r.info.status == "RUNNING"]
    (child,) = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert child.info.status == "FAILED" and "disk is full" in child.data.tags["failure"]
    (parent,) = [r for r in runs if r.data.tags.get("role") == "study"]
    assert parent.info.status == "FAILED" and "disk is full" in parent.data.tags["failure"]

    monkeypatch.setattr(client, "log_completed_run", real)  # the disk has space again: the rerun finishes
    assert main(["sweep", "--strategy", "single"]) == 0
    study = load_study(cfg, "single")
    assert sorted(t.params["lr"] for t in study.get_trials(states=(TrialState.COMPLETE,))) == [0.1, 0.2]
    runs = _runs(tmp_path)
    assert not [r for r in runs if r.info.status == "RUNNING"]
    assert [r.info.status for r in runs if r.data.tags.get("role") == "study"] == ["FINISHED"]


def _stale_study(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/stale.db", heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(storage=storage)
    study.enqueue_trial({"x": 1})
    trial = claims.claim(study)
    time.sleep(2.5)  # its heartbeat is now older than the grace period
    assert storage._get_stale_trial_ids(study._study_id) == [trial._trial_id]
    return storage, study, trial


def test_a_late_heartbeat_of_a_live_worker_on_this_host_keeps_its_trial(tmp_path):
    storage, study, trial = _stale_study(tmp_path)
    assert claims.fail_stale_trials(study) == []  # its worker (this process) is alive
    assert storage.get_trial(trial._trial_id).state == TrialState.RUNNING


def test_a_claimer_slowed_between_its_writes_keeps_its_trial(tmp_path, monkeypatch):
    """A loaded host delays the claimer between its writes (seen in CI: a claimer's owner record came over the grace
    period after its first heartbeat, and another worker on this host failed the live trial as stale and ran it
    again). Whatever claim() writes last, another worker judging the trial at that moment must keep it."""
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/slow.db", heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(storage=storage)
    study.enqueue_trial({"x": 1})
    judged = []

    def slowed(write):
        def wrapper(*args, **kwargs):
            time.sleep(2.5)  # past the grace period since the claim's earlier writes
            judged.append(claims.fail_stale_trials(study))  # another worker on this host checks for stale trials
            return write(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(storage, "record_heartbeat", slowed(storage.record_heartbeat))
    monkeypatch.setattr(storage, "set_trial_system_attr", slowed(storage.set_trial_system_attr))
    trial = claims.claim(study)
    assert trial is not None and judged == [[], []]
    assert storage.get_trial(trial._trial_id).state == TrialState.RUNNING


@pytest.mark.parametrize("worker", ["dead pid", "another host", "unknown"])
def test_a_stale_trial_of_a_dead_or_remote_worker_is_failed(tmp_path, worker):
    storage, study, trial = _stale_study(tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    owner = {
        "dead pid": {"host": socket.gethostname(), "pid": dead.pid, "start": None},
        "another host": {"host": "elsewhere.example", "pid": os.getpid(), "start": None},
        "unknown": None,
    }
    storage.set_trial_system_attr(trial._trial_id, claims.WORKER_ATTR, owner[worker])
    assert claims.fail_stale_trials(study) == [trial._trial_id]
    assert storage.get_trial(trial._trial_id).state == TrialState.FAIL


def test_a_worker_whose_trial_was_taken_over_stops_it_and_records_nothing(repo, tmp_path, monkeypatch, capsys):
    cfg = repo(n=4096, epochs=6, lrs="[0.1]")
    monkeypatch.setattr(claims, "HEARTBEAT_S", 0.1)
    storage = open_storage(storage_url(cfg))

    def other_worker():  # what a worker on another host does when it judges this trial stale
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                study = optuna.load_study(study_name=Space(cfg, "single").name, storage=storage)
                running = study.get_trials(states=(TrialState.RUNNING,))
                if running and running[0].user_attrs.get("mlflow_run_id"):
                    time.sleep(0.5)
                    storage.set_trial_state_values(running[0]._trial_id, state=TrialState.FAIL)
                    study.enqueue_trial(point_of(running[0]))
                    return
            except (KeyError, ValueError):
                pass
            time.sleep(0.05)

    thread = threading.Thread(target=other_worker)
    thread.start()
    code = main(["sweep", "--strategy", "single"])
    thread.join()
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err and "UpdateFinishedTrialError" not in err, err
    assert "taken over" in err, err
    study = optuna.load_study(study_name=Space(cfg, "single").name, storage=storage)
    states = [t.state for t in study.trials]
    assert states == [TrialState.FAIL, TrialState.COMPLETE], states  # the copy ran; the original kept nothing
    assert "metrics" not in study.trials[0].user_attrs and "reason" not in study.trials[0].user_attrs
    runs = {r.data.tags.get("trial"): r for r in _runs(tmp_path) if "mlflow.parentRunId" in r.data.tags}
    assert runs["0"].info.status == "KILLED" and runs["1"].info.status == "FINISHED"
    assert "taken over" in runs["0"].data.tags.get("failure", "") or "stale" in runs["0"].data.tags["failure"]
    assert not [r for r in _runs(tmp_path) if r.info.status == "RUNNING"]


def test_a_trial_waiting_for_a_quiet_host_is_never_taken_over_by_a_worker_on_another_host(
    repo, tmp_path, monkeypatch, capsys
):
    """Worker A (this sweep, seen as running on another host) claims the one trial and waits for a quiet host for
    over twice the grace period; worker B (a second engine on the same SQLite store) fails stale trials and claims
    waiting ones all the while. A's heartbeat beats from the claim, so B never fails the trial nor takes it over,
    and A runs it: one trial, COMPLETE once."""
    from pipeline.measure.quiet import QuietGate, Waited

    cfg = repo(lrs="[0.1]")
    grace = 3
    monkeypatch.setattr(claims, "GRACE_S", grace)
    monkeypatch.setattr(claims, "HEARTBEAT_S", 0.25)
    a = {"host": "worker-a.example", "pid": os.getpid(), "start": None}  # B judges A's trials by heartbeat alone
    monkeypatch.setattr(claims, "me", lambda: dict(a))
    waiting, done, wait_began = threading.Event(), threading.Event(), []

    def long_quiet_wait(gate):
        wait_began.append(time.monotonic())
        waiting.set()
        time.sleep(2.5 * grace)
        waiting.clear()
        return Waited(True, 2.5 * grace, 0.0, f"waited {2.5 * grace:.0f} s for a quiet moment")

    monkeypatch.setattr(QuietGate, "wait", long_quiet_wait)
    failed_by_b, taken_by_b, judged_late = [], [], []

    def worker_b():  # another host's worker loop on the same store, from A's claim on
        with claims.creating_stores(claims.storage_url(cfg)):  # as a worker opens it: never two creating its tables
            storage = open_storage(storage_url(cfg))
        while not done.is_set() and not taken_by_b:
            try:
                study = optuna.load_study(study_name=Space(cfg, "single").name, storage=storage)
            except KeyError:  # not created yet
                time.sleep(0.1)
                continue
            if waiting.is_set() or study.get_trials(states=(TrialState.RUNNING,)):
                t0 = time.monotonic()
                failed_by_b.extend(claims.fail_stale_trials(study))
                if (trial := claims.claim(study)) is not None:
                    taken_by_b.append(trial.number)
                if waiting.is_set() and t0 - wait_began[-1] > grace + 1:
                    judged_late.append(round(t0 - wait_began[-1], 1))
            time.sleep(0.2)

    thread = threading.Thread(target=worker_b)
    thread.start()
    try:
        code = main(["sweep", "--strategy", "single", "--set", "sweep.quiet_wait_s=60"])
    finally:
        done.set()
        thread.join()
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err, err
    assert failed_by_b == [] and taken_by_b == [], (failed_by_b, taken_by_b)
    assert judged_late, "worker B never judged the trial once its wait was past the grace period"
    assert "taken over" not in err, err
    study = load_study(cfg, "single")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE]
    assert study.trials[0].user_attrs.get("quiet_wait", "").startswith("waited ")


def test_a_read_only_store_is_refused_before_anything_opens(repo, tmp_path, monkeypatch, capsys):
    repo()
    db = tmp_path / "ro.db"
    sqlite3.connect(db).close()
    real = os.access
    # as root (CI) permissions never refuse a write: the check is exercised as a user without write access sees it
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(db) and mode == os.W_OK else real(p, mode))
    code = main(["sweep", "--strategy", "single", "--set", f"sweep.storage=sqlite:///{db}"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 1 and "is read-only" in err and "Traceback" not in err, err
    assert not (tmp_path / "mlruns" / "mlflow.db").exists()


CPU_OOM = (
    "DefaultCPUAllocator: can't allocate memory: you tried to allocate 80000000000 bytes. Error code 12 "
    "(Cannot allocate memory)"
)
NOT_ENOUGH = "[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: not enough memory: you tried to allocate 8"


def _oom_in_trial(monkeypatch, message, when=lambda cfg: True):
    """The trial's training raises PyTorch's CPU allocator error, in the trial's own (forked) process."""
    from pipeline.trial import ranks

    real = ranks.train

    def train(cfg, *args, **kwargs):
        if when(cfg):
            raise RuntimeError(message)
        return real(cfg, *args, **kwargs)

    monkeypatch.setattr(ranks, "train", train)


@pytest.mark.parametrize(
    "strategy,devices,message", [("single", 1, CPU_OOM), ("single", 1, NOT_ENOUGH), ("ddp", 2, CPU_OOM)]
)
def test_a_cpu_out_of_memory_in_a_trial_fails_it_with_kind_oom(
    make_cfg, tmp_path, monkeypatch, strategy, devices, message
):
    """PyTorch's CPU allocator raises RuntimeError, not torch.OutOfMemoryError: a trial whose ranks (one process, or
    one per device) raise it fails with kind `oom` and a reason that says the host ran out of memory."""
    from pipeline.errors import TrialFailed
    from pipeline.trial.launch import run_trial

    _oom_in_trial(monkeypatch, message)
    cfg = make_cfg(
        f"train.strategy={strategy}",
        f"train.devices={devices}",
        "train.oversubscribe=true",
        "train.batch_size=32",
        "data.train_limit=256",
        "data.test_limit=64",
        "train.epochs=1",
    )
    with pytest.raises(TrialFailed) as e:
        run_trial(cfg, tmp_path / "o", progress=False, timeout_s=60)
    assert e.value.kind == "oom", (e.value.kind, str(e.value))
    assert "out of memory" in str(e.value) and "DefaultCPUAllocator" in str(e.value), str(e.value)


def test_a_cpu_out_of_memory_fails_its_trial_and_the_sweep_and_its_rerun_go_on(repo, monkeypatch, capsys):
    """A point that runs the host out of memory is a failed trial of kind `oom` with the allocator's words; the
    sweep runs its other points and exits 0, and so does a rerun."""
    cfg = repo()
    _oom_in_trial(monkeypatch, CPU_OOM, when=lambda c: c.train.lr == 0.2)
    for _ in range(2):
        code = main(["sweep", "--strategy", "single"])
        err = " ".join(capsys.readouterr().err.split())
        assert code == 0 and "The sweep stopped" not in err, err
    study = load_study(cfg, "single")
    (done,) = study.get_trials(states=(TrialState.COMPLETE,))
    failed = study.get_trials(states=(TrialState.FAIL,))
    assert done.params["lr"] == 0.1 and failed and {t.params["lr"] for t in failed} == {0.2}
    for t in failed:
        assert t.user_attrs["failure_kind"] == "oom", t.user_attrs
        assert t.user_attrs["reason"].startswith("oom: ") and "can't allocate memory" in t.user_attrs["reason"]


def test_a_cpu_out_of_memory_while_the_caller_prepares_a_trial_fails_it_with_kind_oom(make_cfg, tmp_path, monkeypatch):
    """The caller loads a trial's data before forking its ranks (fork shares it): the allocator's RuntimeError there
    fails that trial with kind `oom` too, instead of stopping the sweep (which would enqueue the point again, and
    every rerun would stop on it)."""
    from pipeline.errors import TrialFailed
    from pipeline.trial import ranks
    from pipeline.trial.launch import run_trial

    def load_data(cfg, verify=False):
        raise RuntimeError(CPU_OOM)

    monkeypatch.setattr(ranks, "load_data", load_data)
    cfg = make_cfg("train.strategy=single", "train.start_method=fork", "train.batch_size=32", "data.train_limit=256")
    with pytest.raises(TrialFailed) as e:
        run_trial(cfg, tmp_path / "o", progress=False, timeout_s=60)
    assert e.value.kind == "oom" and "can't allocate memory" in str(e.value), (e.value.kind, str(e.value))


def test_two_workers_claiming_at_once_never_take_the_same_trial(make_cfg):
    """Seen on a loaded host: two workers both read a trial WAITING and both claimed it (SQLite's driver began the
    transaction only at the write). Here worker B claims while worker A is between its read and its write: B waits
    for A's transaction, then takes the other trial."""
    from sqlalchemy import event

    cfg = make_cfg()
    a, b = open_storage(storage_url(cfg)), open_storage(storage_url(cfg))  # two workers: two engines on one SQLite file
    study_a = optuna.create_study(storage=a, study_name="race")
    study_a.enqueue_trial({"x": 1})
    study_a.enqueue_trial({"x": 2})
    study_b = optuna.load_study(study_name="race", storage=b)
    got_b, racer = [], []

    def b_claims_now(conn, cursor, statement, *args):
        if statement.startswith("UPDATE trials SET state") and not racer:  # A read WAITING, writes RUNNING next
            racer.append(threading.Thread(target=lambda: got_b.append(claims.claim(study_b))))
            racer[0].start()
            racer[0].join(timeout=2)  # B's whole claim, unless it waits for A's transaction

    event.listen(a.engine, "before_cursor_execute", b_claims_now)
    got_a = claims.claim(study_a)
    event.remove(a.engine, "before_cursor_execute", b_claims_now)
    racer[0].join(timeout=60)
    assert got_a is not None and len(got_b) == 1 and got_b[0] is not None
    assert {got_a.number, got_b[0].number} == {0, 1}
    owners = [t.system_attrs[claims.WORKER_ATTR] for t in study_a.get_trials(states=(TrialState.RUNNING,))]
    assert len(owners) == 2
