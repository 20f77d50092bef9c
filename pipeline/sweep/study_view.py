"""What the viewers show of a study: optuna-dashboard's metric name, the space's constant dimensions, plottable
per-trial numbers and a note on each trial measured under load, and the MLflow study parent run's trial counts (its
figures come from the analyze stage) or why it ran nothing.

    make dashboard        # optuna-dashboard on http://127.0.0.1:8080 over mlruns/optuna.db
"""

from __future__ import annotations

import textwrap
import warnings

import optuna
from optuna.trial import TrialState

from pipeline.records.table import n_flagged, trial_row
from pipeline.sweep.space import constants
from pipeline.tracking.metric_names import rounded

# What the sweep optimises: study.tell(trial, final test accuracy), direction maximize (sweep.worker.Worker)
OBJECTIVE = "final_test_acc"  # the trial record's name for it (records/derived.py), as in MLflow and the table
# the study's user attribute `objective`, read in optuna-dashboard beside its "Best Trial"
OBJECTIVE_TEXT = (
    "final_test_acc: one trial's final test accuracy, maximised. Optuna's Best Trial is therefore the most accurate "
    "single trial; the report's answer (results/analysis/report.md) is the fastest configuration measured, so the "
    "two differ by design. Each trial's img/s is its user attribute throughput_img_s."
)


def name_study(
    study, strategy: str, profile: str, space_hash: str, space: dict | None = None, facts: dict | None = None
) -> None:
    """Name the objective and keep what the study name encodes as user attributes (readable in the dashboard). The
    space's (choices') constant dimensions are not Optuna parameters (space.suggest), so no trial lists them: the
    study's attribute `constants` names each with its value, once (the sweep passes its space; without one the
    attribute is left as it is). `facts`: the code, data and torch its trials run on (provenance.facts), one
    attribute each, which every row of its table repeats."""
    if study.metric_names != [OBJECTIVE]:
        with warnings.catch_warnings():  # "experimental" since Optuna 3.2, still in 5.0
            warnings.simplefilter("ignore", category=optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([OBJECTIVE])
    attrs = {"strategy": strategy, "profile": profile, "space_hash": space_hash, "objective": OBJECTIVE_TEXT}
    if space is not None:
        attrs["constants"] = ", ".join(f"{k}={v}" for k, v in constants(space).items()) or "none: every one varies"
    attrs.update(facts or {})
    for k, v in attrs.items():
        if study.user_attrs.get(k) != v:
            study.set_user_attr(k, v)


def set_trial_numbers(trial, record) -> None:
    """The trial record's headline numbers as separate numeric user attributes (optuna-dashboard plots those that
    are numbers; the `metrics` attribute is one JSON object): its OPTUNA view (records/trial.py)."""
    for k, v in record.optuna_attrs().items():
        trial.set_user_attr(k, v)


def note_under_load(trial, record) -> None:
    """A trial measured under interference (its outcome flagged, trial/outcome.py) says so on its optuna-dashboard
    trial page, where otherwise only the numbers `flagged` and `foreign_cores` among its user attributes would.
    Written only where optuna-dashboard is installed (the test extra; the pipeline extra leaves it out): without it
    nothing shows a note."""
    interference = record.get("interference") or {}
    try:
        from optuna_dashboard import save_note
    except ImportError:
        return
    save_note(trial, under_load_note(interference))


# a note's line, at most (in characters of its Markdown): optuna-dashboard lays a trial page out as wide as its
# widest user attribute (the `metrics` JSON, one unwrapped line), so a paragraph runs off the screen; the note
# breaks its own lines
NOTE_WIDTH = 88


def under_load_note(interference: dict) -> str:
    """The note's Markdown: the load first, then why the trial was flagged and where else that shows, in lines of at
    most NOTE_WIDTH characters, each ending in a hard line break (a backslash)."""
    cores = interference.get("foreign_cores")
    load = f"{cores:.2f} cores busy in other processes" if cores is not None else "other processes used the host"
    what = [
        f"**Measured under load**: {load} while the trial ran.",
        "Its img/s is labelled `[under load]` in MLflow (its run's name).",
        "The report leaves it out where its point has a trial measured without load,",
        "else labels it *measured under load*.",
    ]
    why = [
        "Why it is flagged (pipeline/measure/interference.py; its MLflow tag",
        "`parallax.flagged` says the same):",
        *textwrap.wrap(f"{interference.get('interference_reason') or 'the host was busy'}.", NOTE_WIDTH - 2),
    ]
    return "\\\n".join(what) + "\n\n" + "\\\n".join(why)


def study_metrics(study, n_skipped: int) -> dict:
    """The study parent run's metrics at the sweep's end: its trial counts, `study/n_flagged` by the analysis' rule
    (records/table.n_flagged over the rows of its sweep table). Its figures (best_throughput_img_s, best_test_acc,
    worst_mem_imbalance, the efficiencies) come from the analyze stage alone (tracking.analysis_run.log_study_rows,
    metric_names.study_row_metrics): one source, one rule (flagged trials left out where quiet ones exist) for the
    study row and the report."""
    trials = study.get_trials(deepcopy=False)
    counts = {
        f"study/n_{name}": sum(t.state == st for t in trials)
        for name, st in (("complete", TrialState.COMPLETE), ("failed", TrialState.FAIL), ("pruned", TrialState.PRUNED))
    }
    flagged = n_flagged(trial_row(study, "", t=t) for t in trials)
    out = {
        **counts,
        "study/n_skipped": n_skipped,
        "study/n_flagged": flagged,
        "flagged": flagged,  # the trials' 0/1 column: on the collapsed study row, how many of its trials are flagged
    }
    return {k: v if v is None else rounded(v) for k, v in out.items()}


def unavailable_reason(study, skipped: list) -> str | None:
    """Why the study ran nothing on this host: every point was skipped (and none waits for a larger host)."""
    if not skipped or study.get_trials(deepcopy=False):
        return None
    return "; ".join(dict.fromkeys(why for _, why in skipped))
