"""The sweep's worker queue: which worker runs which trial (atomic claims), heartbeats, stale trials taken over, and
the worker loop. The only module that touches Optuna's private API (study._storage, trial._trial_id,
storage._get_stale_trial_ids): stage.py and the rest go through the public functions here.

Why not `study.optimize`: the sweep enqueues every feasible point once, when the study is created, and any number of
workers (on one host or many, sharing an RDB) must run exactly that queue. optimize serves a different model: (1)
when no trial is waiting it asks the sampler for a new point, where a worker here must wait for the trials other
workers hold and stop when the queue is done; the claim below takes a waiting trial in one storage transaction (only
one worker wins it) and records its owner and a first heartbeat right after, in two more commits (milliseconds: a
worker killed inside that window leaves its trial RUNNING, docs/reliability.md, Limits); (2) optimize's
fail_stale_trials fails every trial with a late heartbeat, including one whose worker is alive on this host and only
slowed down (a busy host, SQLite writers queuing), and a copy must be enqueued again for a dead one; (3) optimize
takes whatever trial is next, where a worker must skip the points this host cannot run (more devices than it has, a
CUDA-only strategy on a CPU host) and leave them waiting for a larger worker.

A worker claims a WAITING trial (one storage transaction: only one worker wins it), records who it is (host, pid,
process start time) and beats every HEARTBEAT_S from the claim to the release (`claimed`): through the wait for a
quiet host, the trial's set-up, its run and its end told, so no wait of this worker's makes its trial look dead. A
trial whose heartbeat is older than GRACE_S is failed as stale
and a copy enqueued (Optuna's retry callback), unless its worker runs on this host and is alive: a busy host
(load average above its cores, SQLite writers queuing on the lock) delays heartbeats, and a late heartbeat of a
live worker must not lose its trial. Workers on other hosts are judged by their heartbeat alone. A worker whose
trial was taken over anyway (another host judged it stale) notices at its next beat, stops the trial at the next
epoch and records nothing for it.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import os
import random
import socket
import sys
import threading
import time

import optuna
from optuna.trial import TrialState

from pipeline import processes
from pipeline.config.loader import TIMEOUT_MAX_S
from pipeline.env import env_number
from pipeline.errors import StoreError
from pipeline.paths import store_root
from pipeline.preflight import check_store, store_url
from pipeline.records.table import point_of
from pipeline.redact import redact
from pipeline.signals import signals_deferred
from pipeline.store_faults import root_cause, store_fault

# A trial whose heartbeat is older than GRACE_S is failed as stale and enqueued again: a rerun after a SIGKILL waits
# that long for it. PARALLAX_GRACE_S shortens the wait (tests; at least 4 s, so that a live trial, beating every
# HEARTBEAT_S, is never taken for a dead one).
GRACE_S = max(
    4,
    int(
        env_number(
            "PARALLAX_GRACE_S",
            20,
            lo=0,
            hi=TIMEOUT_MAX_S,
            what="how many seconds a trial's heartbeat may be late before it is failed as stale (4 at least are used)",
        )
    ),
)
# a database server's connect (TCP, then its start-up exchange) is bounded: libpq's connect_timeout (2 s at least)
STORE_TIMEOUT_S = max(
    2,
    int(
        env_number(
            "PARALLAX_STORE_TIMEOUT_S",
            30,
            lo=0,
            hi=TIMEOUT_MAX_S,
            what="how many seconds the sweep waits for the Optuna database to answer (2 at least are used)",
        )
    ),
)
HEARTBEAT_S = max(1, min(5, GRACE_S // 4))
WORKER_ATTR = "parallax_worker"


def start_time(pid: int) -> str | None:
    """The process's start in clock ticks after boot (processes.started), so a reused pid is not taken for the
    worker; None where it cannot be read."""
    return processes.started(pid)


_STARTED: dict[int, str | None] = {}  # this process's start, by pid (a forked child reads its own)


def me() -> dict:
    """This worker: its host, pid and process start time (is_alive_here tells whether it still runs). The start is
    read once per process, so every claim, release and set-up of this worker carries the same identity."""
    pid = os.getpid()
    if pid not in _STARTED:
        _STARTED[pid] = start_time(pid)
    return {"host": socket.gethostname(), "pid": pid, "start": _STARTED[pid]}


def is_alive_here(worker: dict | None) -> bool:
    """True if `worker` runs on this host and its process is alive (the same process, not a reused pid). A start
    recorded as None (a host where it was not readable) or not readable now counts as the same process."""
    if not worker or worker.get("host") != socket.gethostname():
        return False
    pid = worker.get("pid")
    try:
        os.kill(pid, 0)
    except PermissionError:  # alive, another user's
        return True
    except (OSError, TypeError):
        return False
    if processes.running(pid) is False:  # exited, not yet reaped by its parent
        return False
    start = start_time(pid)
    return start is None or worker.get("start") is None or processes.same_start(worker.get("start"), start)


def claim(study: optuna.Study, runnable=lambda point: True) -> optuna.Trial | None:
    """Atomically take one waiting trial that this host can run (the storage refuses the RUNNING transition to all
    but one worker). A trial that needs more devices than this worker offers is left to a worker that has them."""
    storage = study._storage
    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if not runnable(point_of(t)):
            continue
        try:
            with signals_deferred():  # Ctrl-C or SIGTERM waits for the three writes: never a trial without its owner
                if not storage.set_trial_state_values(t._trial_id, state=TrialState.RUNNING):
                    continue
                # the owner first, then the first beat, each right away: Optuna never calls a trial without a heartbeat
                # stale, so a worker killed before its first beat would leave the trial RUNNING for ever and every
                # rerun waiting on it; and a trial with a heartbeat but no owner yet is judged by its heartbeat
                # alone, so a claimer slowed between the two writes (a loaded host: the owner's write came over
                # GRACE_S after the beat) lost its live trial to another worker on this host. In this order a trial
                # is never stale before its owner is recorded.
                storage.set_trial_system_attr(t._trial_id, WORKER_ATTR, me())
                storage.record_heartbeat(t._trial_id)
            return optuna.Trial(study, t._trial_id)
        except (RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
            continue
    return None


# a trial's attributes given when it is enqueued, which a copy enqueued again keeps (study_setup, worker)
QUEUED_ATTRS = ("repeat", "remeasure", "remeasure_of", "requeued")


def release_mine(study: optuna.Study, why: str) -> list[int]:
    """Fail each trial this worker holds RUNNING with `why` as its reason and enqueue its point again; returns their
    numbers. For a worker stopped between a trial's claim and its end (Ctrl-C in the quiet wait, or while the trial is
    set up): the trial is not left RUNNING until a rerun finds its heartbeat stale."""
    mine, released = me(), []
    for t in running(study):
        if t.system_attrs.get(WORKER_ATTR) != mine:
            continue
        try:
            study._storage.set_trial_user_attr(t._trial_id, "reason", why)
            if not study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:  # recorded meanwhile (its runner told it first)
            continue
        study.enqueue_trial(point_of(t), user_attrs={k: t.user_attrs[k] for k in QUEUED_ATTRS if k in t.user_attrs})
        released.append(t.number)
    return released


def held_elsewhere(study: optuna.Study) -> list:
    """The RUNNING trials another live worker holds: not this worker's, not one whose worker is dead on this host,
    not one whose heartbeat is stale (a worker on another host that stopped beating)."""
    stale = set(study._storage._get_stale_trial_ids(study._study_id))
    mine, host = me(), socket.gethostname()
    return [
        t
        for t in running(study)
        if (owner := t.system_attrs.get(WORKER_ATTR)) != mine
        and t._trial_id not in stale
        and (not owner or owner.get("host") != host or is_alive_here(owner))
    ]


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
    """Beats for a claimed trial while this worker holds it (`claimed`); `lost` is set once the trial is no longer
    RUNNING (taken over, or its end told)."""

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


# the heartbeat of each trial this worker holds, by trial id: from its claim to its release (claimed)
_held: dict[int, Heartbeat] = {}


@contextlib.contextmanager
def claimed(study: optuna.Study, runnable=lambda point: True):
    """Claim a waiting trial this host can run (claim) and hold it: yields the trial with its heartbeat beating from
    the claim on, and stops the beat at the release, when the block ends (the trial's end told, or a stop on its
    way to stage.run_sweep, which fails the trial and enqueues its point again). Yields None when no trial is left
    to claim. The one owner of a trial's heartbeat: whatever the worker does with the trial in the block (the wait
    for a quiet host included), another worker sees a fresh heartbeat."""
    trial = claim(study, runnable)
    if trial is None:
        yield None
        return
    with Heartbeat(study._storage, trial._trial_id) as beat:
        _held[trial._trial_id] = beat
        try:
            yield trial
        finally:
            del _held[trial._trial_id]


def end_stale_mlflow_runs(study, tracker) -> None:
    """End the MLflow run of every trial that was failed as stale (its worker died): never left RUNNING."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        run_id = t.user_attrs.get("mlflow_run_id")
        if run_id and not t.user_attrs.get("reason") and tracker.is_running(run_id):
            tracker.set_tags(run_id, {"failure": "worker died (heartbeat stale); trial enqueued again"})
            tracker.end_run(run_id, "KILLED")


