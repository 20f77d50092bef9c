"""The sweep stage: one Optuna study per strategy over devices x batch size x learning rate (x DDP knobs).

    python -m pipeline sweep --strategy ddp          # DVC stage sweep@ddp

Every feasible point of the space is enqueued once, when the study is created; workers (one, or many sharing an
RDB URL) claim waiting trials atomically, run each as one training trial, and log one nested MLflow run per
trial under the study's parent run. Infeasible points are not run: they appear in the CSV as skipped with the
reason. Trials carry a heartbeat; a trial whose worker died is failed when its heartbeat goes stale and a copy is
enqueued again (Optuna's RetryFailedTrialCallback), so a rerun finishes an interrupted study without repeating
finished trials. results/sweeps/<strategy>.csv is rewritten from the study after every trial.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import itertools
import json
import random
import sys
import time
import warnings
from pathlib import Path

import optuna
from optuna.trial import TrialState

from . import config as configmod
from . import emulated, study_view, tracking
from .capabilities import host_capabilities
from .claims import GRACE_S, HEARTBEAT_S, Heartbeat, claim, end_stale_mlflow_runs, fail_stale_trials
from .devices import probe
from .errors import Stopped, StoreError, redact
from .launch import Infeasible, TrialFailed, check_batch_fits, check_feasible, run_trial
from .preflight import check_store
from .strategies import STRATEGIES
from .sweep_csv import KNOBS, trial_row, write_rows, write_csv

SPACE_KEYS = ("model", "devices", "batch_size", "lr", "bucket_cap_mb", "grad_as_bucket_view", "accum_steps",
              "comm_hook")

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


# ----------------------------------------------------------------------------- the space

def points(cfg, strategy: str) -> list[dict]:
    """Every point of the strategy's space, in a stable order (knob dimensions only for DDP strategies)."""
    keys = [k for k in SPACE_KEYS if k not in KNOBS or strategy in ("ddp", "ddp_amp")]
    out = []
    for space in cfg.space(strategy):
        for combo in itertools.product(*(getattr(space, k) for k in keys)):
            if dict(zip(keys, combo)) not in out:
                out.append(dict(zip(keys, combo)))
    return out


def choices(cfg, strategy: str) -> dict:
    """Per parameter, every value the space takes (Optuna's categorical distributions)."""
    out: dict = {}
    for p in points(cfg, strategy):
        for k, v in p.items():
            out.setdefault(k, [])
            if v not in out[k]:
                out[k].append(v)
    return out


def trial_config(cfg, strategy: str, point: dict):
    return configmod.replace_train(cfg, strategy=strategy, **point)


def study_name(cfg, strategy: str) -> str:
    """Identifies the search space and everything that changes a trial's result, so spaces never mix. The hash
    stays in the name (also kept as user attribute space_hash): a rerun finds its study by name, so a name without
    it would either mix spaces or, renamed, orphan every study already in a store."""
    return f"{cfg.profile}-{strategy}-{space_hash(cfg, strategy)}"


def space_hash(cfg, strategy: str) -> str:
    t = cfg.train
    key = {"space": points(cfg, strategy), "epochs": t.epochs, "seed": t.seed, "max_steps": t.max_steps,
           "data": [cfg.data.source, cfg.data.train_limit, cfg.data.test_limit], "warmup": t.warmup_steps,
           "amp": t.amp_dtype, "pruning": cfg.sweep.pruning, "sampler": cfg.sweep.sampler,
           **({"emulated_max_steps": cfg.sweep.emulated_max_steps} if cfg.sweep.emulated_max_steps else {})}
    return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]


def storage_url(cfg) -> str:
    return cfg.sweep.storage or f"sqlite:///{configmod.repo_root() / 'mlruns' / 'optuna.db'}"


def open_storage(cfg) -> optuna.storages.RDBStorage:
    url = storage_url(cfg)
    check_store(url, "sweep.storage")  # unreachable, corrupt or unwritable: fails now, in seconds
    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)
    stale = ({"heartbeat_stale_trial_callback": retry(max_retry=2)} if retry else
             {"failed_trial_callback": optuna.storages.RetryFailedTrialCallback(max_retry=2)})
    for attempt in range(5):
        try:
            return optuna.storages.RDBStorage(
                url, engine_kwargs={"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None,
                heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S, **stale)
        except Exception as e:  # bad URL, server down, missing driver
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
                f"file in mlruns/.") from None


# ----------------------------------------------------------------------------- study set-up

def _sampler(cfg):
    if cfg.sweep.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=cfg.train.seed)
    return optuna.samplers.RandomSampler(seed=cfg.train.seed)  # only used for trials outside the queue


