"""The sweep's worker: the one owner of the trials it claims. Built once per sweep (stage.run_sweep) with the sweep's
context (`Sweep`), it serves the queue (claims.serve): for each claimed trial it waits for a quiet host, runs the
trial (trial.lifecycle.Trial, told to its MLflow run, its Optuna trial and the console, plus those
tracking.listeners adds), judges each epoch's end (a take-over its heartbeat noticed, pruning), and applies the
trial's one outcome (trial/outcome.py) to the queue:

    finished     told COMPLETE with its final test accuracy; one measured under interference is re-measured
    pruned       told PRUNED
    failed       told FAIL with the reason: its point is not run again
    requeued     told FAIL and its point enqueued again (SLURM ended its job), up to slurm.MAX_REQUEUES times
    cancelled    nothing: another worker took the trial over and records it
    fault        failed and its point enqueued again; the sweep stops with a message that says what the stores hold
    interrupted  failed and its point enqueued again; the interruption goes on up

No listener tells, prunes or enqueues: each records; this worker decides. A trial that failed because the host or the
cluster did (its directory could not be written, SLURM's controller stopped answering: HOST_FAULTS) is a fault.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from pipeline import paths
from pipeline.config.schema import SpaceConfig
from pipeline.errors import Stopped, TrialFailed
from pipeline.host.capabilities import host_capabilities
from pipeline.measure import meter
from pipeline.records.files import free_text
from pipeline.records.labels import bound
from pipeline.records.table import KNOBS, write_table
from pipeline.records.trial import PROVENANCE, planned
from pipeline.redact import redact
from pipeline.store_faults import FAULT_TEXT, root_cause, store_fault
from pipeline.strategies import STRATEGIES
from pipeline.sweep import claims, console, feasible, slurm, study_setup
from pipeline.sweep.best_effort import best_effort
from pipeline.sweep.console import SweepConsole
from pipeline.sweep.progress import counter, time_left
from pipeline.sweep.space import Space
from pipeline.sweep.study_listener import StudyRecord
from pipeline.tracking import server_wait
from pipeline.tracking.client import tracking_uri
from pipeline.tracking.run_listener import MlflowListener
from pipeline.tracking.trial_run import TrialRun
from pipeline.trial.launch import Infeasible, host_fields
from pipeline.trial.lifecycle import How, Trial
from pipeline.trial.outcome import (
    CANCELLED,
    FAILED,
    FAULT,
    FINISHED,
    INTERRUPTED,
    PRUNED,
    REQUEUED,
    UNWRITABLE,
    Outcome,
)

# failure kinds that are the host's or the cluster's, not the trial's: handled as a store fault is (stop, run again)
HOST_FAULTS = {
    UNWRITABLE: "Free space there (or make it writable)",
    slurm.UNREACHABLE: "Once `scontrol show job` answers again (SLURM's controller is back)",
    slurm.UNSUBMITTED: "Once `sbatch` submits (its own message names the cause; `scontrol ping` tests the controller)",
}
TAKEN_OVER = "taken over: another worker failed this trial as stale (late heartbeat) and runs it again"
NOTHING_HERE = "nothing recorded here"  # said of a trial another worker records
# what the Optuna store holds of an outcome once told
TOLD = {FINISHED: "COMPLETE", PRUNED: "PRUNED", FAILED: "FAIL", REQUEUED: "FAIL, enqueued again"}


@dataclasses.dataclass(frozen=True)
class Stores:
    """The sweep's two stores, their URLs resolved once (stage.run_sweep): Optuna's (sweep.storage) and MLflow's
    (tracking.uri)."""

    optuna: str
    mlflow: str

    @classmethod
    def of(cls, cfg) -> Stores:
        return cls(claims.storage_url(cfg), tracking_uri(cfg))


@dataclasses.dataclass
class Sweep:
    """One strategy's study on this worker, as stage.run_sweep set it up: its space (space.Space: the Config, the
    points and their Configs), the host, the MLflow tracker, the study, the points skipped here, the table it writes,
    the two stores' URLs, the wait for a quiet host (None: none) and the number of trials the study plans."""

    space: Space
    host: Any
    tracker: Any
    study: optuna.Study
    skipped: list
    out_csv: Path
    stores: Stores
    gate: Any = None
    total: int = 0
    trials_dir: Path = dataclasses.field(default_factory=lambda: paths.repo_root() / "runs" / "trials")

    @property
    def cfg(self):
        return self.space.cfg

    @property
    def strategy(self) -> str:
        return self.space.strategy


