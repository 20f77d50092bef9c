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

import json
import signal
import sys
import warnings
from pathlib import Path

import optuna
from optuna.trial import TrialState

from pipeline import catalog
from pipeline.errors import Stopped, interruption
from pipeline.host.devices import probe
from pipeline.measure.quiet import QuietGate
from pipeline.preflight import check_store
from pipeline.records.table import point_of, write_table
from pipeline.sweep import claims, slurm, study_parent, study_setup, study_view, unselected
from pipeline.sweep.best_effort import best_effort
from pipeline.sweep.claims import open_storage, storage_url
from pipeline.sweep.feasible import check_point
from pipeline.sweep.progress import progress
from pipeline.sweep.space import Space
from pipeline.sweep.worker import Stores, Sweep, Worker, fault_text, fmt_point, resumes
from pipeline.tracking import client
from pipeline.trial.launch import Infeasible, check_batch_fits
from pipeline.trial.lifecycle import user_listeners

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


def _feasibility(space: Space, host, n_train: int | None = None) -> tuple[list, list]:
    """The points of the space this host runs, and the others, each with the reason (feasible.check_point; with
    `n_train`, also a global batch larger than the training set, check_batch_fits)."""
    feasible, skipped = [], []
    for p in progress(space.points, f"[sweep {space.strategy}] checking which points run here"):
        tcfg = space.config(p)
        try:
            check_point(space.cfg, host, tcfg)
            if n_train is not None:
                check_batch_fits(tcfg, n_train)
            feasible.append(p)
        except Infeasible as e:
            skipped.append((p, str(e)))
    return feasible, skipped


def prepare_study(
    space: Space, host, tracker, storage, n_train: int | None = None
) -> tuple[optuna.Study, list[dict], list[tuple[dict, str]]]:
    """Create or load the study in `storage` (claims.open_storage); the creator opens the parent run and enqueues
    every feasible point sweep.repeats times (enqueue_order). A set-up left incomplete (its creator interrupted) is
    completed here: the missing trials are enqueued, none twice (study_setup)."""
    cfg, strategy = space.cfg, space.strategy
    feasible, skipped = _feasibility(space, host, n_train)
    budget = cfg.sweep.n_trials or len(feasible)
    queue = enqueue_order(feasible[:budget], cfg.sweep.repeats)
    study, setting_up = _open_study(space, storage, queue)
    if not setting_up:
        return study, feasible, skipped
    if study_parent.PARENT not in study.user_attrs:
        study_parent.start(study, space, host, tracker, storage.url, len(feasible))
    study_view.name_study(study, strategy, cfg.profile, space.hash, space.choices, space.facts)
    resumed = len(study.get_trials(deepcopy=False))
    grew = study_setup.DONE in study.user_attrs
    added = study_setup.complete(study, queue, f"[sweep {strategy}] enqueueing trials")  # marks it complete last
    if resumed and not grew:
        print(
            f"[sweep {strategy}] study {space.name}: its set-up had been interrupted after {resumed} trial(s) were "
            f"enqueued; the {added} missing trial(s) are enqueued now",
            file=sys.stderr,
            flush=True,
        )
    return study, feasible, skipped


def _open_study(space: Space, storage, queue) -> tuple[optuna.Study, bool]:
    """The space's study (named space.name), created, or loaded once no other worker sets it up (study_setup.ready),
    and whether this worker sets it up (study_setup.begin): False for a study set up in full whose queue holds all
    of `queue`."""
    cfg, strategy, name = space.cfg, space.strategy, space.name
    try:
        study = optuna.create_study(
            study_name=name, storage=storage, direction="maximize", sampler=_sampler(cfg), load_if_exists=False
        )
        study_setup.begin(study, queue)
    except optuna.exceptions.DuplicatedStudyError:
        study = study_setup.ready(
            optuna.load_study(study_name=name, storage=storage, sampler=_sampler(cfg)),
            lambda: optuna.load_study(study_name=name, storage=storage, sampler=_sampler(cfg)),
        )
        if study_setup.DONE in study.user_attrs:
            grown = study_setup.missing(study, queue)
            if not grown:
                return study, False
            print(
                f"[sweep {strategy}] study {name}: its queue grew from {study.user_attrs[study_setup.DONE]} to "
                f"{len(queue)} trial(s) (sweep.n_trials {cfg.sweep.n_trials or 'the whole grid'}); the "
                f"{len(grown)} new trial(s) are enqueued, the finished ones kept",
                file=sys.stderr,
                flush=True,
            )
        study_setup.begin(study, queue)  # its creator was interrupted, or its budget grew: this worker completes it
    return study, True


def _others_running(study) -> bool:
    """Whether other live workers run trials of the study; False when the Optuna store cannot say (lost or
    unreachable): the parent run is then ended, not left RUNNING, and a live worker's rerun marks it RUNNING again."""
    try:
        return bool(claims.held_elsewhere(study))
    except Exception:
        return False


# ----------------------------------------------------------------------------- the worker


