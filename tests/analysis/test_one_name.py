"""One trial's throughput has one name, `throughput_img_s`, and one value from its record to the MLflow metrics logged
for it, the analysis' metrics.json and the report; the epoch's figure has a name of its own; no table renames either;
the final accuracy and the per-epoch lists keep theirs the same way, and the study row carries summary.json's and
metrics.json's names. A one-trial study, built from a record without training: record -> Optuna attribute -> sweep
table -> analyze. Every metrics.json key starts with the name of the measurement it holds, never a short alias."""

from __future__ import annotations

import csv
import dataclasses
import json
import re
from types import SimpleNamespace

import pandas as pd
import pytest

from pipeline.analysis import stage
from pipeline.analysis.tables import points
from pipeline.analysis.tables.summary import flat_metrics, strategy_status, summarize
from pipeline.records.table import read_table, trial_row, write_rows
from pipeline.records.trial import METRIC, TrialRecord, rank_keys
from pipeline.tracking import metric_names
from tests.analysis.test_analyze import frame, row

NAME = "throughput_img_s"
SPEED = 1234.0  # 4 significant digits: MLflow's and metrics.json's rounding leave it as it is


def _record() -> TrialRecord:
    return TrialRecord(
        model="lenet",
        strategy="single",
        devices=1,
        batch_size=128,
        per_device_batch=128,
        lr=0.1,
        epochs=2,
        data_source="synthetic",
        device_kind="cpu",
        device_name="cpu",
        host="h",
        host_devices=1,
        oversubscribed=False,
        parallel_devices=True,
        throughput_img_s=SPEED,
        throughput_windows=[SPEED, SPEED],
        epoch_s=[1.0, 1.0],
        test_acc=[0.5, 0.75],
        epoch_throughput_img_s=[1200.0, 1250.0],
        peak_mem_bytes=[100 * 2**20],
        mem_method="memtracker",
        wall_s=3.0,
    )


def _trial(record: TrialRecord):
    """An Optuna trial as the sweep leaves it: the record in user attribute `metrics`, its point enqueued."""
    point = {k: getattr(record, k) for k in ("model", "devices", "batch_size", "lr")}
    return SimpleNamespace(
        user_attrs={"metrics": record.to_json(), "mlflow_run_id": "r1"},
        system_attrs={"fixed_params": point},
        params={},
        state=SimpleNamespace(name="COMPLETE"),
        number=0,
    )


def _report_cells(report: str, section: str, column: str) -> list[str]:
    """The `column` cells of the first table under `## section` in report.md."""
    lines = report.split(f"## {section}\n", 1)[1].splitlines()
    table = lines[next(i for i, ln in enumerate(lines) if ln.startswith("|")) :]
    table = table[: next((i for i, ln in enumerate(table) if not ln.startswith("|")), len(table))]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    return [[c.strip() for c in row.strip("|").split("|")][header.index(column)] for row in table[2:]]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    base = tmp_path_factory.mktemp("one_name")
    record = _record()
    row = trial_row(SimpleNamespace(study_name="s-single"), "single", t=_trial(record))
    write_rows([row], base / "sweeps" / "single.jsonl")
    stage.analyze(base / "sweeps", base / "analysis")
    return record, base / "analysis"


def test_a_trials_throughput_has_one_name_and_one_value_in_mlflow_metrics_json_and_the_report(study):
    record, out = study
    assert record[NAME] == SPEED and record.to_json()[NAME] == SPEED  # the record's key (the trial's metrics.json)
    logged = metric_names.trial_metrics(record)  # what the trial's MLflow run logs (tracking.log_completed_run)
    assert metric_names.THROUGHPUT == NAME and logged[NAME] == SPEED
    assert record.optuna_attrs()[NAME] == SPEED and record.table_row()[NAME] == SPEED
    flat = json.loads((out / "metrics.json").read_text())  # the analysis' metrics.json (`dvc metrics show`)
    assert flat[f"{NAME}.single.k1"] == SPEED
    assert not any(k.startswith(("img_s.", "img_s/")) for k in flat)
    report = (out / "report.md").read_text()
    (cell,) = _report_cells(report, "Throughput per point", NAME)  # the column's header is the name
    assert float(cell.replace(",", "")) == SPEED
    # the study row's throughput: the analysis' figures under summary.json's and metrics.json's names, never the
    # trials' column (a study's best is another quantity than a trial's)
    summary = json.loads((out / "summary.json").read_text())
    row = metric_names.study_row_metrics("single", summary, flat)
    assert row["best_throughput_img_s"] == row[f"{NAME}.single.k1"] == SPEED and NAME not in row


