"""One trial's throughput has one name, `throughput_img_s`, and one value from its record to the MLflow metrics logged
for it, the analysis' metrics.json and the report; the epoch's figure has a name of its own; no table renames either;
the final accuracy and the per-epoch lists keep theirs the same way, and the study row carries summary.json's and
metrics.json's names. A one-trial study, built from a record without training: record -> Optuna attribute -> sweep
table -> analyze."""

from __future__ import annotations

import csv
import dataclasses
import json
from types import SimpleNamespace

import pytest

from pipeline.analysis import stage as A
from pipeline.records import table as T
from pipeline.records.trial import METRIC, TrialRecord, rank_keys
from pipeline.tracking import metric_names

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
    row = T.trial_row(SimpleNamespace(study_name="s-single"), "single", t=_trial(record))
    T.write_rows([row], base / "sweeps" / "single.jsonl")
    A.analyze(base / "sweeps", base / "analysis")
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
