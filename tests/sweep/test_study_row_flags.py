"""The MLflow study row counts its flagged trials (`flagged` and `study/n_flagged`), so a collapsed study whose trials
were all measured under load never reads "-" in the runs table's flagged column; it counts them by the analysis' rule
(records/table.n_flagged), so the study row and the analysis run give one number for one study."""

from __future__ import annotations

import json

import optuna
from optuna.trial import TrialState

from pipeline.analysis import stage
from pipeline.records import table
from pipeline.records.trial import TrialRecord
from pipeline.sweep import study_view
from pipeline.tracking import metric_names

BUSY = {"interfered": True, "foreign_cores": 1.5, "interference_reason": "other processes kept 1.50 cores busy"}
QUIET = {"interfered": False, "foreign_cores": 0.0, "interference_reason": ""}


def _trial(study, state, acc=0.5, **record):
    """A trial as the sweep leaves it: its record in user attribute `metrics`, its numbers (`flagged`) beside it."""
    r = TrialRecord(
        **{
            "model": "lenet",
            "strategy": "ddp",
            "devices": 1,
            "batch_size": 128,
            "per_device_batch": 128,
            "lr": 0.1,
            "epochs": 1,
            "data_source": "synthetic",
            "device_kind": "cpu",
            "host": "h",
            "host_devices": 2,
            "oversubscribed": False,
            "parallel_devices": True,
            "throughput_img_s": 1000.0,
            "epoch_s": [1.0],
            "test_acc": [acc],
            "peak_mem_bytes": [2**20],
            "mem_method": "memtracker",
            **record,
        }
    )
    t = study.ask()
    t.set_user_attr("metrics", r.to_json())
    study_view.set_trial_numbers(t, r)
    study.tell(t, acc if state == TrialState.COMPLETE else None, state=state)


def test_the_study_row_carries_its_flagged_count():
    study = optuna.create_study(direction="maximize")
    for interference in (BUSY, BUSY, QUIET):
        _trial(study, TrialState.COMPLETE, interference=interference)
    m = study_view.study_metrics(study, n_skipped=0)
    assert m["flagged"] == 2 and m["study/n_flagged"] == 2 and m["study/n_complete"] == 3
    # the study's figures are the analysis' (log_study_rows): the sweep writes none under their names
    assert not {"best_test_acc", "worst_mem_imbalance", "final_test_acc"} & set(m)


def test_n_flagged_is_one_number_on_the_study_row_and_the_analysis_run(tmp_path):
    """Flagged: a complete trial on devices of its own measured under interference. A pruned trial and an
    oversubscribed one measured under load are not, on the study row as in the analysis."""
    study = optuna.create_study(study_name="s-ddp", direction="maximize")
    _trial(study, TrialState.COMPLETE, interference=QUIET)
    _trial(study, TrialState.COMPLETE, acc=0.6, interference=BUSY)
    _trial(study, TrialState.COMPLETE, interference=BUSY, devices=4, oversubscribed=True)
    _trial(study, TrialState.PRUNED, interference=BUSY)
    row = study_view.study_metrics(study, n_skipped=0)  # the study row the sweep logs (study_parent.summarise)
    table.write_rows([table.trial_row(study, "ddp", t=t) for t in study.trials], tmp_path / "sweeps" / "ddp.jsonl")
    summary = stage.analyze(tmp_path / "sweeps", tmp_path / "analysis")
    run = metric_names.analysis_metrics(summary)  # the analysis run's metrics (tracking.log_analysis_run)
    flat = json.loads((tmp_path / "analysis" / "metrics.json").read_text())
    assert row["study/n_flagged"] == row["flagged"] == 1
    assert run["summary/n_flagged"] == flat["n_flagged"] == summary["n_flagged"] == 1
    assert summary["n_measured"] == 1 and summary["n_complete"] == 3
