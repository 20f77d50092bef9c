"""The sweep stage: one Optuna study per strategy over devices x batch size x learning rate (x DDP knobs).

    python -m pipeline sweep --strategy ddp          # DVC stage sweep@ddp

Every feasible point of the space is enqueued sweep.repeats times (in alternating rounds), when the study is created
(a set-up cut short is completed by the next run, study_setup.py); workers (one, or many sharing an RDB URL) claim
waiting trials atomically in that order, run each as one training trial, and log one nested MLflow run per trial
under the study's parent run. Infeasible points are not run: they appear in the sweep table as skipped with the
reason. Trials carry a heartbeat; a trial whose worker died is failed when its heartbeat goes stale and a copy is
enqueued again (Optuna's RetryFailedTrialCallback), so a rerun finishes an interrupted study without repeating
finished trials. results/sweeps/<strategy>.jsonl is rewritten from the study after every trial.
"""
from __future__ import annotations

import functools
import json
import sys
import time
import warnings
from pathlib import Path

import optuna
from optuna.trial import TrialState

from pipeline.sweep import queue as claims, slurm, study_parent, study_setup, study_view
from pipeline import paths
from pipeline.tracking import client as tracking
from pipeline.config import loader as configmod
from pipeline.records import labels as emulated
from pipeline.measure import meter
from pipeline.measure.quiet import QuietGate
from pipeline.host.capabilities import host_capabilities
from pipeline.sweep.queue import open_storage, storage_url
from pipeline.host.devices import probe
from pipeline.errors import FAULT_TEXT, Stopped, interruption, redact, root_cause, store_fault
from pipeline.trial.launch import Infeasible, TrialFailed, check_batch_fits, check_feasible, host_fields
from pipeline.preflight import check_store
from pipeline.sweep.progress import progress
from pipeline.sweep.space import choices, points, space_hash, study_name, trial_config
from pipeline.records.trial import planned
from pipeline.strategies import STRATEGIES
from pipeline.records.table import KNOBS, trial_row, write_rows, write_table

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


# ----------------------------------------------------------------------------- study set-up

def _sampler(cfg):
    if cfg.sweep.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=cfg.train.seed)
    return optuna.samplers.RandomSampler(seed=cfg.train.seed)  # only used for trials outside the queue


def enqueue_order(pts: list[dict], repeats: int) -> list[tuple[dict, int]]:
    """(point, repeat) in the order trials run (claims.claim takes WAITING trials in enqueue order): `repeats`
    rounds, each over every point, grouped so that points differing only in devices and batch size (a k=1
    reference and the k>1 points its weak and strong efficiencies divide) run one after another; round 2 the same
    again. Repeats of one point are thus minutes apart, and each efficiency's two ends seconds apart, in every round."""
    groups: dict = {}
    for p in pts:
        groups.setdefault(tuple((k, v) for k, v in p.items() if k not in ("devices", "batch_size")), []).append(p)
    return [(p, r) for r in range(repeats) for g in groups.values() for p in g]


