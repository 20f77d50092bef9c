"""Why it scales: the step-time breakdown in the sweep table, MLflow, the analysis tables, figures and report, and
the scaling model's modelled numbers beside the measured ones (hand-made rows; no timing thresholds)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from optuna.trial import TrialState

from pipeline.records.table import trial_row
from pipeline.records.trial import BD_COLUMNS, COLUMNS, TrialRecord

PARTS = ("data", "forward", "backward_compute", "comm_exposed", "optimizer", "idle")


def _bd(step, residual=0.0, **parts):
    p = dict.fromkeys(PARTS, 0.0) | parts
    return {"step_s": step, "parts_s": p, "residual_s": residual, "samples": 3, "method": {}, "ranks": []}


def test_sweep_row_and_mlflow_carry_the_breakdown():
    bd = _bd(0.1, residual=0.01, data=0.01, forward=0.02, backward_compute=0.04, comm_exposed=0.01, optimizer=0.01)
    t = SimpleNamespace(
        user_attrs={"metrics": {"breakdown": bd}},
        system_attrs={},
        state=TrialState.COMPLETE,
        params={"model": "lenet", "devices": 2, "batch_size": 256, "lr": 0.1},
        number=3,
    )
    row = trial_row(SimpleNamespace(study_name="s"), "ddp", t=t)
    assert set(BD_COLUMNS) <= set(COLUMNS)
    assert row["bd_step_s"] == 0.1 and row["bd_backward_compute_s"] == 0.04 and row["bd_residual_s"] == 0.01
    assert row["bd_samples"] == 3
    assert sum(row[f"bd_{p}_s"] for p in PARTS) + row["bd_residual_s"] == pytest.approx(row["bd_step_s"])
    m = TrialRecord(breakdown=bd).breakdown_parts()
    assert m["comm_exposed_s"] == 0.01 and m["residual_share"] == pytest.approx(0.1)
    assert sum(m[f"{p}_share"] for p in (*PARTS, "residual")) == pytest.approx(1.0)
    assert TrialRecord(breakdown=bd).metrics()["sampled_step_s"] == 0.1
    # a trial without sampled steps: empty cells, no metric
    t.user_attrs = {"metrics": {}}
    assert all(trial_row(SimpleNamespace(study_name="s"), "ddp", t=t)[c] is None for c in BD_COLUMNS)
    assert TrialRecord().breakdown_parts() == {} and "sampled_step_s" not in TrialRecord().metrics()


# ----------------------------------------------------------------------------- the analysis


def _row(strategy, k, thr, step, residual, lr=0.1, **parts):
    from .test_analyze import row

    bd = {f"bd_{p}_s": parts.get(p, 0.0) for p in PARTS}
    return row(
        strategy,
        k=k,
        B=128 * k,
        lr=lr,
        thr=thr,
        device_kind="cpu",
        host_devices=2,
        bd_step_s=step,
        bd_residual_s=residual,
        bd_samples=3,
        **bd,
    )


BASE = dict(data=0.01, forward=0.02, backward_compute=0.05, optimizer=0.01)
ROWS = [
    _row("ddp", 1, 1280.0, 0.100, 0.010, **BASE),
    # k=2: +6 ms exposed all-reduce, +3 ms idle, +1 ms residual -> loses 1 - 100/110 = 9.1% of the step
    _row("ddp", 2, 2330.0, 0.110, 0.011, comm_exposed=0.006, idle=0.003, **BASE),
    _row("fsdp", 1, 1200.0, 0.100, 0.010, **BASE),
    _row("fsdp", 2, 2000.0, 0.125, 0.010, comm_exposed=0.005, idle=0.020, **BASE),
    _row("fsdp", 2, 2000.0, 0.135, 0.010, lr=0.2, comm_exposed=0.005, idle=0.030, **BASE),
]
COLLECTIVES = {
    "host": {"hostname": "testhost"},
    "backend": "gloo",
    "measured_at": "2025-01-01T00:00:00",
    "ks": [2],
    "collectives": {
        name: {"available": True, "by_k": {"2": {"after_compute": {"fit": {"alpha_s": 50e-6, "beta_Bps": 1e9}}}}}
        for name in ("allreduce", "allgather", "reduce_scatter")
    },
}


def _frame(rows=ROWS):
    import pandas as pd

    from pipeline.analysis.tables.rows import normalize

    return normalize(pd.DataFrame(rows), "x")


def test_breakdown_table_medians_and_shares_sum_to_one():
    from pipeline.analysis.tables.step_parts import BD_ALL, breakdown_table

    bd = breakdown_table(_frame())
    ddp2 = bd[(bd["strategy"] == "ddp") & (bd["k"] == 2)].iloc[0]
    assert ddp2["step_s"] == pytest.approx(0.110) and ddp2["comm_exposed_s"] == pytest.approx(0.006)
    assert ddp2["residual_s"] == pytest.approx(0.011) and ddp2["idle_share"] == pytest.approx(0.003 / 0.110)
    fsdp2 = bd[(bd["strategy"] == "fsdp") & (bd["k"] == 2)].iloc[0]  # two trials: medians
    assert fsdp2["n_trials"] == 2 and fsdp2["step_s"] == pytest.approx(0.130)
    assert fsdp2["idle_s"] == pytest.approx(0.025)
    for r in bd.to_dict("records"):
        assert sum(r[f"{p}_share"] for p in BD_ALL) == pytest.approx(1.0)
        assert sum(r[f"{p}_s"] for p in BD_ALL) == pytest.approx(r["step_s"])


def test_the_sentence_names_the_largest_loss_first():
    from pipeline.analysis.report.why import loss_sentence
    from pipeline.analysis.tables.points import scaling_table
    from pipeline.analysis.tables.step_parts import BD_ALL, breakdown_losses, breakdown_table

    df = _frame()
    losses = breakdown_losses(breakdown_table(df), scaling_table(df))
    ddp = losses[losses["strategy"] == "ddp"].iloc[0]
    assert ddp["loss"] == pytest.approx(1 - 0.100 / 0.110)
    assert sum(ddp[f"loss_{p}"] for p in BD_ALL) == pytest.approx(ddp["loss"])
    text = loss_sentence(ddp)
    assert text.startswith(
        "ddp at k=2 (b=128) loses 9% of its step against k=1: 5% exposed all-reduce, 3% waiting for the slower rank"
    ), text
    assert "0.91" in text  # the measured efficiency from throughput, beside it
    fsdp = loss_sentence(losses[losses["strategy"] == "fsdp"].iloc[0])
    assert fsdp.split(": ")[1].startswith("19% waiting for the slower rank, 4% exposed all-gather/reduce-scatter"), fsdp


def _analyze(tmp_path, collectives):
    import json

    import pandas as pd

    from pipeline.analysis.stage import analyze

    from .test_analyze import write

    sweeps = tmp_path / "results" / "sweeps"
    sweeps.mkdir(parents=True)
    for s in ("ddp", "fsdp"):
        write([r for r in ROWS if r["strategy"] == s], sweeps / f"{s}.jsonl")
    if collectives:
        (tmp_path / "results" / "collectives.json").write_text(json.dumps(collectives))
    out = tmp_path / "out"
    analyze(sweeps, out, expected=("ddp", "fsdp"))
    return out, pd.read_csv(out / "model.csv"), (out / "report.md").read_text()


def _modelled_values_are_labelled(model, text):
    """Every modelled efficiency, as the report writes it (3 decimals), appears only on lines that say "modelled"."""
    lines = text.splitlines()
    for v in model["modelled_efficiency"]:
        shown = [ln for ln in lines if f"{v:.3f}" in ln]
        assert shown, f"modelled efficiency {v} is not in the report"
        assert all("modelled" in ln for ln in shown), [ln for ln in shown if "modelled" not in ln]


def test_report_with_the_hosts_collectives_checks_the_model_and_labels_it(tmp_path):
    out, model, text = _analyze(tmp_path, COLLECTIVES)
    for f in ("breakdown.png", "model.png", "breakdown.csv", "model.csv", "report.md"):
        assert (out / f).stat().st_size > 0, f
    assert (model["basis"] == "modelled").all()
    checks = model[model["role"] == "check"]
    assert set(checks["strategy"]) == {"ddp", "fsdp"} and set(checks["k"]) == {2}
    assert checks["rel_error"].notna().all()
    assert {4, 8} <= set(model.loc[model["role"] == "projection", "k"])
    assert "host testhost (measured" in " ".join(model["interconnect"])
    why = text.split("## Why it scales")[1]
    assert "| idle | residual |" in why
    assert "| ddp | lenet | 2 | 128 | 1 | 3 | 110 | 9.1% | 18.2% | 45.5% | 5.5% | 9.1% | 2.7% | 10.0% |" in why
    assert "ddp at k=2 (b=128) loses 9%" in why
    line = next(ln for ln in why.splitlines() if ln.startswith("- ddp at k=2") and "modelled error" in ln)
    row = checks[checks["strategy"] == "ddp"].iloc[0]
    assert f"modelled error {row['rel_error']:+.1%}" in line  # the check's own error, not a figure of the report's
    if abs(row["rel_error"]) <= row["tolerance"]:  # the verdict follows the error: within, or a named miss
        assert "within the" in line and "MISS" not in line
    else:
        assert "MISS: the model is off by" in line and "within the" not in line
    _modelled_values_are_labelled(model, text)


def test_without_the_hosts_collectives_no_error_is_printed_and_projections_say_so(tmp_path):
    out, model, text = _analyze(tmp_path, None)
    assert (model["role"] == "projection").all() and model["rel_error"].isna().all()
    assert "No measurement of this host's collectives" in text and not re.search(r"modelled error [+-]", text)
    assert "nominal interconnect profiles" in text
    _modelled_values_are_labelled(model, text)


def test_a_host_without_collectives_says_so(tmp_path):
    from pipeline.analysis.stage import read_collectives

    path = tmp_path / "collectives.json"
    path.write_text('{"measured": false, "reason": "this host offers one cpu device: no collective to time"}')
    measured, notes = read_collectives(path)
    assert measured is None and "one cpu device" in notes[0]
