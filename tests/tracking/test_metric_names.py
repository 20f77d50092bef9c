"""What a trial's, a study's and the analysis run's MLflow metrics are: each under the name its source gives it, the
breakdown is one table, numbers are rounded, and the analysis run carries headline numbers rather than one metric per
summary field."""

from __future__ import annotations

import pytest

from pipeline.records.trial import TrialRecord
from pipeline.tracking import metric_names

BD = {
    "samples": 3,
    "step_s": 0.1,
    "residual_s": 0.01,
    "parts_s": {
        "data": 0.01,
        "forward": 0.02,
        "backward_compute": 0.04,
        "comm_exposed": 0.01,
        "optimizer": 0.01,
        "idle": 0.0,
    },
}


def _record(**kw):
    return TrialRecord(
        throughput_img_s=1234.5678,
        test_acc=[0.5, 0.876543],
        peak_mem_bytes=[12_345_678.0],
        mem_imbalance=1.0123456,
        wall_s=3.3333333,
        breakdown=BD,
        **kw,
    )


def test_metrics_keep_the_records_names_in_name_order():
    """MLflow sorts metric keys by name; the keys are the record's own names (no mem/ or perf/ prefix, no
    breakdown/ series), and the throughputs keep theirs (the trial's and the epoch's)."""
    m = metric_names.trial_metrics(_record())
    keys = list(m)
    assert keys == sorted(keys)
    assert not any("/" in k for k in keys), keys
    assert metric_names.THROUGHPUT == "throughput_img_s" and m[metric_names.THROUGHPUT] == 1235
    curve = metric_names.epoch_metrics(
        {"train_loss": 2.0, "test_acc": 0.5, "epoch_s": 1.0, "epoch_throughput_img_s": 10.0}
    )
    assert curve == {"epoch_s": 1.0, "epoch_throughput_img_s": 10.0, "test_acc": 0.5, "train_loss": 2.0}  # own names
    assert metric_names.EPOCH_THROUGHPUT != metric_names.THROUGHPUT


def test_breakdown_is_two_metrics_and_one_table():
    """Of the 16 breakdown numbers, the step time and the exposed communication's share stay metrics; the parts
    go to one table whose shares sum to the step."""
    r = _record()
    m = metric_names.trial_metrics(r)
    assert m[metric_names.STEP_S] == 0.1 and m[metric_names.COMM_SHARE] == pytest.approx(0.1)
    t = metric_names.breakdown_table(r)
    assert set(t["part"]) == {"data", "forward", "backward_compute", "comm_exposed", "optimizer", "idle", "residual"}
    assert sum(t["share"]) == pytest.approx(1.0) and len(set(map(len, t.values()))) == 1
    assert metric_names.breakdown_table(TrialRecord()) is None  # no sampled step: no table, no metric
    assert metric_names.STEP_S not in metric_names.trial_metrics(TrialRecord(throughput_img_s=1.0))


def test_numbers_are_rounded_to_four_significant_digits():
    """1234.5678 img/s shows as 1235, an imbalance of 1.0123456 as 1.012; zero and integers stay as they are."""
    m = metric_names.trial_metrics(_record())
    assert m[metric_names.THROUGHPUT] == 1235 and m[metric_names.MEM_IMBALANCE] == 1.012 and m["wall_s"] == 3.333
    assert m[metric_names.FINAL_ACC] == 0.8765 and m["peak_mem_mib_dev0"] == m[metric_names.PEAK_MIB] == 11.77
    assert (
        metric_names.rounded(0.0) == 0.0
        and metric_names.rounded(0.000123456) == 0.0001235
        and metric_names.rounded(64) == 64
    )


def test_analysis_run_carries_counts_and_headline_numbers_only():
    """The analysis run logs the counts (measured vs flagged too) and up to four headline numbers per strategy, in
    chart sections that sort after the figures, not every number of summary.json (its figures compare the
    strategies)."""
    summary = {
        "n_trials": 4,
        "n_complete": 3,
        "n_measured": 2,
        "n_flagged": 1,
        "synthetic_data": True,
        "strategies": {
            "ddp": {
                "status": "measured",
                "best_throughput_img_s": 900.56,
                "n_complete": 3,
                "weak_efficiency": 0.812345,
                "largest_k": 2,
                "max_dev0_excess_bytes": 5,
                "best_throughput_at": {"k": 2},
                "parallel_devices": True,
            }
        },
    }
    assert metric_names.analysis_metrics(summary) == {
        "strategy/ddp/best_throughput_img_s": 900.6,
        "strategy/ddp/weak_efficiency": 0.8123,
        "summary/n_complete": 3,
        "summary/n_flagged": 1,
        "summary/n_measured": 2,
        "summary/n_trials": 4,
    }
    # chart sections in name order: the figures first, then the strategies' numbers, then the counts
    assert metric_names.FIGURES < "strategy" < "summary"