def prepare_study(cfg, strategy: str, host, tracker, storage=None,
                  n_train: int | None = None) -> tuple[optuna.Study, list[dict], list[tuple[dict, str]]]:
    """Create or load the study; the creator opens the parent run and enqueues every feasible point
    sweep.repeats times (enqueue_order). A set-up left incomplete (its creator interrupted) is completed here:
    the missing trials are enqueued, none twice (study_setup)."""
    storage = storage or open_storage(cfg)
    name = study_name(cfg, strategy)
    feasible, skipped = [], []
    for p in progress(points(cfg, strategy), f"[sweep {strategy}] checking which points run here"):
        tcfg = trial_config(cfg, strategy, p)
        try:
            check_feasible(slurm.sized(cfg, tcfg), slurm.cluster_host(cfg, host))  # SLURM: one node's devices
            if n_train is not None:
                check_batch_fits(tcfg, n_train)
            feasible.append(p)
        except Infeasible as e:
            skipped.append((p, str(e)))
    budget = cfg.sweep.n_trials or len(feasible)
    queue = enqueue_order(feasible[:budget], cfg.sweep.repeats)
    try:
        study = optuna.create_study(study_name=name, storage=storage, direction="maximize",
                                    sampler=_sampler(cfg), load_if_exists=False)
        study_setup.begin(study, queue)
    except optuna.exceptions.DuplicatedStudyError:
        study = study_setup.ready(optuna.load_study(study_name=name, storage=storage, sampler=_sampler(cfg)),
                                  lambda: optuna.load_study(study_name=name, storage=storage, sampler=_sampler(cfg)))
        if study_setup.DONE in study.user_attrs:
            return study, feasible, skipped
        study_setup.begin(study, queue)  # its creator was interrupted: this worker completes the set-up
    if "mlflow_parent_run_id" not in study.user_attrs:
        parent = tracker.start_run(f"study {strategy}", {
            "strategy": strategy, "study": name, "profile": cfg.profile, "data_source": cfg.data.source,
            "synthetic": str(cfg.data.source == "synthetic").lower(), "device_kind": host.kind,
            "host": host.hostname, "git_sha": tracking.git_sha(), "dvc_stage": f"sweep@{strategy}",
            "role": "study"}, owned=False)  # every worker of the study shares it; study_parent ends it
        tracker.log_params(parent, {"space": json.dumps(choices(cfg, strategy))[:6000], "points": len(feasible),
                                    "epochs": cfg.train.epochs, "storage": redact(storage_url(cfg))})
        study.set_user_attr("mlflow_parent_run_id", parent)
    study_view.name_study(study, strategy, cfg.profile, space_hash(cfg, strategy))
    resumed = len(study.get_trials(deepcopy=False))
    added = study_setup.complete(study, queue, f"[sweep {strategy}] enqueueing trials")  # marks it complete last
    if resumed:
        print(f"[sweep {strategy}] study {name}: its set-up had been interrupted after {resumed} trial(s) were "
              f"enqueued; the {added} missing trial(s) are enqueued now", file=sys.stderr, flush=True)
    return study, feasible, skipped


# ----------------------------------------------------------------------------- one trial

def _fmt_point(p: dict) -> str:
    s = f"k={p['devices']} B={p['batch_size']} lr={p['lr']}"
    if p.get("model") and p["model"] != "lenet":
        s = f"{p['model']} {s}"
    for k in KNOBS:
        default = getattr(configmod.SpaceConfig(), k)[0]
        if k in p and p[k] != default:
            s += f" {k}={p[k]}"
    return s