# ----------------------------------------------------------------------------- the store


def storage_url(cfg) -> str:
    """sweep.storage, a relative SQLite path resolved against the store root; empty = mlruns/optuna.db there."""
    return store_url(cfg.sweep.storage, "sweep.storage", "optuna.db")


def one_writer_at_a_time(storage: optuna.storages.RDBStorage) -> optuna.storages.RDBStorage:
    """Every transaction on a SQLite storage begins IMMEDIATE: it takes the database's write lock before its first
    read, and another worker's transaction waits for it (the connection's 60 s busy timeout). Python's sqlite3 driver
    begins a transaction only at the first write, so Optuna's check-then-set in set_trial_state_values (read WAITING,
    write RUNNING) read outside any transaction: two workers could both read WAITING and both claim one trial (seen on
    a loaded host: one trial run by two workers, the second told "taken over" when the first recorded it). A server
    (PostgreSQL) locks the row itself (SELECT ... FOR UPDATE) and needs none of this. The storage is opened with the
    driver's own transaction handling off (isolation_level None), as SQLAlchemy's SQLite documentation describes."""
    from sqlalchemy import event

    @event.listens_for(storage.engine, "begin")
    def _begin_immediate(conn) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return storage


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """The Optuna store at `url` (storage_url), checked first, with the heartbeat and the retry of stale trials."""
    check_store(url, "sweep.storage")  # unreachable, corrupt or unwritable: fails now, in seconds
    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    stale = (
        {"heartbeat_stale_trial_callback": retry(max_retry=2)}
        if retry
        else {"failed_trial_callback": optuna.storages.RetryFailedTrialCallback(max_retry=2)}
    )
    server = url.split(":", 1)[0].split("+")[0].lower() in ("postgresql", "postgres")
    if server:  # a server that accepts and never answers is given up on, not waited for without end
        print(
            f"waiting for the Optuna storage {redact(url)} (sweep.storage; gives up after {STORE_TIMEOUT_S:.0f} s "
            f"without an answer)",
            file=sys.stderr,
            flush=True,
        )
    sqlite = url.startswith("sqlite")
    # SQLite: the driver begins no transaction itself (isolation_level None); one_writer_at_a_time begins them all
    args = (
        {"timeout": 60, "isolation_level": None} if sqlite else {"connect_timeout": STORE_TIMEOUT_S} if server else None
    )
    for attempt in range(5):
        try:
            storage = optuna.storages.RDBStorage(
                url,
                engine_kwargs={"connect_args": args} if args else None,
                heartbeat_interval=HEARTBEAT_S,
                grace_period=GRACE_S,
                **stale,
            )
            return one_writer_at_a_time(storage) if sqlite else storage
        except Exception as e:  # bad URL, server down, missing driver
            if server and store_fault(e) == "no_answer":
                raise StoreError(
                    f"The Optuna storage {redact(url)} (sweep.storage) did not answer within "
                    f"{STORE_TIMEOUT_S:.0f} s: its port accepts connections but no database speaks "
                    f"on it ({root_cause(e)}). Check that the address is the database server's and "
                    f"that it is not stalled; PARALLAX_STORE_TIMEOUT_S sets the wait. Nothing was "
                    f"run."
                ) from None
            # workers started together on an empty PostgreSQL database race to create the tables; the losers get
            # IntegrityError (pg_type_typname_nsp_index) and succeed on a retry, the tables being there by then
            if type(e).__name__ == "IntegrityError" and attempt < 4:
                time.sleep(0.5 + random.random())
                continue
            raise StoreError(
                f"Cannot open the Optuna storage {redact(url)!r} (sweep.storage): {type(e).__name__}: "
                f"{redact(str(e).splitlines()[0] if str(e) else '')}. Use an RDB URL such as "
                f"sqlite:////abs/path/optuna.db or postgresql://user@host:5432/db, with the password in PGPASSWORD "
                f"or ~/.pgpass rather than in the URL (docs/scale-out.md); the server must be reachable, the "
                f"database exist and its driver be installed. Or leave sweep.storage empty for the default sqlite "
                f"file in mlruns/."
            ) from None