def test_the_final_accuracy_and_the_per_epoch_lists_keep_their_names(study):
    """final_test_acc is the last test_acc in every view and in the analysis; test_acc, epoch_s and train_loss are
    the per-epoch lists in the record, the sweep table and MLflow's curves; wall_s is wall_s everywhere."""
    record, out = study
    final = record.test_acc[-1]
    row = record.table_row()
    assert record.metrics()["final_test_acc"] == record.optuna_attrs()["final_test_acc"] == final
    assert row["final_test_acc"] == final and row["test_acc"] == record.test_acc and row["epoch_s"] == record.epoch_s
    assert row["wall_s"] == record.metrics()["wall_s"] == record.wall_s
    assert row["mean_epoch_s"] == record.optuna_attrs()["mean_epoch_s"] == 1.0
    assert set(metric_names.CURVES) >= {"test_acc", "epoch_s", "train_loss"}
    with open(out / "accuracy.csv") as f:
        (acc,) = list(csv.DictReader(f))
    assert float(acc["final_test_acc"]) == final and "test_acc" not in acc
    summary = json.loads((out / "summary.json").read_text())
    assert summary["strategies"]["single"]["best_test_acc"] == final


def test_the_epochs_figure_has_a_name_of_its_own():
    record = _record()
    curve = metric_names.epoch_metrics({"epoch": 2, metric_names.EPOCH_THROUGHPUT: 1250.0, "test_acc": 0.75})
    assert curve[metric_names.EPOCH_THROUGHPUT] == record.epoch_throughput_img_s[-1] and NAME not in curve
    assert metric_names.EPOCH_THROUGHPUT == "epoch_throughput_img_s" != NAME
    assert metric_names.EPOCH_THROUGHPUT not in metric_names.trial_metrics(record)


def test_no_view_renames_the_throughput_and_every_rank_reports_it():
    """The record declares no other key for it in any view, and the ranks' parts the loop gathers carry it by
    its own name (the record takes the slowest rank's)."""
    (f,) = [f for f in dataclasses.fields(TrialRecord) if f.name == NAME]
    assert METRIC in f.metadata["views"] and "keys" not in f.metadata and f.metadata["rank"] == "min"
    assert NAME in rank_keys()


def invented_keys(flat: dict, tables: dict, summary: dict) -> list[str]:
    """The keys of a metrics.json (`flat`) whose name is not the name of the measurement they hold. A key is a count
    (a summary.json count or the points table's `under_load`, summed) or summary.json's own name and value (its
    `data_source`), `<name>.<strategy>` with <name> summary.json's
    name for a strategy's figure and its value, or `<name>.<strategy>[.<model>].kK` with <name> either a column of a
    table it was computed from (`tables`: name -> frame), holding that column's value at that strategy, model and k,
    or summary.json's name for that figure (its value where summary.json's `<name>_at` is that point)."""
    strategies = summary.get("strategies") or {}
    ok_none = object()  # no summary.json value is this
    per_strategy = {n for st in strategies.values() for n in st}
    columns = {c for t in tables.values() for c in t.columns}
    bad = []
    for key, v in flat.items():
        name, *rest = key.split(".")
        if not rest:
            ok = (isinstance(v, int) and (name in summary or name in columns)) or summary.get(name, ok_none) == v
        elif len(rest) == 1:
            st = strategies.get(rest[0]) or {}
            ok = name in st and v == pytest.approx(st[name], rel=5e-3)
        elif re.fullmatch(r"k\d+", rest[-1]) and len(rest) in (2, 3):
            s, k = rest[0], int(rest[-1][1:])
            at = [
                t.loc[(t["strategy"] == s) & (t["k"] == k) & (t["model"] == rest[1] if len(rest) == 3 else True), name]
                for t in tables.values()
                if name in t
            ]
            held = [float(x) for col in at for x in pd.to_numeric(col, errors="coerce").dropna()]
            if at:
                ok = any(v == pytest.approx(x, rel=5e-3) for x in held)
            else:  # summary.json's name: where summary.json gives that figure (<name>_at), the same value
                st, where = strategies.get(s) or {}, (strategies.get(s) or {}).get(f"{name}_at") or {}
                same = where.get("k") == k and (len(rest) == 2 or where.get("model") == rest[1])
                ok = name in per_strategy and (not same or v == pytest.approx(st[name], rel=5e-3))
        else:
            ok = False
        if not ok:
            bad.append(key)
    return bad