def run_one(cfg, strategy, study, trial, host, tracker, parent_id, label, trials_dir: Path) -> str:
    """Run one claimed trial and record it once: COMPLETE/PRUNED/FAIL in Optuna, FINISHED/KILLED/FAILED in MLflow.
    A trial taken over by another worker is stopped and recorded by that worker only."""
    p = {k: trial.suggest_categorical(k, vals) for k, vals in choices(cfg, strategy).items()}
    tcfg, bounded = emulated.bound(trial_config(cfg, strategy, p), STRATEGIES[strategy].autocast_dtype(
        cfg.train, host.kind), host_caps(host), cfg.sweep.emulated_max_steps)  # "" = not bounded
    out_dir = trials_dir / f"{study.study_name}-{trial.number:04d}"
    beat, run_id, t0 = claims.heartbeat(trial), None, time.monotonic()

    def note(attrs: dict) -> None:
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        tracker.set_tags(run_id, {f"parallax.{k}": v for k, v in attrs.items()})

    def on_epoch(record):
        tracker.log_metrics(run_id, tracking.epoch_metrics(record), step=record["epoch"])
        eta = (time.monotonic() - t0) / record["epoch"] * (record["epochs"] - record["epoch"])
        print(f"  {label} epoch {record['epoch']}/{record['epochs']}: acc {record['test_acc']:.3f}, "
              f"loss {record['train_loss']:.3f}, trial ETA {eta:.0f} s", file=sys.stderr, flush=True)
        if beat.lost.is_set():
            return True  # taken over: stop at this epoch's end
        if cfg.sweep.pruning:
            trial.report(record["test_acc"], record["epoch"])
            return trial.should_prune()
        return False

    try:
        with beat:
            plan = planned(slurm.sized(cfg, tcfg), host, host_fields(host, tcfg.train.devices))
            tags = {**tracking.base_tags(plan, tcfg, stage=f"sweep@{strategy}"), "trial": trial.number,
                    "study": study.study_name, "optuna_trial_id": claims.trial_id(trial)}
            run_id = tracker.start_run(f"{strategy} {_fmt_point(p)}", tags, parent_id=parent_id)
            trial.set_user_attr("mlflow_run_id", run_id)
            tracker.log_params(run_id, plan.params())
            if bounded:
                print(f"  {label} {bounded}", file=sys.stderr, flush=True)
                trial.set_user_attr("reason", bounded)  # the sweep table's reason column
                tracker.set_tags(run_id, {"parallax.bounded": bounded})
            tracker.log_dataset(run_id, tcfg)
            try:
                with tracking.system_metrics(cfg, run_id):  # off unless tracking.system_metrics
                    # here, or as a SLURM job when slurm.partition is set (slurm.py; note: its job id, node count)
                    metrics = slurm.runner(cfg)(tcfg, out_dir, on_epoch=on_epoch, progress=sys.stderr.isatty(),
                                                timeout_s=cfg.sweep.trial_timeout_s, label=label, note=note)
            except TrialFailed as e:
                metrics = e
        if beat.lost.is_set():
            return _taken_over(tracker, run_id)
        if isinstance(metrics, TrialFailed):
            reason = f"{metrics.kind}: {metrics}"
            trial.set_user_attr("reason", reason)
            if getattr(metrics, "requeue", False):  # SLURM cancelled or preempted its job (slurm.Requeued)
                return _requeue(study, trial, tracker, run_id, p, reason)
            trial.set_user_attr("failure_kind", metrics.kind)
            tracker.close_run(run_id, "FAILED", reason)
            study.tell(trial, state=TrialState.FAIL)
            return f"failed ({reason})"
        outcome = _record_result(study, trial, tracker, run_id, metrics, out_dir)
        return outcome + _remeasure(cfg, study, trial, p, metrics)
    except optuna.exceptions.UpdateFinishedTrialError:
        return _taken_over(tracker, run_id)
    except BaseException as e:  # interrupted, or a fault (disk full, store gone): leave nothing RUNNING
        signalled = interruption(e)  # Ctrl-C, or a signal torch's launcher caught as SignalException
        interrupted = signalled is not None
        e = e if isinstance(e, KeyboardInterrupt) else signalled or e
        why = f"interrupted ({e or type(e).__name__})" if interrupted else f"error: {root_cause(e)}"
        closed, noted, told, again = _best_effort(
            lambda: tracker.close_run(run_id, "KILLED" if interrupted else "FAILED",
                                      f"{why}; trial enqueued again") if run_id else None,
            lambda: trial.set_user_attr("reason", f"{why}; enqueued again"),
            lambda: study.tell(trial, state=TrialState.FAIL),
            lambda: study.enqueue_trial(p))
        if interrupted:
            raise e from None
        raise Stopped(f"The sweep stopped in trial #{trial.number} ({_fmt_point(p)}) on {_fault_text(e)}. "
                      f"{_recorded(tracker, run_id, told, again)} Fix the cause (free disk space, a writable and "
                      f"reachable store) and rerun the sweep: finished trials are kept.") from None


def _fault_text(e: BaseException) -> str:
    fault = store_fault(e)
    return f"{FAULT_TEXT[fault]} ({root_cause(e)})" if fault else root_cause(e)


def _recorded(tracker, run_id, told: bool, again: bool) -> str:
    """What the stores hold of a trial stopped by a fault, as read back, never as intended."""
    if told and again:
        optuna_part = "The trial was recorded as failed with this reason and enqueued again"
    elif told:
        optuna_part = "The trial was recorded as failed, but enqueueing it again failed"
    else:
        optuna_part = (f"The Optuna store did not record the trial's failure: it stays RUNNING there until its "
                       f"heartbeat is {claims.GRACE_S:.0f} s old, when a rerun fails it and runs it again")
    status = tracker.status(run_id) if run_id else "none"
    mlflow_part = ("no MLflow run was opened" if status == "none" else
                   f"its MLflow run ended {status}" if status in ("FAILED", "KILLED", "FINISHED") else
                   f"its MLflow run {run_id} could not be ended (the store refused the write) and still shows "
                   f"RUNNING" if status == "RUNNING" else
                   f"the state of its MLflow run {run_id} could not be read back")
    return f"{optuna_part}; {mlflow_part}."


@functools.cache
def host_caps(host) -> dict:
    """capabilities.host_capabilities, read once per process."""
    return host_capabilities(host)


