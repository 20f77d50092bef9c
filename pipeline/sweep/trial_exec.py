"""One claimed sweep trial: a trial.lifecycle.Trial told to three listeners, its MLflow run (tracking.run_listener),
its Optuna trial (study_listener: take-over, pruning, tell, requeue, re-measure) and its console lines (console.py),
plus those tracking.listeners adds. A trial that failed because the host or the cluster did (its directory could not
be written, SLURM's controller stopped answering: HOST_FAULTS) is a fault: the sweep stops with a message that says
what the stores hold, and the point runs again, never failed for good.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

from pipeline.config import loader as configmod
from pipeline.errors import Stopped
from pipeline.host.capabilities import host_capabilities
from pipeline.records import labels as emulated
from pipeline.records.files import free_text
from pipeline.records.table import KNOBS
from pipeline.records.trial import PROVENANCE, planned
from pipeline.redact import redact
from pipeline.store_faults import FAULT_TEXT, root_cause, store_fault
from pipeline.strategies import STRATEGIES
from pipeline.sweep import queue as claims
from pipeline.sweep import slurm, study_setup
from pipeline.sweep.console import SweepConsole
from pipeline.sweep.space import suggest
from pipeline.sweep.study_listener import StudyListener
from pipeline.tracking import server_wait
from pipeline.tracking.client import tracking_uri
from pipeline.tracking.run_listener import MlflowListener
from pipeline.tracking.trial_run import TrialRun
from pipeline.trial.launch import UNWRITABLE, TrialFailed, host_fields
from pipeline.trial.lifecycle import Trial

# failure kinds that are the host's or the cluster's, not the trial's: handled as a store fault is (stop, run again)
HOST_FAULTS = {
    UNWRITABLE: "Free space there (or make it writable)",
    slurm.UNREACHABLE: "Once `scontrol show job` answers again (SLURM's controller is back)",
    slurm.UNSUBMITTED: "Once `sbatch` submits (its own message names the cause; `scontrol ping` tests the controller)",
}


def fmt_point(p: dict) -> str:
    s = f"k={p['devices']} B={p['batch_size']} lr={p['lr']}"
    if p.get("model") and p["model"] != "lenet":
        s = f"{p['model']} {s}"
    if p.get("optimizer", "sgd") != "sgd":  # d2l's plain SGD, the default, goes unsaid
        s += f" {p['optimizer']}"
    for k in KNOBS:
        default = getattr(configmod.SpaceConfig(), k)[0]
        if k in p and p[k] != default:
            s += f" {k}={p[k]}"
    return s


@functools.cache
def host_caps(host) -> dict:
    """capabilities.host_capabilities, read once per process."""
    return host_capabilities(host)


def run_one(
    cfg, strategy, study, trial, host, tracker, parent_id, label, trials_dir: Path, configs, done: int | None = None
) -> str:
    """Run one claimed trial (trial.lifecycle.Trial) with the sweep's listeners: its MLflow run under the study's
    parent, its Optuna trial, its console lines. `configs` (space.PointConfigs) gives the point's Config, built once;
    the trial runs it as it is. Returns what the sweep prints after it; a fault raises Stopped, saying what the
    stores hold (and, with `done`, how many of the study's trials ran to an end before it)."""
    p = suggest(trial, cfg, strategy)  # the whole point; only the dimensions that vary are Optuna parameters
    dtype = STRATEGIES[strategy].autocast_dtype(cfg.train, host.kind)
    tcfg, bounded = emulated.bound(configs(p), dtype, host_caps(host), cfg.sweep.emulated_max_steps)  # "": not
    name, repeats = run_name(strategy, p, trial)
    tags = {"trial": trial.number, "study": study.study_name, "optuna_trial_id": claims.trial_id(trial), **repeats}
    tags.update({k: study.user_attrs.get(k) for k in PROVENANCE})  # the code, data and torch the figures come from
    plan = planned(slurm.sized(cfg, tcfg), host, host_fields(host, tcfg.train.devices))
    run = TrialRun(tracker, tcfg, stage=f"sweep@{strategy}")
    # a SLURM job's nodes sample their own hosts' system metrics, not this (login) node
    mlflow = MlflowListener(
        run, name, plan, tags, parent_id, stopped_note="trial enqueued again", samples_here=not slurm.is_on(cfg)
    )
    in_study = StudyListener(cfg, study, trial, p)
    one = Trial(
        tcfg,
        study_setup.trial_folder(study, trials_dir, trial.number),
        [mlflow, in_study, SweepConsole(label)],
        runner=slurm.runner(cfg, run),  # here, or as a SLURM job when slurm.partition is set
        label=label,
        progress=sys.stderr.isatty(),
        timeout_s=cfg.sweep.trial_timeout_s,
        host_faults=HOST_FAULTS,
        bounded=bounded,
    )
    try:
        one.run()
    except TrialFailed as e:
        if e.kind not in HOST_FAULTS:
            return in_study.outcome  # failed by itself: recorded so
        raise Stopped(stopped_text(e, trial.number, p, one.out_dir, tracker, run.run_id, in_study, cfg, done)) from None
    except Exception as e:  # a fault (disk full, store gone); Ctrl-C and signals go on up as they are
        raise Stopped(stopped_text(e, trial.number, p, one.out_dir, tracker, run.run_id, in_study, cfg, done)) from None
    return in_study.outcome


def run_name(strategy: str, p: dict, trial) -> tuple[str, dict]:
    """A trial run's name and the tags that say which trial it repeats: a re-measure is named
    "ddp k=2 B=64 lr=0.01 re-measure of #7" and tagged parallax.remeasure_of=7."""
    name = f"{strategy} {fmt_point(p)}"
    of = trial.user_attrs.get("remeasure_of")
    if of is None:
        return name, {}
    return f"{name} re-measure of #{of}", {"parallax.remeasure_of": of}


def stopped_text(
    e: Exception, number: int, p: dict, out_dir: Path, tracker, run_id, in_study, cfg=None, done: int | None = None
) -> str:
    """Why the sweep stopped in trial #number, what the stores hold of it (read back), and what to do."""
    host = isinstance(e, TrialFailed) and e.kind in HOST_FAULTS
    cause, fix = (
        (f": {e} ({free_text(out_dir)} there)" if e.kind == UNWRITABLE else f": {e}", HOST_FAULTS[e.kind])
        if host
        else (f" on {fault_text(e, cfg)}", "Fix the cause (free disk space, a writable and reachable store)")
    )
    return (
        f"The sweep stopped in trial #{number} ({fmt_point(p)}){cause}. "
        f"{_recorded(tracker, run_id, in_study)} {fix} and rerun the sweep: {resumes(done)}."
    )


def resumes(done: int | None) -> str:
    """What a rerun does after a stop, with how many of the study's trials ran to an end (None: not known)."""
    if done is None:
        return "finished trials are kept"
    return f"it resumes the study, keeping the {done} trial(s) that ran to an end before the stop"


def fault_text(e: BaseException, cfg=None) -> str:
    """The fault, in words: which store it came from (with `cfg`: named by its redacted address and key), what it
    is (store_faults.FAULT_TEXT) and the driver's or the system's own words."""
    fault, store = store_fault(e), store_of(e, cfg) if cfg is not None else ""
    why = server_wait.reason(e) if store.startswith("the MLflow server") else root_cause(e)
    what = f"{FAULT_TEXT[fault]} ({why})" if fault else why
    return f"{store}: {what}" if store else what


def store_of(e: BaseException | None, cfg) -> str:
    """The store whose library raised `e` (or an exception in its chain), named: the Optuna store (sweep.storage) or
    the MLflow store or server (tracking.uri); "" for any other error."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        top = type(e).__module__.split(".")[0]
        if top == "optuna":
            return f"the Optuna store {redact(claims.storage_url(cfg))} (sweep.storage)"
        if top in ("mlflow", "requests", "urllib3"):
            uri = tracking_uri(cfg)
            kind = "server" if uri.lower().startswith(("http://", "https://")) else "store"
            return f"the MLflow {kind} {redact(uri)} (tracking.uri)"
        e = e.__cause__ or e.__context__
    return ""


def _recorded(tracker, run_id, in_study) -> str:
    """What the stores hold of a trial stopped by a fault, as the stores acknowledged it, never as intended."""
    told, again = in_study.told, in_study.again
    if in_study.ended:  # the fault came after the store held the trial's end (a store of the user's, say)
        optuna_part = (
            f"The Optuna store held the trial's end before the fault ({in_study.ended}): that end stands, and the "
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


def best_effort(*steps) -> list[bool]:
    """Each step tried once; a store that is failing is already being reported. Returns which steps succeeded."""
    done = []
    for step in steps:
        try:
            step()
            done.append(True)
        except Exception:
            done.append(False)
    return done
