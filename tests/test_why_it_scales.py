"""Why it scales: the step-time breakdown in the sweep table, MLflow, the analysis tables, figures and report, and
the scaling model's modelled numbers beside the measured ones (hand-made rows; no timing thresholds)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from optuna.trial import TrialState

from pipeline.sweep_csv import BD_COLUMNS, CSV_COLUMNS, trial_row
from pipeline.tracking import final_metrics

PARTS = ("data", "forward", "backward_compute", "comm_exposed", "optimizer", "idle")


def _bd(step, residual=0.0, **parts):
    p = dict.fromkeys(PARTS, 0.0) | parts
    return {"step_s": step, "parts_s": p, "residual_s": residual, "samples": 3, "method": {}, "ranks": []}


def test_sweep_row_and_mlflow_carry_the_breakdown():
    bd = _bd(0.1, residual=0.01, data=0.01, forward=0.02, backward_compute=0.04, comm_exposed=0.01,
             optimizer=0.01)
    t = SimpleNamespace(user_attrs={"metrics": {"breakdown": bd}}, params={"model": "lenet", "devices": 2,
                        "batch_size": 256, "lr": 0.1}, state=TrialState.COMPLETE, number=3)
    row = trial_row(SimpleNamespace(study_name="s"), "ddp", t=t)
    assert set(BD_COLUMNS) <= set(CSV_COLUMNS)
    assert row["bd_step_s"] == 0.1 and row["bd_backward_compute_s"] == 0.04 and row["bd_residual_s"] == 0.01
    assert row["bd_samples"] == 3
    assert sum(row[f"bd_{p}_s"] for p in PARTS) + row["bd_residual_s"] == pytest.approx(row["bd_step_s"])
    m = final_metrics({"breakdown": bd})
    assert m["breakdown/comm_exposed_s"] == 0.01 and m["breakdown/residual_share"] == pytest.approx(0.1)
    assert sum(m[f"breakdown/{p}_share"] for p in (*PARTS, "residual")) == pytest.approx(1.0)
    # a trial without sampled steps: empty cells, no metric
    t.user_attrs = {"metrics": {}}
    assert all(trial_row(SimpleNamespace(study_name="s"), "ddp", t=t)[c] == "" for c in BD_COLUMNS)
    assert not any(k.startswith("breakdown/") for k in final_metrics({}))