@dataclasses.dataclass(frozen=True)
class Told:
    """A trial's end as this worker told it to the Optuna store: what the sweep prints after it (`text`), and whether
    the store took it here (`recorded`; False: another worker took the trial over and records it). The sweep's
    count and the end that stands after a fault read `recorded`, never the words."""

    text: str
    recorded: bool = True


@functools.cache
def host_caps(host) -> dict:
    """capabilities.host_capabilities, read once per process."""
    return host_capabilities(host)


class Worker:
    """Serves `sweep`'s queue on this worker. `done`: how many of the study's trials ran to an end, as last read
    (None before the first); `parent_id`: the study's parent MLflow run."""

    def __init__(self, sweep: Sweep):
        self.sweep, self.cfg, self.study, self.tracker = sweep, sweep.cfg, sweep.study, sweep.tracker
        self.where = f" ({sweep.host.kind} x{sweep.host.n})"
        self.done: int | None = None
        self.parent_id: str | None = None

    # ------------------------------------------------------------------ the queue (claims.serve asks these)

    @property
    def total(self) -> int:
        return self.sweep.total

    def serve(self, max_new_trials: int | None = None) -> None:
        """Claim and run the study's trials until none is left that this worker can run, the table written after
        each. A parent run that a stopped worker ended is RUNNING again first."""
        from pipeline.sweep import study_parent

        self.parent_id = self.study.user_attrs.get(study_parent.PARENT)
        if self.parent_id:
            self.tracker.reopen(self.parent_id)
        claims.serve(self, max_new_trials)

    def say(self, msg: str) -> None:
        console.say(f"[sweep {self.sweep.strategy}] {msg}")

    def runnable(self, point: dict) -> bool:
        try:
            feasible.check_point(self.cfg, self.sweep.host, self.sweep.space.config(point))
            return True
        except Infeasible:
            return False

    def run(self, trial, done: int, pace_s: float | None) -> None:
        """One claimed trial, from the wait for a quiet host to its outcome applied; `done`: the study's trials that
        ran to an end before it; `pace_s`: this worker's seconds per trial so far (None: not known yet), which times
        the trials left, re-measures enqueued included (progress.time_left)."""
        remeasures = sum(1 for t in self.study.get_trials(deepcopy=False) if t.user_attrs.get("remeasure"))
        label = f"[sweep {self.sweep.strategy}] trial {counter(done, self.total, remeasures)}"
        eta = time_left(pace_s, done, self.total, remeasures)
        eta_text = f", sweep ETA {eta:.0f} s" if eta else ""
        console.say(f"{label} (#{trial.number}) {fmt_point(claims.fixed_point(trial))}{eta_text}")
        self._wait_quiet(trial, label)
        self.done = done
        told = self.run_one(trial, label)
        self.done = done + told.recorded  # failed by itself or not, it ran to an end
        console.say(f"{label} -> {told.text}")
        write_table(self.study, self.sweep.strategy, self.sweep.skipped, self.sweep.out_csv, self.sweep.host)

    def _wait_quiet(self, trial, label: str) -> None:
        gate = self.sweep.gate
        if gate is None:
            return
        waited = gate.wait()  # the trial's heartbeat beats through it (claims.claimed)
        if waited.text:
            console.say(f"{label} {waited.text}")
            trial.set_user_attr("quiet_wait", waited.text)
        if gate.stays_busy:  # a flagged result is kept as it is: a re-measure would meet the same load
            trial.set_user_attr("host_stays_busy", gate.vain)

    # ------------------------------------------------------------------ one trial

    def run_one(self, trial, label: str) -> Told:
        """Run one claimed trial and apply its outcome; returns it as told (Told: what the sweep prints after it). A
        fault raises Stopped, saying what the stores hold; an interruption goes on up."""
        p = self.sweep.space.suggest(trial)  # the whole point; the dimensions that vary are parameters
        one = self._trial(trial, p, label)
        return self.apply(trial, p, one, one.run())

    def _trial(self, trial, p: dict, label: str) -> Trial:
        s, cfg = self.sweep, self.cfg
        dtype = STRATEGIES[s.strategy].autocast_dtype(cfg.train, s.host.kind)
        tcfg, bounded = bound(s.space.config(p), dtype, host_caps(s.host), cfg.sweep.emulated_max_steps)
        name, repeats = run_name(s.strategy, p, trial)
        tags = {"trial": trial.number, "study": s.study.study_name, "optuna_trial_id": claims.trial_id(trial)}
        tags.update({**repeats, **{k: s.study.user_attrs.get(k) for k in PROVENANCE}})  # the figures' code and data
        plan = planned(slurm.sized(cfg, tcfg), s.host, host_fields(s.host, tcfg.train.devices))
        run = TrialRun(s.tracker, tcfg, stage=f"sweep@{s.strategy}")
        # a SLURM job's nodes sample their own hosts' system metrics, not this (login) node
        here = not slurm.is_on(cfg)
        mlflow = MlflowListener(
            run, name, plan, tags, self.parent_id, stopped_note="trial enqueued again", samples_here=here
        )
        how = How(
            runner=slurm.runner(cfg, run),  # here, or as a SLURM job when slurm.partition is set
            label=label,
            progress=sys.stderr.isatty(),
            timeout_s=cfg.sweep.trial_timeout_s,
            host_faults=frozenset(HOST_FAULTS),
            bounded=bounded,
            judge=self._judge(trial),
        )
        folder = study_setup.trial_folder(s.study, s.trials_dir, trial.number)
        return Trial(tcfg, folder, [mlflow, StudyRecord(trial), SweepConsole(label)], how)

    def _judge(self, trial):
        """The trial's judge (lifecycle.How.judge): at each epoch's end, stop a trial another worker took over (its
        heartbeat saw it) or one the pruner cuts; after the training, cancel a trial taken over meanwhile."""
        beat = claims.heartbeat(trial)  # beating since the claim; its owner, claims.claimed, stops it

        def judge(one: Trial, record: dict | None) -> bool:
            if beat.lost.is_set():
                one.cancel(TAKEN_OVER)
                return True
            if record is None or not self.cfg.sweep.pruning:
                return False
            try:
                trial.report(record["test_acc"], record["epoch"])
                return trial.should_prune()
            except optuna.exceptions.UpdateFinishedTrialError:
                one.cancel(TAKEN_OVER)
                return True

        return judge

    # ------------------------------------------------------------------ its outcome, applied to the queue

    def apply(self, trial, p: dict, one: Trial, outcome: Outcome) -> Told:
        """The outcome applied to the queue (the module's docstring); returns it as told."""
        if outcome.kind not in (FAULT, INTERRUPTED):
            return self._tell(trial, p, outcome)
        held = ""
        if outcome.stands is not None:  # the sweep's own stores held its end before a user's store failed: it stands
            told = self._tell(trial, p, outcome.stands)
            held = TOLD[outcome.stands.kind] if told.recorded else TAKEN_OVER
            again = (False, False)
        else:
            again = self._again(trial, p, outcome.reason)
        if outcome.kind == INTERRUPTED:
            raise outcome.error from None  # type: ignore[misc]  # an interruption always carries its error
        raise Stopped(self._stopped_text(trial, p, one, outcome, (held, *again))) from None

    def _tell(self, trial, p: dict, outcome: Outcome) -> Told:
        kind, study = outcome.kind, self.study
        try:
            if kind == CANCELLED:
                return Told(f"{outcome.reason}; {NOTHING_HERE}", recorded=False)
            if kind == PRUNED:
                trial.set_user_attr("reason", outcome.reason)
                study.tell(trial, state=TrialState.PRUNED)
                return Told("pruned")
            if kind == REQUEUED:
                trial.set_user_attr("reason", outcome.reason)
                return Told(requeue(study, trial, p, outcome.reason))
            if kind == FAILED:
                trial.set_user_attr("reason", outcome.reason)
                trial.set_user_attr("failure_kind", outcome.error.kind)  # type: ignore[union-attr]
                study.tell(trial, state=TrialState.FAIL)
                return Told(f"failed ({outcome.reason})")
            record = outcome.record
            if outcome.untimed:  # complete, its accuracy valid; the table's reason and the run's tag say why
                trial.set_user_attr(
                    "reason", "; ".join(filter(None, (trial.user_attrs.get("reason"), outcome.untimed)))
                )
            study.tell(trial, record["test_acc"][-1])
            return Told(
                f"{meter.speed_text(record)}{console.under_load(outcome)}, "
                f"acc {record['test_acc'][-1]:.3f}" + remeasure(self.cfg, study, trial, p, outcome.flagged)
            )
        except optuna.exceptions.UpdateFinishedTrialError:
            return Told(f"{TAKEN_OVER}; {NOTHING_HERE}", recorded=False)

    def _again(self, trial, p: dict, why: str) -> tuple[bool, bool]:
        """A trial stopped by a fault or an interruption: failed with the reason and its point enqueued again, each
        step tried once (best_effort); returns which the store took (told, enqueued)."""
        _, told, again = best_effort(
            lambda: trial.set_user_attr("reason", f"{why}; enqueued again"),
            lambda: self.study.tell(trial, state=TrialState.FAIL),
            lambda: self.study.enqueue_trial(p, user_attrs=copied(trial)),
        )
        return told, again

    # ------------------------------------------------------------------ a stop, in words

    def _stopped_text(self, trial, p: dict, one: Trial, outcome: Outcome, held: tuple) -> str:
        """Why the sweep stopped in this trial, what the stores hold of it (read back), and what to do."""
        e = outcome.error
        if isinstance(e, TrialFailed) and e.kind in HOST_FAULTS:
            room = f" ({free_text(one.out_dir)} there)" if e.kind == UNWRITABLE else ""
            cause, fix = f": {e}{room}", HOST_FAULTS[e.kind]
        else:
            cause, fix = (
                f" on {fault_text(e, self.sweep.stores)}",
                "Fix the cause (free disk space, a writable and reachable store)",
            )
        return (
            f"The sweep stopped in trial #{trial.number} ({fmt_point(p)}){cause}. "
            f"{_recorded(self.tracker, one.run_id, held)} {fix} and rerun the sweep: {resumes(self.done)}."
        )


