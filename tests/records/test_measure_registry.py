"""A per-trial measurement is declared once, in TrialRecord: `rank=` makes summarize fill it from the ranks' results
by its name, and the POINT view carries it into the analysis' point table and metrics.json, with no other line."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pandas as pd
import pytest

from pipeline.analysis.tables import points, summary
from pipeline.records import trial
from tests.records.test_record import _rank


@dataclasses.dataclass(frozen=True)
class WithProbe(trial.TrialRecord):
    """The record plus three declared measurements, one per way of combining the ranks."""

    probe_max_s: float | None = trial._f(trial.METRIC, trial.TABLE, trial.POINT, rank="max")
    probe_min_s: float | None = trial._f(trial.TABLE, rank="min")
    probe_main: str | None = trial._f(trial.TAG, rank="main")


def test_summarize_fills_declared_rank_measurements_by_name(make_cfg, monkeypatch):
    """A field declared with rank= is filled from every rank's result of the same name (largest, smallest, or the
    main rank's), reaches the views it declares, and a rank without it is skipped."""
    monkeypatch.setattr(trial, "TrialRecord", WithProbe)
    cfg = make_cfg("train.strategy=ddp", "train.devices=2", "train.batch_size=64")
    host = SimpleNamespace(kind="cpu", n=2, name="cpu", hostname="h", torch="t", cuda="")
    ddp = SimpleNamespace(multiprocess=True, parallel_on_cpu=True)
    ranks = [
        {**_rank(90.0), "probe_max_s": 0.5, "probe_min_s": 0.5, "probe_main": "a"},
        {**_rank(85.0, rank=1), "probe_max_s": 0.7, "probe_min_s": 0.2, "probe_main": "b"},
        _rank(80.0, rank=2),
    ]
    r = trial.summarize(cfg, host, ddp, ranks, 2.0)
    assert (r.probe_max_s, r.probe_min_s, r.probe_main) == (0.7, 0.2, "a")
    assert r.metrics()["probe_max_s"] == 0.7 and r.tags()["probe_main"] == "a"
    assert r.table_row()["probe_min_s"] == 0.2
    assert set(trial.point_columns(WithProbe)) - set(trial.point_columns()) == {"probe_max_s"}


def test_an_unknown_rank_aggregate_is_refused():
    """A declaration names one of RANK_AGGREGATES, or the record module refuses it at import."""
    with pytest.raises(ValueError, match="median"):
        trial._f(trial.TABLE, rank="median")


def test_a_point_measurement_reaches_the_point_table_and_metrics_json(monkeypatch):
    """Every column point_columns() names gets its median per point in point_table and its largest per strategy
    and k in metrics.json; a table without that column (an older one) gets neither."""
    monkeypatch.setattr(points, "point_columns", lambda: ["probe_s"])
    monkeypatch.setattr(summary, "point_columns", lambda: ["probe_s"])
    base = {
        "state": "complete",
        "oversubscribed": False,
        "interfered": False,
        "strategy": "ddp",
        "model": "lenet",
        "batch_size": 64,
        "per_device_batch": 32,
        "lr": 0.1,
        "final_test_acc": 0.5,
        "time_to_acc_s": 1.0,
        "throughput_img_s": 100.0,
        "parallel_devices": True,
    }
    rows = [{**base, "k": 2, "probe_s": v} for v in (1.0, 2.0, 6.0)] + [
        {**base, "k": 1, "probe_s": 0.5, "per_device_batch": 64}
    ]
    df = pd.DataFrame(rows)
    for c in points.EXTRAS:
        df[c] = ""
    pts = points.point_table(df)
    assert sorted(pts["probe_s"]) == [0.5, 2.0]
    empty = pd.DataFrame(columns=["strategy", "model", "k", "kind", "efficiency", "peak_mem_mib", "mem_imbalance"])
    out = summary.flat_metrics({}, pts, empty, empty)
    assert out["probe_s.ddp.k2"] == 2.0 and out["probe_s.ddp.k1"] == 0.5
    assert "probe_s" not in points.point_table(df.drop(columns="probe_s"))