def prepare_study(cfg, strategy: str, host, tracker, storage=None,
                  n_train: int | None = None) -> tuple[optuna.Study, list[dict], list[tuple[dict, str]]]:
    """Create or load the study; the creator enqueues every feasible point once and opens the parent run."""
    storage = storage or open_storage(cfg)
    name = study_name(cfg, strategy)
    feasible, skipped = [], []
    for p in points(cfg, strategy):
        try:
            check_feasible(trial_config(cfg, strategy, p), host)
            if n_train is not None:
                check_batch_fits(trial_config(cfg, strategy, p), n_train)
            feasible.append(p)
        except Infeasible as e:
            skipped.append((p, str(e)))
    budget = cfg.sweep.n_trials or len(feasible)
    direction = "maximize"
    try:
        study = optuna.create_study(study_name=name, storage=storage, direction=direction,
                                    sampler=_sampler(cfg), load_if_exists=False)
        created = True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage, sampler=_sampler(cfg))
        created = False
    if created:
        parent = tracker.start_run(f"study {strategy}", {
            "strategy": strategy, "study": name, "profile": cfg.profile, "data_source": cfg.data.source,
            "synthetic": str(cfg.data.source == "synthetic").lower(), "device_kind": host.kind,
            "host": host.hostname, "git_sha": tracking.git_sha(), "dvc_stage": f"sweep@{strategy}",
            "role": "study"})
        tracker.log_params(parent, {"space": json.dumps(choices(cfg, strategy))[:6000], "points": len(feasible),
                                    "epochs": cfg.train.epochs, "storage": redact(storage_url(cfg))})
        study.set_user_attr("mlflow_parent_run_id", parent)
        study_view.name_study(study, strategy, cfg.profile, space_hash(cfg, strategy))
        for p in feasible[:budget]:
            study.enqueue_trial(p)
        study.set_user_attr("enqueued", len(feasible[:budget]))  # last: tells other workers the queue is ready
    else:
        deadline = time.monotonic() + 60
        while "enqueued" not in study.user_attrs and time.monotonic() < deadline:
            time.sleep(0.5)  # another worker is creating the study right now
            study = optuna.load_study(study_name=name, storage=storage, sampler=_sampler(cfg))
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
    beat, run_id, t0 = Heartbeat(study._storage, trial._trial_id), None, time.monotonic()

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
            tags = {**tracking.base_tags(tcfg, host, stage=f"sweep@{strategy}"), "trial": trial.number,
                    "study": study.study_name, "optuna_trial_id": trial._trial_id, **host_tags(host)}
            run_id = tracker.start_run(f"{strategy} {_fmt_point(p)}", tags, parent_id=parent_id)
            trial.set_user_attr("mlflow_run_id", run_id)
            tracker.log_params(run_id, tracking.trial_params(tcfg))
            if bounded:
                print(f"  {label} {bounded}", file=sys.stderr, flush=True)
                trial.set_user_attr("reason", bounded)  # the sweep table's reason column
                tracker.set_tags(run_id, {"parallax.bounded": bounded})
            tracker.log_dataset(run_id, tcfg)
            try:
                metrics = run_trial(tcfg, out_dir, on_epoch=on_epoch, progress=sys.stderr.isatty(),
                                    timeout_s=cfg.sweep.trial_timeout_s)
            except TrialFailed as e:
                metrics = e
        if beat.lost.is_set():
            return _taken_over(tracker, run_id)
        if isinstance(metrics, TrialFailed):
            reason = f"{metrics.kind}: {metrics}"
            trial.set_user_attr("reason", reason)
            trial.set_user_attr("failure_kind", metrics.kind)
            tracker.close_run(run_id, "FAILED", reason)
            study.tell(trial, state=TrialState.FAIL)
            return f"failed ({reason})"
        return _record_result(study, trial, tracker, run_id, metrics, out_dir)
    except optuna.exceptions.UpdateFinishedTrialError:
        return _taken_over(tracker, run_id)
    except BaseException as e:  # interrupted, or a fault (disk full, store gone): leave nothing RUNNING
        interrupted = isinstance(e, KeyboardInterrupt)
        why = (f"interrupted ({e or type(e).__name__})" if interrupted else
               f"error: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}")
        _best_effort(lambda: tracker.close_run(run_id, "KILLED" if interrupted else "FAILED",
                                               f"{why}; trial enqueued again") if run_id else None,
                     lambda: trial.set_user_attr("reason", f"{why}; enqueued again"),
                     lambda: study.tell(trial, state=TrialState.FAIL),
                     lambda: study.enqueue_trial(p))
        if interrupted:
            raise
        raise Stopped(f"The sweep stopped in trial #{trial.number} ({_fmt_point(p)}) on {why[len('error: '):]}. "
                      f"The trial was recorded as failed with this reason and enqueued again, its MLflow run "
                      f"ended FAILED. Fix the cause (free disk space, a writable and reachable store) and rerun "
                      f"the sweep: finished trials are kept.") from None