def fmt_point(p: dict) -> str:
    s = f"k={p['devices']} B={p['batch_size']} lr={p['lr']}"
    if p.get("model") and p["model"] != "lenet":
        s = f"{p['model']} {s}"
    if p.get("optimizer", "sgd") != "sgd":  # d2l's plain SGD, the default, goes unsaid
        s += f" {p['optimizer']}"
    for k in KNOBS:
        default = getattr(SpaceConfig(), k)[0]
        if k in p and p[k] != default:
            s += f" {k}={p[k]}"
    return s


def run_name(strategy: str, p: dict, trial) -> tuple[str, dict]:
    """A trial run's name and the tags that say which trial it repeats: a re-measure is named
    "ddp k=2 B=64 lr=0.01 re-measure of #7" and tagged parallax.remeasure_of=7."""
    name = f"{strategy} {fmt_point(p)}"
    of = trial.user_attrs.get("remeasure_of")
    if of is None:
        return name, {}
    return f"{name} re-measure of #{of}", {"parallax.remeasure_of": of}


def remeasure(cfg, study, trial, p: dict, flagged: str) -> str:
    """A trial flagged as measured under interference (`flagged`: why, "" when measured quietly) is enqueued again
    (its own row stays, flagged), up to sweep.remeasure_interfered times; the copy runs after the trials already
    waiting. Not on a host that stays busy (the quiet wait failed that many times in a row before this trial): the
    copy would meet the same load."""
    done, most = trial.user_attrs.get("remeasure", 0), cfg.sweep.remeasure_interfered
    if not flagged or done >= most:
        return ""
    busy = trial.user_attrs.get("host_stays_busy")
    if busy:
        return f"; not re-measured: the host stayed busy through {busy} quiet wait{'s' * (busy != 1)} in a row"
    repeat = trial.user_attrs.get("repeat", 0)
    study.enqueue_trial(p, user_attrs={"repeat": repeat, "remeasure": done + 1, "remeasure_of": trial.number})
    return f"; measured under interference: enqueued again ({done + 1}/{most})"