def _quiet_gate(cfg, strategy: str) -> QuietGate | None:
    """The wait for a quiet moment before each trial (measure/quiet.py); None where it is off or the trials run
    on other machines (SLURM), whose load this host cannot see."""
    if cfg.sweep.quiet_wait_s <= 0 or slurm.is_on(cfg):
        return None
    gate = QuietGate(cfg.train.interference_threshold, cfg.sweep.quiet_wait_s)
    print(f"[sweep {strategy}] before each trial: waiting for {gate.wants()}", file=sys.stderr, flush=True)
    return gate


def run_sweep(cfg, strategy: str, out_csv: Path, max_new_trials: int | None = None) -> Path:
    """Run the study of `strategy` on this worker (see the module's docstring) and write its table to `out_csv`."""
    space = Space(cfg, strategy)  # the points, their Configs and the study's name, read from cfg once
    if not unselected.selected(cfg, strategy):  # DVC runs every sweep@ stage; params.yaml picks which run trials
        return unselected.write_table(space, out_csv)
    sweep, feasible = _set_up(space, out_csv)
    worker = Worker(sweep)
    # from here every stop (Ctrl-C, SIGTERM, a fault) ends in `finally`: nothing this worker holds is left RUNNING
    interrupted, fault, why = True, None, "interrupted"
    try:
        _announce(sweep, feasible)
        sweep.gate = _quiet_gate(cfg, strategy) if feasible else None  # nothing this host can run: nothing to wait for
        worker.serve(max_new_trials)
        interrupted = False
    except KeyboardInterrupt as e:
        why = f"interrupted ({signal.Signals(getattr(e, 'signum', signal.SIGINT)).name})"
        raise
    except Exception as e:  # a fault: the trial (if any) is closed already; the parent run is closed below
        if (signalled := interruption(e)) is not None:
            why = f"interrupted ({signal.Signals(signalled.signum).name})"
            raise signalled from None
        why = f"error: {fault_text(e)}"
        fault = (
            e
            if isinstance(e, Stopped)
            else Stopped(
                f"The sweep stopped on {fault_text(e, sweep.stores)}. Fix the cause (free disk space, a writable and "
                f"reachable store) and rerun the sweep: {resumes(worker.done)}."
            )
        )
        raise fault from None
    finally:
        _end(sweep, worker.parent_id, why if interrupted else None, fault)
    return out_csv


def _end(sweep: Sweep, parent_id: str | None, interrupted: str | None, fault: BaseException | None) -> None:
    """The sweep's end on this worker: a trial it holds released (`interrupted`: why, None when it ran to its end),
    the table written (not after a fault: the store may be gone), and the parent run finished by the worker that
    ends the study, else ended unless another worker is on it (the rerun marks it RUNNING again)."""
    study, tracker = sweep.study, sweep.tracker
    if interrupted:  # stopped between a claim and the trial's end: the trial it holds fails and waits again
        best_effort(lambda: claims.release_mine(study, f"{interrupted}; enqueued again"))
    if fault is None:
        write_table(study, sweep.strategy, sweep.skipped, sweep.out_csv, sweep.host)
    if not interrupted:
        study_parent.finish(study, tracker, parent_id, sweep.out_csv, sweep.skipped)
    else:
        _end_parent(study, tracker, "FAILED" if fault else "KILLED", str(fault or ""), parent_id)


def load_study(cfg, strategy: str) -> optuna.Study:
    """The study a sweep of `cfg` runs for `strategy`, from sweep.storage: to read it in a notebook or a test."""
    return optuna.load_study(study_name=Space(cfg, strategy).name, storage=open_storage(storage_url(cfg)))


def _check_input(cfg, stores: Stores) -> int:
    """The training data (present, unchanged, the right source) and both stores' URLs, checked before either store
    is created or opened; returns the number of training samples."""
    from pipeline.trial.ranks import load_data

    data = load_data(cfg, verify=True)  # present, unchanged, right source
    n_train = len(data.train_y)
    del data
    for url, key in ((stores.optuna, "sweep.storage"), (stores.mlflow, "tracking.uri")):
        check_store(url, key)  # both, before either store is created or opened
    user_listeners(cfg)  # tracking.listeners: each one loads and builds, or the sweep stops here, naming it
    return n_train


def _set_up(space: Space, out_csv: Path) -> tuple[Sweep, list[dict]]:
    """The sweep's context (worker.Sweep: the host, the tracker, the prepared study, its skipped points) and the
    feasible points, with bad input stopped before anything is written to the stores (_check_input) and both stores
    created under claims.creating_stores."""
    cfg = space.cfg
    host, stores = probe(), Stores.of(cfg)
    n_train = _check_input(cfg, stores)
    with claims.creating_stores(stores.optuna, stores.mlflow):
        storage = open_storage(stores.optuna)  # a bad URL fails now
        tracker = client.Tracker(cfg)
        try:
            study, feasible, skipped = prepare_study(space, host, tracker, storage, n_train)
        except BaseException as e:  # Ctrl-C in the set-up: a parent run it opened is not left RUNNING
            if (signalled := interruption(e)) is None:
                raise
            best_effort(lambda: _end_setup(optuna.load_study(study_name=space.name, storage=storage), tracker))
            raise signalled from None
    sweep = Sweep(space, host, tracker, study, skipped, out_csv, stores)
    sweep.total = study.user_attrs.get("enqueued", len(feasible))
    return sweep, feasible