def _record_result(study, trial, tracker, run_id, metrics, out_dir) -> str:
    trial.set_user_attr("metrics", metrics.to_json())
    study_view.set_trial_numbers(trial, metrics)
    tracking.log_completed_run(tracker, run_id, metrics, out_dir)
    if metrics["stopped"]:
        trial.set_user_attr("reason", f"pruned after epoch {len(metrics['test_acc'])}")
        tracker.end_run(run_id, "KILLED")
        study.tell(trial, state=TrialState.PRUNED)
        return "pruned"
    untimed = meter.untimed(metrics)
    if untimed:  # complete, its accuracy valid; the table's reason and the run's tag say why img/s is missing
        trial.set_user_attr("reason", "; ".join(filter(None, (trial.user_attrs.get("reason"), untimed))))
        tracker.set_tags(run_id, {"parallax.untimed": untimed})
    tracker.end_run(run_id, "FINISHED")
    study.tell(trial, metrics["test_acc"][-1])
    return f"{meter.speed_text(metrics)}, acc {metrics['test_acc'][-1]:.3f}"


def _remeasure(cfg, study, trial, p, metrics) -> str:
    """A trial flagged as measured under interference is enqueued again (its own row stays, flagged), up to
    sweep.remeasure_interfered times; the copy runs after the trials already waiting."""
    done = trial.user_attrs.get("remeasure", 0)
    if not (metrics.get("interference") or {}).get("interfered") or done >= cfg.sweep.remeasure_interfered:
        return ""
    study.enqueue_trial(p, user_attrs={"repeat": trial.user_attrs.get("repeat", 0), "remeasure": done + 1})
    return f"; measured under interference: enqueued again ({done + 1}/{cfg.sweep.remeasure_interfered})"


def _requeue(study, trial, tracker, run_id, p, reason) -> str:
    """A trial whose SLURM job was cancelled or preempted: failed with SLURM's reason and its point enqueued again
    (up to slurm.MAX_REQUEUES times, then failed for good), never left RUNNING."""
    n = trial.user_attrs.get("requeued", 0)
    tracker.close_run(run_id, "KILLED", reason)
    if n >= slurm.MAX_REQUEUES:
        trial.set_user_attr("failure_kind", "slurm_requeues")
        study.tell(trial, state=TrialState.FAIL)
        return f"failed ({reason}; already enqueued again {n} times)"
    study.tell(trial, state=TrialState.FAIL)
    study.enqueue_trial(p, user_attrs={"repeat": trial.user_attrs.get("repeat", 0), "requeued": n + 1})
    return f"{reason} ({n + 1}/{slurm.MAX_REQUEUES})"


def _taken_over(tracker, run_id) -> str:
    why = "taken over: another worker failed this trial as stale (late heartbeat) and runs it again"
    _best_effort(lambda: tracker.close_run(run_id, "KILLED", why)
                 if run_id and tracker.client.get_run(run_id).info.status == "RUNNING" else None)
    return f"{why}; nothing recorded here"


def _others_running(study) -> bool:
    """Whether trials of the study run (in other workers); False when the Optuna store cannot say (lost or
    unreachable): the parent run is then ended, not left RUNNING, and a live worker's rerun marks it RUNNING again."""
    try:
        return bool(claims.running(study))
    except Exception:
        return False


def _best_effort(*steps) -> list[bool]:
    """Each step tried once; a store that is failing is already being reported. Returns which steps succeeded."""
    done = []
    for step in steps:
        try:
            step()
            done.append(True)
        except Exception:
            done.append(False)
    return done


# ----------------------------------------------------------------------------- the worker

def _quiet_gate(cfg, strategy: str) -> QuietGate | None:
    """The wait for a quiet moment before each trial (measure/quiet.py); None where it is off or the trials run
    on other machines (SLURM), whose load this host cannot see."""
    if cfg.sweep.quiet_wait_s <= 0 or slurm.is_on(cfg):
        return None
    gate = QuietGate(cfg.train.interference_threshold, cfg.sweep.quiet_wait_s)
    print(f"[sweep {strategy}] before each trial: waiting for {gate.wants()}", file=sys.stderr, flush=True)
    return gate