def requeue(study, trial, p, reason) -> str:
    """A trial whose SLURM job was cancelled or preempted: failed with SLURM's reason and its point enqueued again
    (up to slurm.MAX_REQUEUES times, then failed for good), never left RUNNING."""
    n = trial.user_attrs.get("requeued", 0)
    if n >= slurm.MAX_REQUEUES:
        trial.set_user_attr("failure_kind", "slurm_requeues")
        study.tell(trial, state=TrialState.FAIL)
        return f"failed ({reason}; already enqueued again {n} times)"
    study.tell(trial, state=TrialState.FAIL)
    study.enqueue_trial(p, user_attrs={"repeat": trial.user_attrs.get("repeat", 0), "requeued": n + 1})
    return f"{reason} ({n + 1}/{slurm.MAX_REQUEUES})"


def copied(trial) -> dict:
    """What a trial enqueued again after a fault keeps of its own: which repeat or re-measure of its point it is (as
    a copy enqueued for a dead worker keeps them)."""
    return {k: trial.user_attrs[k] for k in ("repeat", "remeasure", "remeasure_of") if k in trial.user_attrs}


def resumes(done: int | None) -> str:
    """What a rerun does after a stop, with how many of the study's trials ran to an end (None: not known)."""
    if done is None:
        return "finished trials are kept"
    return f"it resumes the study, keeping the {done} trial(s) that ran to an end before the stop"