def _announce(sweep: Sweep, feasible: list[dict]) -> None:
    """How many of the study's trials this worker runs (_left; none: the study is complete, and says so), and each
    point this host skips with the reason."""
    study, strategy, host, total, skipped = sweep.study, sweep.strategy, sweep.host, sweep.total, sweep.skipped
    done = claims.finished(study)
    left = _left(sweep, feasible)
    where = f"{len(skipped)} point(s) skipped on this host ({host.kind} x{host.n})"
    if total and done >= total and not left:
        failed = len(study.get_trials(deepcopy=False, states=(TrialState.FAIL,)))
        print(
            f"[sweep {strategy}] study {study.study_name} is complete: all {total} trial(s) of its points ran to an "
            f"end ({failed} failed: see the table), nothing to run: its table holds the figures already measured "
            f"(a higher sweep.repeats measures every point again); {where}",
            file=sys.stderr,
            flush=True,
        )
    else:
        again = sum(1 for t in left if t.user_attrs.get("remeasure"))
        notes = [f"{again} of them a re-measure of a trial flagged as measured under interference"] if again else []
        notes += [f"{done} of {total} ran to an end already"] if done else []
        if (most := sweep.cfg.sweep.remeasure_interfered) and left:
            notes += [f"each trial flagged as measured under interference adds one: sweep.remeasure_interfered={most}"]
        said = f" ({'; '.join(notes)})" if notes else ""
        print(
            f"[sweep {strategy}] study {study.study_name}: {len(left)} trial(s) to run{said}, {where}", file=sys.stderr
        )
    for reason, group in _by_reason(skipped):
        print(f"  skipped {_points_text(group)}: {reason}", file=sys.stderr)
    for k, (set_to, default, n, of) in sweep.space.defaulted().items():
        which = "its trials" if n == of else f"{n} of its {of} points' trials"
        print(
            f"  {catalog.applies_with(k, set_to)}: {which} run without it and record the default train.{k}={default}",
            file=sys.stderr,
        )


def _left(sweep: Sweep, feasible: list[dict]) -> list:
    """The study's trials this worker runs from here: the waiting ones at a point this host runs (the queue's rest,
    sweep.repeats' rounds, the copies of interrupted trials and the queued re-measures) and the running ones whose
    worker is gone (a copy of each is enqueued when its heartbeat goes stale), not those another live worker holds."""
    here = {json.dumps(p, sort_keys=True) for p in feasible}
    waiting = [
        t
        for t in sweep.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if json.dumps(point_of(t), sort_keys=True) in here
    ]
    try:
        held = {t.number for t in claims.held_elsewhere(sweep.study)}
    except Exception:  # the store cannot say: count the waiting ones only
        return waiting
    return waiting + [t for t in claims.running(sweep.study) if t.number not in held]


def _by_reason(skipped) -> list[tuple[str, list[dict]]]:
    """The skipped points grouped by their reason, in their order: one line per reason, however many points."""
    groups: dict[str, list[dict]] = {}
    for p, reason in skipped:
        groups.setdefault(reason, []).append(p)
    return list(groups.items())


def _points_text(group: list[dict], shown: int = 3) -> str:
    """ "k=2 B=64 lr=0.1" for one point; "6 points (k=1 B=64 lr=0.1; ...; and 3 more: the sweep table lists each)"."""
    if len(group) == 1:
        return fmt_point(group[0])
    named = "; ".join(fmt_point(p) for p in group[:shown])
    more = f"; and {len(group) - shown} more: the sweep table lists each" if len(group) > shown else ""
    return f"{len(group)} points ({named}{more})"


def _end_setup(study, tracker) -> None:
    """A set-up this worker was running, interrupted: its parent run ended KILLED. A worker that only waited for
    another's set-up (study_setup.ready) leaves the run to that one."""
    if study.user_attrs.get(study_setup.SETUP_BY) == claims.me():
        _end_parent(study, tracker, "KILLED")


def _end_parent(study, tracker, status: str, reason: str = "", parent_id: str | None = None) -> None:
    """End the study's parent run with `status`, unless another live worker runs trials under it (best effort: a
    store that fails is being reported). `parent_id`: the run's id as read before, where the Optuna store that holds
    it may be gone by now."""

    def end() -> None:
        run_id = parent_id or study.user_attrs.get(study_parent.PARENT)
        if run_id and tracker.status(run_id) == "RUNNING" and not _others_running(study):
            tracker.close_run(run_id, status, reason)

    best_effort(end)