def _flat_of_a_small_study():
    """metrics.json of two strategies, two models and a point measured only under load, with its tables."""
    busy = {"interfered": True, "foreign_cores": 1.7, "interference_reason": "other processes kept 1.70 cores busy"}
    df = frame(
        [
            row("single", k=1, B=128, thr=1000.0, acc=0.79),
            row("ddp", k=1, B=128, thr=1000.0, acc=0.8),  # k=2's weak reference (b=128)
            row("ddp", k=1, B=256, thr=1100.0, acc=0.8),  # k=2's strong reference (B=256)
            row("ddp", k=2, B=256, thr=1600.0, acc=0.81, **busy),  # measured under load only
            row("ddp", k=1, B=128, thr=300.0, acc=0.7, model="resnet18", peaks=[300 * 2**20]),
        ]
    )
    pts, eff, mem = points.point_table(df), points.scaling_table(df), points.memory_table(df)
    status = strategy_status(df, {}, "x", ["single", "ddp"])
    summ = summarize(df, status, pts, eff, mem, None)
    tables = {"points": pts, "efficiency": eff, "memory": mem, "memory per device": points.memory_devices(mem)}
    return flat_metrics(summ, pts, eff, mem), tables, summ


def test_every_metrics_json_key_is_the_name_of_the_measurement_it_holds():
    """No key of metrics.json invents a name: each starts with the column of the table its figure is read from (at
    that strategy, model and k) or summary.json's name for it, so `eff`, `acc`, `peak_mib` or `under_load` holding
    the cores busy elsewhere cannot come back."""
    flat, tables, summ = _flat_of_a_small_study()
    assert {"weak_efficiency.ddp.lenet.k2", "strong_efficiency.ddp.lenet.k2", "load_cores.ddp.lenet.k2"} <= set(flat)
    assert {"peak_mem_mib.ddp.resnet18.k1", "final_test_acc.single.lenet.k1", "best_test_acc.ddp"} <= set(flat)
    assert invented_keys(flat, tables, summ) == []
    old = {"eff.ddp.lenet.k2": 0.8, "peak_mib.ddp.lenet.k1": 100.0, "acc.ddp": 0.82, "under_load.ddp.lenet.k2": 1.7}
    assert invented_keys({**flat, **old}, tables, summ) == list(old)


PEAK = "peak_mem_mib"  # the largest device's peak in MiB; per device: peak_mem_bytes, peak_mem_mib_dev
OTHER_PEAK_NAMES = {"peaks", "peak_mem_max", "peak_max", "peak_max_mib", "peak_mib", "measured_mib", "per_device_mib"}


def _report_header(report: str, section: str) -> list[str]:
    """The header cells of the first table under `section` (a `## ` or `### ` heading) in report.md."""
    lines = report.split(section, 1)[1].splitlines()
    return [c.strip() for c in next(ln for ln in lines if ln.startswith("|")).strip("|").split("|")]


def test_the_largest_devices_peak_has_one_name_in_every_store(study):
    """peak_mem_mib from the record to the sweep table, MLflow (the trial run, the study row the analysis writes, the
    analysis run), metrics.json, memory.csv and the report's memory tables; no store has another name for it."""
    record, out = study
    mib = record.peak_mem_bytes[0] / 2**20
    views = {"metrics": record.metrics(), "optuna": record.optuna_attrs(), "table": record.table_row()}
    assert all(v[PEAK] == mib for v in views.values()) and metric_names.PEAK_MIB == PEAK
    assert metric_names.trial_metrics(record)[PEAK] == mib  # the trial's MLflow run
    (row,) = read_table(out.parent / "sweeps" / "single.jsonl").to_dict("records")
    assert row[PEAK] == mib and row["peak_mem_bytes"] == record.peak_mem_bytes
    with open(out / "memory.csv") as f:
        (dev,) = list(csv.DictReader(f))
    assert float(dev[PEAK]) == float(dev["peak_mem_mib_dev"]) == mib and int(dev["peak_mem_bytes"]) == 100 * 2**20
    flat = json.loads((out / "metrics.json").read_text())
    assert flat[f"{PEAK}.single.k1"] == mib
    summary = json.loads((out / "summary.json").read_text())
    study_row = metric_names.study_row_metrics("single", summary, flat)  # what the analysis writes on the study row
    assert study_row[f"{PEAK}.single.k1"] == mib
    report = (out / "report.md").read_text()
    assert float(_report_cells(report, "Memory per device", PEAK)[0]) == mib
    memory_tables = [_report_header(report, h) for h in ("## Memory per device", "### Memory: measured beside")]
    assert all(PEAK in header for header in memory_tables)
    names = {
        *(k for v in views.values() for k in v),
        *row,
        *dev,
        *(k.split(".")[0] for k in flat),
        *study_row,
        *metric_names.analysis_metrics(summary),  # the analysis run's
        *(c for header in memory_tables for c in header),
    }
    assert not names & OTHER_PEAK_NAMES