def _unselected(cfg, strategy: str, out_csv: Path) -> Path:
    """The table of a strategy params.yaml does not select: every point, with the reason, and no trial run."""
    why = f"not selected: `{strategy}` is not in sweep.strategies ({', '.join(cfg.sweep.strategies)})"
    stand_in = type("Unselected", (), {"study_name": study_name(cfg, strategy)})
    write_rows([trial_row(stand_in, strategy, point=p, reason=why) for p in points(cfg, strategy)], out_csv)
    print(f"[sweep {strategy}] {why}: no trial run", file=sys.stderr, flush=True)
    return out_csv


def run_sweep(cfg, strategy: str, out_csv: Path, max_new_trials: int | None = None) -> Path:
    host = probe()
    if strategy not in cfg.sweep.strategies:  # DVC runs every sweep@ stage; params.yaml picks which run trials
        return _unselected(cfg, strategy, out_csv)
    # bad input stops here, before anything is written to the stores
    from pipeline.trial.ranks import load_data
    data = load_data(configmod.replace_train(cfg, strategy=strategy), verify=True)  # present, unchanged, right source
    n_train = len(data.train_y)
    del data
    for url, key in ((storage_url(cfg), "sweep.storage"), (tracking.tracking_uri(cfg), "tracking.uri")):
        check_store(url, key)  # both, before either store is created or opened
    with claims.creating_stores(storage_url(cfg), tracking.tracking_uri(cfg)):
        storage = open_storage(cfg)  # a bad URL fails now
        tracker = tracking.Tracker(cfg)
        study, feasible, skipped = prepare_study(cfg, strategy, host, tracker, storage, n_train)
    parent_id = study.user_attrs.get("mlflow_parent_run_id")
    if parent_id and tracker.client.get_run(parent_id).info.status != "RUNNING":
        tracker.client.update_run(parent_id, status="RUNNING")
    trials_dir = paths.repo_root() / "runs" / "trials"
    total = study.user_attrs.get("enqueued", len(feasible))
    print(f"[sweep {strategy}] study {study.study_name}: {total} trial(s) to run, {len(skipped)} point(s) "
          f"skipped on this host ({host.kind} x{host.n})", file=sys.stderr, flush=True)
    for p, why in skipped:
        print(f"  skipped {_fmt_point(p)}: {why}", file=sys.stderr)

    def runnable(point: dict) -> bool:
        try:
            check_feasible(slurm.sized(cfg, trial_config(cfg, strategy, point)), slurm.cluster_host(cfg, host))
            return True
        except Infeasible:
            return False

    gate = _quiet_gate(cfg, strategy)

    def run(trial, done: int, eta: float | None) -> None:
        label = f"[sweep {strategy}] trial {done + 1}/{total}"
        print(f"{label} (#{trial.number}) {_fmt_point(claims.fixed_point(trial))}"
              + (f", sweep ETA {eta:.0f} s" if eta else ""), file=sys.stderr, flush=True)
        if gate is not None:
            waited = gate.wait()
            if waited.text:
                print(f"{label} {waited.text}", file=sys.stderr, flush=True)
                trial.set_user_attr("quiet_wait", waited.text)
        outcome = run_one(cfg, strategy, study, trial, host, tracker, parent_id, label, trials_dir)
        print(f"{label} -> {outcome}", file=sys.stderr, flush=True)
        write_table(study, strategy, skipped, out_csv, host)

    interrupted, fault = True, None
    try:
        claims.serve(study, tracker, runnable, run, total, max_new_trials, where=f" ({host.kind} x{host.n})",
                     say=lambda msg: print(f"[sweep {strategy}] {msg}", file=sys.stderr, flush=True))
        interrupted = False
    except Exception as e:  # a fault: the trial (if any) is closed already; the parent run is closed below
        if (signalled := interruption(e)) is not None:
            raise signalled from None
        fault = e if isinstance(e, Stopped) else Stopped(
            f"The sweep stopped on {_fault_text(e)}. Fix the "
            f"cause (free disk space, a writable and reachable store) and rerun the sweep: finished trials are kept.")
        raise fault from None
    finally:
        if fault is None:
            write_table(study, strategy, skipped, out_csv, host)
        if not interrupted:
            study_parent.finish(study, tracker, parent_id, out_csv, skipped)
        elif parent_id:  # ended unless another worker is on it; the rerun marks it RUNNING again
            _best_effort(lambda: tracker.close_run(parent_id, "FAILED" if fault else "KILLED", str(fault or ""))
                         if not _others_running(study) else None)
    return out_csv
