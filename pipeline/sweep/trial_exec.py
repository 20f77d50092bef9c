"""One claimed sweep trial, run and recorded once: COMPLETE/PRUNED/FAIL in Optuna, FINISHED/KILLED/FAILED in its
MLflow run (tracking.trial_run), with what the sweep adds to a trial: pruning, a heartbeat that a worker taking the
trial over ends, a SLURM job enqueued again when the cluster ends it, a re-measure when it ran under interference,
and, on a fault, a message that says what the stores hold. A trial that failed because the host or the cluster did
(its directory could not be written, SLURM's controller stopped answering) is such a fault: the sweep stops and the
point runs again, never failed for good.
"""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from pipeline.config import loader as configmod
from pipeline.errors import FAULT_TEXT, Stopped, interruption, root_cause, store_fault
from pipeline.host.capabilities import host_capabilities
from pipeline.measure import meter
from pipeline.records import files
from pipeline.records import labels as emulated
from pipeline.records.files import free_text
from pipeline.records.table import KNOBS
from pipeline.records.trial import planned
from pipeline.strategies import STRATEGIES
from pipeline.sweep import queue as claims
from pipeline.sweep import slurm, study_setup, study_view
from pipeline.sweep.space import suggest
from pipeline.tracking.trial_run import TrialRun
from pipeline.trial.launch import UNWRITABLE, TrialFailed, host_fields

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


def run_one(cfg, strategy, study, trial, host, tracker, parent_id, label, trials_dir: Path, configs) -> str:
    """Run one claimed trial and record it once: COMPLETE/PRUNED/FAIL in Optuna, FINISHED/KILLED/FAILED in MLflow.
    `configs` (space.PointConfigs) gives the point's Config, built once; the trial runs it as it is. A trial taken
    over by another worker is stopped and recorded by that worker only."""
    p = suggest(trial, cfg, strategy)  # the whole point; only the dimensions that vary are Optuna parameters
    tcfg, bounded = emulated.bound(
        configs(p),
        STRATEGIES[strategy].autocast_dtype(cfg.train, host.kind),
        host_caps(host),
        cfg.sweep.emulated_max_steps,
    )  # "" = not bounded
    out_dir = study_setup.trial_folder(study, trials_dir, trial.number)
    beat, t0 = claims.heartbeat(trial), time.monotonic()
    run = TrialRun(tracker, tcfg, stage=f"sweep@{strategy}")

    def note(attrs: dict) -> None:
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        run.tag({f"parallax.{k}": v for k, v in attrs.items()})

    def on_epoch(record):
        run.log_epoch(record)
        eta = (time.monotonic() - t0) / record["epoch"] * (record["epochs"] - record["epoch"])
        print(
            f"  {label} epoch {record['epoch']}/{record['epochs']}: acc {record['test_acc']:.3f}, "
            f"loss {record['train_loss']:.3f}, trial ETA {eta:.0f} s",
            file=sys.stderr,
            flush=True,
        )
        if beat.lost.is_set():
            return True  # taken over: stop at this epoch's end
        if cfg.sweep.pruning:
            trial.report(record["test_acc"], record["epoch"])
            return trial.should_prune()
        return False

    try:
        with beat:
            plan = planned(slurm.sized(cfg, tcfg), host, host_fields(host, tcfg.train.devices))
            name, repeats = run_name(strategy, p, trial)
            run.start(
                name,
                plan,
                {
                    "trial": trial.number,
                    "study": study.study_name,
                    "optuna_trial_id": claims.trial_id(trial),
                    **repeats,
                },
                parent_id=parent_id,
                started=lambda run_id: trial.set_user_attr("mlflow_run_id", run_id),
            )
            if bounded:
                print(f"  {label} {bounded}", file=sys.stderr, flush=True)
                trial.set_user_attr("reason", bounded)  # the sweep table's reason column
                run.tag({"parallax.bounded": bounded})
            try:
                with run.system_metrics():  # off unless tracking.system_metrics
                    # here, or as a SLURM job when slurm.partition is set (slurm.py; note: its job id, node count)
                    metrics = slurm.runner(cfg)(
                        tcfg,
                        out_dir,
                        on_epoch=on_epoch,
                        progress=sys.stderr.isatty(),
                        timeout_s=cfg.sweep.trial_timeout_s,
                        label=label,
                        note=note,
                    )
            except TrialFailed as e:
                metrics = e
        if beat.lost.is_set():
            return _taken_over(tracker, run)
        if isinstance(metrics, TrialFailed):
            metrics = _on_a_full_disk(metrics, out_dir)
            if metrics.kind in HOST_FAULTS:
                raise metrics  # not the trial's failure: stopped below, its point enqueued again
            reason = f"{metrics.kind}: {metrics}"
            trial.set_user_attr("reason", reason)
            if getattr(metrics, "requeue", False):  # SLURM cancelled or preempted its job (slurm.Requeued)
                return _requeue(study, trial, run, p, reason)
            trial.set_user_attr("failure_kind", metrics.kind)
            run.end("FAILED", reason)
            study.tell(trial, state=TrialState.FAIL)
            return f"failed ({reason})"
        flag(run, name, metrics)
        study_view.note_under_load(trial, metrics)
        outcome = _record_result(study, trial, run, metrics, out_dir)
        return outcome + _remeasure(cfg, study, trial, p, metrics)
    except optuna.exceptions.UpdateFinishedTrialError:
        return _taken_over(tracker, run)
    except BaseException as e:  # interrupted, or a fault (disk full, store gone): leave nothing RUNNING
        signalled = interruption(e)  # Ctrl-C, or a signal torch's launcher caught as SignalException
        interrupted = signalled is not None
        e = e if isinstance(e, KeyboardInterrupt) else signalled or e
        host = isinstance(e, TrialFailed) and e.kind in HOST_FAULTS
        why = (
            f"interrupted ({e or type(e).__name__})"
            if interrupted
            else f"{e.kind}: {e}"
            if host
            else f"error: {root_cause(e)}"
        )
        closed, noted, told, again = best_effort(
            lambda: run.end("KILLED" if interrupted else "FAILED", f"{why}; trial enqueued again"),
            lambda: trial.set_user_attr("reason", f"{why}; enqueued again"),
            lambda: study.tell(trial, state=TrialState.FAIL),
            lambda: study.enqueue_trial(p, user_attrs=_copied(trial)),
        )
        if interrupted:
            raise e from None
        cause, fix = (
            (f": {e} ({free_text(out_dir)} there)" if e.kind == UNWRITABLE else f": {e}", HOST_FAULTS[e.kind])
            if host
            else (f" on {fault_text(e)}", "Fix the cause (free disk space, a writable and reachable store)")
        )
        raise Stopped(
            f"The sweep stopped in trial #{trial.number} ({fmt_point(p)}){cause}. "
            f"{_recorded(tracker, run.run_id, told, again)} {fix} and rerun the sweep: finished trials are kept."
        ) from None