# ----------------------------------------------------------------------------- what a trial's runner may ask


def heartbeat(trial: optuna.Trial) -> Heartbeat:
    """The heartbeat of a trial this worker holds (claimed): beating since the claim; `lost` says it was taken over."""
    return _held[trial._trial_id]


def trial_id(trial: optuna.Trial) -> int:
    """The trial's id in the storage (unique across studies; tagged on its MLflow run)."""
    return trial._trial_id


def fixed_point(trial: optuna.Trial) -> dict:
    """The whole point a claimed trial runs, before suggest_* has been called (its enqueued point)."""
    return point_of(trial.study._storage.get_trial(trial._trial_id))


def finished(study: optuna.Study) -> int:
    """Trials that ran to an end: complete, pruned, or failed by themselves (a trial failed because its worker
    was interrupted or died is run again, and counted then)."""
    ended = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))
    return sum(t.state != TrialState.FAIL or "failure_kind" in t.user_attrs for t in ended)


def running(study: optuna.Study) -> list:
    return study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))


@contextlib.contextmanager
def creating_stores(*urls: str):
    """Serialise the creation of local SQLite stores: workers started together would race to create the same
    tables ("table already exists"). An RDB server shared by many machines needs the stores created once first
    (`python -m pipeline sweep --strategy S --n-trials 0`), see docs/reliability.md."""
    if not any(u.startswith("sqlite") for u in urls):
        yield
        return
    lock = store_root() / "mlruns" / ".create.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file is closed, also if this process dies
        yield