def fault_text(e: BaseException | None, stores: Stores | None = None) -> str:
    """The fault, in words: which store it came from (with `stores`: named by its redacted address and key), what it
    is (store_faults.FAULT_TEXT) and the driver's or the system's own words."""
    if e is None:
        return "an unknown fault"
    fault, store = store_fault(e), store_of(e, stores) if stores is not None else ""
    why = server_wait.reason(e) if store.startswith("the MLflow server") else root_cause(e)
    what = f"{FAULT_TEXT[fault]} ({why})" if fault else why
    return f"{store}: {what}" if store else what


def store_of(e: BaseException | None, stores: Stores) -> str:
    """The store whose library raised `e` (or an exception in its chain), named: the Optuna store (sweep.storage) or
    the MLflow store or server (tracking.uri); "" for any other error."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        top = type(e).__module__.split(".")[0]
        if top == "optuna":
            return f"the Optuna store {redact(stores.optuna)} (sweep.storage)"
        if top in ("mlflow", "requests", "urllib3"):
            kind = "server" if stores.mlflow.lower().startswith(("http://", "https://")) else "store"
            return f"the MLflow {kind} {redact(stores.mlflow)} (tracking.uri)"
        e = e.__cause__ or e.__context__
    return ""


def _recorded(tracker, run_id, held: tuple) -> str:
    """What the stores hold of a trial stopped by a fault, as the stores acknowledged it, never as intended. `held`:
    the end the Optuna store held before the fault ("" for none), and whether it took the failure and the copy."""
    ended, told, again = held
    if ended:  # the fault came after the store held the trial's end (a store of the user's, say)
        optuna_part = (
            f"The Optuna store held the trial's end before the fault ({ended}): that end stands, and the "
            f"trial is not enqueued again"
        )
    elif told and again:
        optuna_part = "The trial was recorded as failed with this reason and enqueued again"
    elif told:
        optuna_part = "The trial was recorded as failed, but enqueueing it again failed"
    else:
        optuna_part = (
            f"The Optuna store did not record the trial's failure: it stays RUNNING there until its "
            f"heartbeat is {claims.GRACE_S:.0f} s old, when a rerun fails it and runs it again"
        )
    status = tracker.status(run_id) if run_id else "none"
    mlflow_part = (
        "no MLflow run was opened"
        if status == "none"
        else f"its MLflow run ended {status}"
        if status in ("FAILED", "KILLED", "FINISHED")
        else f"its MLflow run {run_id} could not be ended (the store refused the write) and still shows RUNNING"
        if status == "RUNNING"
        else f"the state of its MLflow run {run_id} could not be read back (a rerun that finishes the study ends it "
        f"KILLED if it still shows RUNNING)"
    )
    return f"{optuna_part}; {mlflow_part}."