UNDER_LOAD = "[under load] "  # the run-name prefix of a trial measured under interference (a cut name keeps it)


def run_name(strategy: str, p: dict, trial) -> tuple[str, dict]:
    """A trial run's name and the tags that say which trial it repeats: a re-measure is named
    "ddp k=2 B=64 lr=0.01 re-measure of #7" and tagged parallax.remeasure_of=7."""
    name = f"{strategy} {fmt_point(p)}"
    of = trial.user_attrs.get("remeasure_of")
    if of is None:
        return name, {}
    return f"{name} re-measure of #{of}", {"parallax.remeasure_of": of}


def flag(run: TrialRun, name: str, metrics) -> None:
    """A trial measured under interference, flagged where a viewer looks: its run name begins UNDER_LOAD and the tag
    parallax.flagged holds the reason (the metric `flagged` and Optuna's `flagged` attribute come with its record,
    its optuna-dashboard note from study_view.note_under_load)."""
    interference = metrics.get("interference") or {}
    if interference.get("interfered"):
        run.tag({"parallax.flagged": interference.get("interference_reason") or "measured under load"})
        run.rename(UNDER_LOAD + name)


def _on_a_full_disk(failed: TrialFailed, out_dir: Path) -> TrialFailed:
    """A trial failed some other way whose folder now refuses a write: the host's failure after all (in a multi-process
    trial the launcher may report a peer of the rank whose write failed, as worker_died), so its point is kept."""
    if failed.kind in HOST_FAULTS:
        return failed
    refused = files.refuses_writes(out_dir)
    if refused is None:
        return failed
    return TrialFailed(
        f"the host could not write the trial directory {out_dir} ({refused}); the trial itself ended "
        f"{failed.kind}: {failed}",
        UNWRITABLE,
    )