# ----------------------------------------------------------------------------- the worker loop


def serve(worker, max_new_trials: int | None = None) -> int:
    """Claim and run waiting trials until none is left that `worker` can run (or `max_new_trials` ran); returns how
    many ran here. Each turn first repairs stale trials (and their MLflow runs). The worker (sweep/worker.py) gives
    its study, `runnable(point)` (can this host run the point), `run(trial, done, pace_s)` (runs one claimed trial
    and records it: done = trials finished before it, pace_s = this worker's seconds per trial so far, or None
    before its first), `say(msg)` and `where` (this host, in words). Each trial runs inside `claimed`: its heartbeat
    beats for all of it."""
    study = worker.study
    if max_new_trials == 0:
        worker.say(
            "--n-trials 0: the study is set up and no trial is run here, by design (the set-up step before the "
            "workers, docs/scale-out.md); the same command without --n-trials 0 runs its trials"
        )
        return 0
    ran, started = 0, time.monotonic()
    while max_new_trials is None or ran < max_new_trials:
        fail_stale_trials(study)
        end_stale_mlflow_runs(study, worker.tracker)
        with claimed(study, worker.runnable) as trial:  # beats from here to the block's end
            if trial is None:
                if not running(study):
                    left = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
                    if left:
                        worker.say(
                            f"{len(left)} waiting trial(s) need more devices than this host offers{worker.where}: "
                            f"left to a larger worker"
                        )
                    break
                time.sleep(1.0)  # another worker (or a dead one, until its heartbeat goes stale) holds a trial
                continue
            worker.run(trial, finished(study), (time.monotonic() - started) / ran if ran else None)
        ran += 1
    return ran