@functools.cache
def host_caps(host) -> dict:
    """capabilities.host_capabilities, read once per process."""
    return host_capabilities(host)


def host_tags(host) -> dict:
    """The host's capabilities as run tags."""
    return tracking.capability_tags(host_caps(host))


def _record_result(study, trial, tracker, run_id, metrics, out_dir) -> str:
    trial.set_user_attr("metrics", metrics)
    study_view.set_trial_numbers(trial, metrics)
    tracking.log_completed_run(tracker, run_id, metrics, out_dir)
    if metrics["stopped"]:
        trial.set_user_attr("reason", f"pruned after epoch {len(metrics['test_acc'])}")
        tracker.end_run(run_id, "KILLED")
        study.tell(trial, state=TrialState.PRUNED)
        return "pruned"
    tracker.end_run(run_id, "FINISHED")
    study.tell(trial, metrics["test_acc"][-1])
    return f"{metrics['throughput_img_s'] or 0:.0f} img/s, acc {metrics['test_acc'][-1]:.3f}"


def _taken_over(tracker, run_id) -> str:
    why = "taken over: another worker failed this trial as stale (late heartbeat) and runs it again"
    _best_effort(lambda: tracker.close_run(run_id, "KILLED", why)
                 if run_id and tracker.client.get_run(run_id).info.status == "RUNNING" else None)
    return f"{why}; nothing recorded here"


def _best_effort(*steps) -> None:
    """Each step tried once; a store that is failing is already being reported."""
    for step in steps:
        try:
            step()
        except Exception:
            pass


# ----------------------------------------------------------------------------- the worker loop

def run_sweep(cfg, strategy: str, out_csv: Path, max_new_trials: int | None = None) -> Path:
    host = probe()
    if strategy not in cfg.sweep.strategies:  # DVC runs every sweep@ stage; params.yaml picks which run trials
        why = f"not selected: `{strategy}` is not in sweep.strategies ({', '.join(cfg.sweep.strategies)})"
        stand_in = type("Unselected", (), {"study_name": study_name(cfg, strategy)})
        write_rows([trial_row(stand_in, strategy, point=p, reason=why) for p in points(cfg, strategy)], out_csv)
        print(f"[sweep {strategy}] {why}: no trial run", file=sys.stderr, flush=True)
        return out_csv
    # bad input stops here, before anything is written to the stores
    from .launch import load_data
    data = load_data(configmod.replace_train(cfg, strategy=strategy))  # present, readable, of the right source
    n_train = len(data.train_y)
    del data
    for url, key in ((storage_url(cfg), "sweep.storage"), (tracking.tracking_uri(cfg), "tracking.uri")):
        check_store(url, key)  # both, before either store is created or opened
    with _creating_stores(cfg):
        storage = open_storage(cfg)  # a bad URL fails now
        tracker = tracking.Tracker(cfg)
        study, feasible, skipped = prepare_study(cfg, strategy, host, tracker, storage, n_train)
    parent_id = study.user_attrs.get("mlflow_parent_run_id")
    if parent_id and tracker.client.get_run(parent_id).info.status != "RUNNING":
        tracker.client.update_run(parent_id, status="RUNNING")
    trials_dir = configmod.repo_root() / "runs" / "trials"
    total = study.user_attrs.get("enqueued", len(feasible))
    print(f"[sweep {strategy}] study {study.study_name}: {total} trial(s) to run, {len(skipped)} point(s) "
          f"skipped on this host ({host.kind} x{host.n})", file=sys.stderr, flush=True)
    for p, why in skipped:
        print(f"  skipped {_fmt_point(p)}: {why}", file=sys.stderr)
    ran, started = 0, time.monotonic()

    def runnable(point: dict) -> bool:
        try:
            check_feasible(trial_config(cfg, strategy, point), host)
            return True
        except Infeasible:
            return False
    interrupted, fault = True, None
    try:
        while max_new_trials is None or ran < max_new_trials:
            fail_stale_trials(study)
            end_stale_mlflow_runs(study, tracker)
            trial = claim(study, runnable)
            if trial is None:
                running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                if not running:
                    left = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
                    if left:
                        print(f"[sweep {strategy}] {len(left)} waiting trial(s) need more devices than this host "
                              f"offers ({host.kind} x{host.n}): left to a larger worker", file=sys.stderr, flush=True)
                    break
                time.sleep(1.0)  # another worker (or a dead one, until its heartbeat goes stale) holds a trial
                continue
            done = _finished(study)
            eta = (time.monotonic() - started) / ran * max(total - done, 0) if ran else None
            label = f"[sweep {strategy}] trial {done + 1}/{total}"
            print(f"{label} (#{trial.number}) {_fmt_point(study._storage.get_trial_system_attrs(trial._trial_id).get('fixed_params') or {})}"
                  + (f", sweep ETA {eta:.0f} s" if eta else ""), file=sys.stderr, flush=True)
            outcome = run_one(cfg, strategy, study, trial, host, tracker, parent_id, label, trials_dir)
            print(f"{label} -> {outcome}", file=sys.stderr, flush=True)
            ran += 1
            write_csv(study, strategy, skipped, out_csv)
        interrupted = False
    except Exception as e:  # a fault: the trial (if any) is closed already; the parent run is closed below
        fault = e if isinstance(e, Stopped) else Stopped(
            f"The sweep stopped on {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}. Fix the "
            f"cause (free disk space, a writable and reachable store) and rerun the sweep: finished trials are kept.")
        raise fault from None
    finally:
        if fault is None:
            write_csv(study, strategy, skipped, out_csv)
        if not interrupted:
            _finish_parent(study, tracker, parent_id, out_csv, skipped)
        elif parent_id:  # ended unless another worker is on it; the rerun marks it RUNNING again
            _best_effort(lambda: tracker.close_run(parent_id, "FAILED" if fault else "KILLED", str(fault or ""))
                         if not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) else None)
    return out_csv