def fault_text(e: BaseException) -> str:
    fault = store_fault(e)
    return f"{FAULT_TEXT[fault]} ({root_cause(e)})" if fault else root_cause(e)


def _recorded(tracker, run_id, told: bool, again: bool) -> str:
    """What the stores hold of a trial stopped by a fault, as read back, never as intended."""
    if told and again:
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
        else f"the state of its MLflow run {run_id} could not be read back"
    )
    return f"{optuna_part}; {mlflow_part}."


def _record_result(study, trial, run: TrialRun, metrics, out_dir) -> str:
    trial.set_user_attr("metrics", metrics.to_json())
    study_view.set_trial_numbers(trial, metrics)
    if metrics["stopped"]:
        run.complete(metrics, out_dir)
        trial.set_user_attr("reason", f"pruned after epoch {len(metrics['test_acc'])}")
        run.end("KILLED", strict=True)
        study.tell(trial, state=TrialState.PRUNED)
        return "pruned"
    untimed = meter.untimed(metrics)
    run.complete(metrics, out_dir, untimed)
    if untimed:  # complete, its accuracy valid; the table's reason and the run's tag say why img/s is missing
        trial.set_user_attr("reason", "; ".join(filter(None, (trial.user_attrs.get("reason"), untimed))))
    run.end("FINISHED")
    study.tell(trial, metrics["test_acc"][-1])
    return f"{meter.speed_text(metrics)}, acc {metrics['test_acc'][-1]:.3f}"


def _remeasure(cfg, study, trial, p, metrics) -> str:
    """A trial flagged as measured under interference is enqueued again (its own row stays, flagged), up to
    sweep.remeasure_interfered times; the copy runs after the trials already waiting. Not on a host that stays busy
    (the quiet wait failed that many times in a row before this trial, stage.py): the copy would meet the same load."""
    done = trial.user_attrs.get("remeasure", 0)
    if not (metrics.get("interference") or {}).get("interfered") or done >= cfg.sweep.remeasure_interfered:
        return ""
    busy = trial.user_attrs.get("host_stays_busy")
    if busy:
        return f"; not re-measured: the host stayed busy through {busy} quiet wait{'s' * (busy != 1)} in a row"
    study.enqueue_trial(
        p, user_attrs={"repeat": trial.user_attrs.get("repeat", 0), "remeasure": done + 1, "remeasure_of": trial.number}
    )
    return f"; measured under interference: enqueued again ({done + 1}/{cfg.sweep.remeasure_interfered})"


def _requeue(study, trial, run: TrialRun, p, reason) -> str:
    """A trial whose SLURM job was cancelled or preempted: failed with SLURM's reason and its point enqueued again
    (up to slurm.MAX_REQUEUES times, then failed for good), never left RUNNING."""
    n = trial.user_attrs.get("requeued", 0)
    run.end("KILLED", reason)
    if n >= slurm.MAX_REQUEUES:
        trial.set_user_attr("failure_kind", "slurm_requeues")
        study.tell(trial, state=TrialState.FAIL)
        return f"failed ({reason}; already enqueued again {n} times)"
    study.tell(trial, state=TrialState.FAIL)
    study.enqueue_trial(p, user_attrs={"repeat": trial.user_attrs.get("repeat", 0), "requeued": n + 1})
    return f"{reason} ({n + 1}/{slurm.MAX_REQUEUES})"


def _copied(trial) -> dict:
    """What a trial enqueued again after a fault keeps of its own: which repeat or re-measure of its point it is (as
    a copy enqueued for a dead worker keeps them)."""
    return {k: trial.user_attrs[k] for k in ("repeat", "remeasure", "remeasure_of") if k in trial.user_attrs}


def _taken_over(tracker, run: TrialRun) -> str:
    why = "taken over: another worker failed this trial as stale (late heartbeat) and runs it again"
    best_effort(lambda: run.end("KILLED", why) if run.run_id and tracker.status(run.run_id) == "RUNNING" else None)
    return f"{why}; nothing recorded here"


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