def test_mlflow_shows_each_metric_under_the_name_the_record_declares():
    """No rename between the record and MLflow: a trial's metrics are its record's METRIC view, key for key, and
    the names tracking keeps (FINAL_ACC, THROUGHPUT, STEP_S, COMM_SHARE, PEAK_MIB, MEM_IMBALANCE) are the record's."""
    r = _record()
    declared = r.metrics()
    assert list(metric_names.trial_metrics(r)) == sorted(k for k in declared)
    kept = {
        metric_names.THROUGHPUT,
        metric_names.FINAL_ACC,
        metric_names.STEP_S,
        metric_names.COMM_SHARE,
        metric_names.PEAK_MIB,
        metric_names.MEM_IMBALANCE,
    }
    assert kept <= set(declared)
    assert (
        declared[metric_names.THROUGHPUT] == r.throughput_img_s and declared[metric_names.FINAL_ACC] == r.test_acc[-1]
    )


def test_the_study_row_carries_the_summarys_and_metrics_json_names_unchanged():
    """A study row's numbers keep the names summary.json and metrics.json give them: no trial column is filled with
    another quantity (the study's best throughput is best_throughput_img_s, not throughput_img_s), no key renamed."""
    summary = {
        "strategies": {
            "ddp": {
                "best_throughput_img_s": 900.56,
                "weak_efficiency": 0.812345,
                "weak_efficiency_at": {"k": 4},
                "largest_k": 4,
                "best_test_acc": 0.87654,
                "worst_mem_imbalance": 1.0123,
                "status": "measured",
            }
        }
    }
    flat = {
        "n_trials": 6,
        "weak_efficiency.ddp.k2": 0.9,
        "weak_efficiency.ddp.k4": 0.8,
        "throughput_img_s.ddp.k4": 3000,
        "peak_mem_mib.ddp.resnet18.k2": 12.5,
        "load_cores.ddp.k2": 1.7,
        "best_test_acc.ddp": 0.88,
        "weak_efficiency.ddp_amp.k2": 0.7,
        "under_load": 1,
    }
    assert metric_names.study_row_metrics("ddp", summary, flat) == {
        "best_throughput_img_s": 900.6,
        "weak_efficiency": 0.8123,
        "largest_k": 4,
        "best_test_acc": 0.8765,
        "worst_mem_imbalance": 1.012,
        "weak_efficiency.ddp.k2": 0.9,
        "weak_efficiency.ddp.k4": 0.8,
        "throughput_img_s.ddp.k4": 3000,
        "peak_mem_mib.ddp.resnet18.k2": 12.5,
        "load_cores.ddp.k2": 1.7,
    }
    assert metric_names.study_row_metrics("ddp", {"strategies": {"ddp": {"best_throughput_img_s": 900.56}}}, {}) == {
        "best_throughput_img_s": 900.6
    }


def test_a_study_row_carries_its_best_points_peak_under_the_trials_name():
    """The runs table's peak_mem_mib column on a study row: metrics.json's peak at the k (and model) of the study's
    best throughput, the same quantity a trial row shows there, so the collapsed row is never `-` in it."""
    summary = {"strategies": {"ddp": {"best_throughput_img_s": 900.0, "best_throughput_at": {"model": "m", "k": 2}}}}
    flat = {"peak_mem_mib.ddp.k1": 10.0, "peak_mem_mib.ddp.k2": 12.5}
    assert metric_names.study_row_metrics("ddp", summary, flat)["peak_mem_mib"] == 12.5
    several = {"peak_mem_mib.ddp.m.k2": 14.0, "peak_mem_mib.ddp.n.k2": 99.0}  # the model joins the key
    assert metric_names.study_row_metrics("ddp", summary, several)["peak_mem_mib"] == 14.0
    assert "peak_mem_mib" not in metric_names.study_row_metrics("ddp", {"strategies": {"ddp": {}}}, flat)
