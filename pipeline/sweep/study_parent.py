"""A study's MLflow parent run: opened by the worker that sets the study up, with where and how the study runs; at
the sweep's end the sweep table and Optuna's plots as its artifacts, the study's numbers as its metrics (or, when
nothing could run on this host, why), then FINISHED; stopped meanwhile (Ctrl-C, SIGTERM), KILLED, and a rerun
finishes it. Nothing is done at the end while trials are still waiting or running: the worker that ends the study
last finishes its parent run.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from optuna.trial import TrialState

from pipeline.errors import StoreError, interruption
from pipeline.records.files import free_text
from pipeline.redact import redact
from pipeline.store_faults import FAULT_TEXT, root_cause, store_fault
from pipeline.sweep import study_view
from pipeline.sweep.claims import finished
from pipeline.sweep.space import Space
from pipeline.tracking import client

PARENT = "mlflow_parent_run_id"  # the study's user attribute holding its parent run's id


def start(study, space: Space, host, tracker, storage_url: str, n_points: int) -> str:
    """Open the study's parent run, shared by every worker of the study (finish() ends it), and record its id in the
    study (PARENT); returns the id. Its tags say where and how the study runs, its params its space and settings;
    `storage_url`: the Optuna store's (sweep.storage), shown redacted."""
    cfg, strategy = space.cfg, space.strategy
    group = client.pipeline_run()  # the run name tells two pipeline runs' "study ddp" rows apart
    parent = tracker.start_run(
        f"study {strategy} · {group}",  # the strategy first: a narrow name column keeps it
        {
            client.PIPELINE_RUN_TAG: group,
            "strategy": strategy,
            "study": study.study_name,
            "profile": cfg.profile,
            "data_source": cfg.data.source,
            "synthetic": str(cfg.data.source == "synthetic").lower(),
            "device_kind": host.kind,
            "host": host.hostname,
            "dvc_stage": f"sweep@{strategy}",
            "role": "study",
            **space.facts,  # the code, data and torch its figures come from
        },
        owned=False,
    )
    tracker.log_params(
        parent,
        {
            "space": json.dumps(space.choices)[:6000],
            "settings": json.dumps(space.changed_settings(), sort_keys=True, default=str)[:6000],
            "points": n_points,
            "epochs": cfg.train.epochs,
            "storage": redact(storage_url),
        },
    )
    study.set_user_attr(PARENT, parent)
    return parent


def finish(study, tracker, parent_id, out_csv, skipped=()) -> None:
    left = study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING))
    if not parent_id or left:
        return
    status = None
    try:
        tracker.end_stale_runs(f"tags.mlflow.parentRunId = '{parent_id}'")  # a trial run whose process died early
        tracker.log_artifact(parent_id, out_csv, "study")
        summarise(study, tracker, parent_id, list(skipped))
        status = "FINISHED"  # the plots are extras: one that fails does not fail the study
        plot(study, tracker, parent_id, out_csv)
    except BaseException as e:
        if (signalled := interruption(e)) is not None:  # Ctrl-C or SIGTERM meanwhile: the rerun logs it all again
            status = None
            tracker.close_run(parent_id, "KILLED", f"{signalled} while the study's results were logged")
            raise
        if not isinstance(e, Exception):
            raise
        plots = status is not None  # the table and the study's numbers are in: only the plots are missing
        status = None
        raise StoreError(unlogged(study, tracker, parent_id, e, plots)) from None
    finally:
        if status:
            tracker.end_run(parent_id, status)


def unlogged(study, tracker, parent_id: str, e: Exception, plots: bool) -> str:
    """A fault while the study's results were logged to its parent run, after its trials ran: what ran and is
    recorded, what was not logged, where (the artifact folder and its free space, on a full disk), and that a rerun
    logs it. The parent run is ended FAILED with the reason, unless the store refuses that too."""
    fault = store_fault(e)
    cause = f"{FAULT_TEXT[fault]} ({root_cause(e)})" if fault else root_cause(e)
    if fault == "disk_full":
        folder = tracker.local_artifacts() or (Path(e.filename).parent if getattr(e, "filename", None) else None)
        cause = (
            f"its MLflow artifact folder {folder} is full ({free_text(folder)} there; {root_cause(e)})"
            if folder
            else cause
        )
    try:
        ran = f"{finished(study)} trial(s) of study {study.study_name} ran and are recorded"
    except Exception:  # the Optuna store is gone too: it says so when the rerun opens it
        ran = f"The trials of study {study.study_name} that ran are recorded"
    what = "plots" if plots else "summary artifacts (its table, numbers and plots)"
    tracker.close_run(parent_id, "FAILED", f"the study's {what} were not logged: {cause}")
    state = tracker.status(parent_id)
    ended = (
        "The parent run ended FAILED with this reason"
        if state == "FAILED"
        else f"The parent run could not be ended FAILED (the store shows {state or 'nothing it can read'})"
    )
    return (
        f"{ran}; the study's {what} were not logged to its MLflow parent run {parent_id}: {cause}. {ended}. Free "
        f"space there (or fix the store) and rerun the sweep: it runs no trial again, logs them and ends the parent "
        f"run FINISHED."
    )


def plot(study, tracker, parent_id, out_csv) -> None:
    """Optuna's plots of the study as the parent run's artifacts (study/plots)."""
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


def summarise(study, tracker, parent_id, skipped) -> None:
    """The study's numbers on its parent run (a collapsed row compares), or, when nothing could run here, why."""
    tracker.log_metrics(parent_id, study_view.study_metrics(study, len(skipped)))
    why = study_view.unavailable_reason(study, skipped)
    if why:
        # MLflow has no "not applicable" status: FINISHED (nothing failed) with the reason in a tag, the run's
        # description and its name, which the runs table shows collapsed
        tracker.set_tags(
            parent_id,
            {
                "parallax.unavailable": why,
                "mlflow.note.content": f"Not run on this host: every point of the space was skipped. {why}",
            },
        )
        name = tracker.run_name(parent_id)
        if not name.endswith("(unavailable)"):
            tracker.rename(parent_id, f"{name} (unavailable)")
