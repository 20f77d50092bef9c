"""Which sweep worker runs which trial: atomic claims, heartbeats, and stale trials taken over.

A worker claims a WAITING trial (one storage transaction: only one worker wins it), records who it is (host, pid,
process start time) and beats every HEARTBEAT_S. A trial whose heartbeat is older than GRACE_S is failed as stale
and a copy enqueued (Optuna's retry callback), unless its worker runs on this host and is alive: a busy host
(load average above its cores, SQLite writers queuing on the lock) delays heartbeats, and a late heartbeat of a
live worker must not lose its trial. Workers on other hosts are judged by their heartbeat alone. A worker whose
trial was taken over anyway (another host judged it stale) notices at its next beat, stops the trial at the next
epoch and records nothing for it.
"""
from __future__ import annotations

import copy
import os
import socket
import threading

import optuna
from optuna.trial import TrialState

# A trial whose heartbeat is older than GRACE_S is failed as stale and enqueued again: a rerun after a SIGKILL waits
# that long for it. PARALLAX_GRACE_S shortens the wait (tests; at least 4 s, so that a live trial, beating every
# HEARTBEAT_S, is never taken for a dead one).
GRACE_S = max(4, int(os.environ.get("PARALLAX_GRACE_S", "20")))
HEARTBEAT_S = max(1, min(5, GRACE_S // 4))
WORKER_ATTR = "parallax_worker"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), so a reused pid is not taken for the worker."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _me() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": _start_time(os.getpid())}


def is_alive_here(worker: dict | None) -> bool:
    """True if `worker` runs on this host and its process is alive (the same process, not a reused pid)."""
    if not worker or worker.get("host") != socket.gethostname():
        return False
    pid = worker.get("pid")
    try:
        os.kill(pid, 0)
    except PermissionError:  # alive, another user's
        return True
    except (OSError, TypeError):
        return False
    start = _start_time(pid)
    return start is None or worker.get("start") in (None, start)


def claim(study: optuna.Study, runnable=lambda point: True) -> optuna.Trial | None:
    """Atomically take one waiting trial that this host can run (the storage refuses the RUNNING transition to all
    but one worker). A trial that needs more devices than this worker offers is left to a worker that has them."""
    storage = study._storage
    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if not runnable(t.system_attrs.get("fixed_params") or t.params):
            continue
        try:
            if storage.set_trial_state_values(t._trial_id, state=TrialState.RUNNING):
                # at once: Optuna never calls a trial without a heartbeat stale, so a worker killed before its
                # first beat would leave the trial RUNNING for ever and every rerun waiting on it
                storage.record_heartbeat(t._trial_id)
                storage.set_trial_system_attr(t._trial_id, WORKER_ATTR, _me())
                return optuna.Trial(study, t._trial_id)
        except (RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
            continue
    return None


def fail_stale_trials(study: optuna.Study) -> list[int]:
    """optuna.storages.fail_stale_trials, except for trials whose worker is alive on this host; returns the ids
    failed here (their retry callback has enqueued a copy of each)."""
    storage = study._storage
    failed = []
    for trial_id in storage._get_stale_trial_ids(study._study_id):
        if is_alive_here(storage.get_trial_system_attrs(trial_id).get(WORKER_ATTR)):
            continue  # late, not dead: its worker is busy, not gone
        try:
            if storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
                failed.append(trial_id)
        except optuna.exceptions.UpdateFinishedTrialError:  # another worker failed it first
            pass
    callback = storage.get_heartbeat_stale_trial_callback()
    for trial_id in failed if callback else ():
        callback(study, copy.deepcopy(storage.get_trial(trial_id)))
    return failed


class Heartbeat:
    """Beats for a claimed trial while it runs; `lost` is set once the trial is no longer RUNNING (taken over)."""

    def __init__(self, storage, trial_id):
        self.storage, self.trial_id, self.stop = storage, trial_id, threading.Event()
        self.lost = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True, name="parallax-heartbeat")

    def _beat(self):
        while not self.stop.is_set():
            try:
                if self.storage.get_trial(self.trial_id).state != TrialState.RUNNING:
                    self.lost.set()
                    return
                self.storage.record_heartbeat(self.trial_id)
            except Exception:  # a locked or unreachable store: try again at the next beat
                pass
            self.stop.wait(HEARTBEAT_S)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def end_stale_mlflow_runs(study, tracker) -> None:
    """End the MLflow run of every trial that was failed as stale (its worker died): never left RUNNING."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        run_id = t.user_attrs.get("mlflow_run_id")
        if run_id and not t.user_attrs.get("reason"):
            run = tracker.client.get_run(run_id)
            if run.info.status == "RUNNING":
                tracker.set_tags(run_id, {"failure": "worker died (heartbeat stale); trial enqueued again"})
                tracker.end_run(run_id, "KILLED")