def _finished(study) -> int:
    """Trials that ran to an end: complete, pruned, or failed by themselves (a trial failed because its worker
    was interrupted or died is run again, and counted then)."""
    ended = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))
    return sum(t.state != TrialState.FAIL or "failure_kind" in t.user_attrs for t in ended)


@contextlib.contextmanager
def _creating_stores(cfg):
    """Serialise the creation of local SQLite stores: workers started together would race to create the same
    tables ("table already exists"). An RDB server shared by many machines needs the stores created once first
    (`python -m pipeline sweep --strategy S --n-trials 0`), see docs/reliability.md."""
    if not (storage_url(cfg).startswith("sqlite") or tracking.tracking_uri(cfg).startswith("sqlite")):
        yield
        return
    lock = configmod.repo_root() / "mlruns" / ".create.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file is closed, also if this process dies
        yield


def _finish_parent(study, tracker, parent_id, out_csv, skipped=()) -> None:
    left = study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING))
    if not parent_id or left:
        return
    tracker.end_stale_runs(f"tags.mlflow.parentRunId = '{parent_id}'")  # a trial run whose process died early
    tracker.log_artifact(parent_id, out_csv, "study")
    _summarise_parent(study, tracker, parent_id, list(skipped))
    try:
        complete = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
        if not complete:  # nothing to plot (e.g. a strategy this host cannot run): skip matplotlib's start-up
            return
        import matplotlib
        matplotlib.use("Agg")
        from optuna.visualization import matplotlib as ovm
        plots_dir = out_csv.parent / ".plots" / study.study_name
        plots_dir.mkdir(parents=True, exist_ok=True)
        # parameter importances need a real sample (and cost seconds): only for studies of 10+ trials
        fns = ["plot_optimization_history", "plot_slice"] + (["plot_param_importances"] if complete >= 10 else [])
        for fn in fns:
            try:
                with warnings.catch_warnings():  # few trials or one-valued params: matplotlib complains
                    warnings.simplefilter("ignore")
                    ax = getattr(ovm, fn)(study)
                fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
                fig.savefig(plots_dir / f"{fn}.png", dpi=90, bbox_inches="tight")
                matplotlib.pyplot.close(fig)
            except Exception as e:  # too few trials for importances, etc.
                (plots_dir / f"{fn}.txt").write_text(f"not drawn: {e}\n")
        tracker.log_artifacts(parent_id, plots_dir, "study/plots")
    finally:
        tracker.end_run(parent_id, "FINISHED")


def _summarise_parent(study, tracker, parent_id, skipped) -> None:
    """The study's numbers on its parent run (a collapsed row compares), or, when nothing could run here, why."""
    tracker.log_metrics(parent_id, study_view.study_metrics(study, len(skipped)))
    why = study_view.unavailable_reason(study, skipped)
    if why:
        # MLflow has no "not applicable" status: FINISHED (nothing failed) with the reason in a tag, the run's
        # description and its name, which the runs table shows collapsed
        tracker.set_tags(parent_id, {"parallax.unavailable": why, "mlflow.note.content":
                                     f"Not run on this host: every point of the space was skipped. {why}"})
        name = tracker.client.get_run(parent_id).info.run_name
        if not name.endswith("(unavailable)"):
            tracker.client.update_run(parent_id, name=f"{name} (unavailable)")
