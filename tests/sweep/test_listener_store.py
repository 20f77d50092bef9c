"""A new store is one listener class and a setting: this file's CsvListener, named in tracking.listeners, gets a
row per trial of a real sweep with no sweep code changed, beside MLflow and Optuna. A listener that stops trials
makes a study of its own (the point it stopped is measured without it); one that raises in `ended` leaves its
trial's one outcome as measured: one COMPLETE trial, one MLflow run, one table row, and a message that says so."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest
from optuna.trial import TrialState

from pipeline.errors import Stopped
from pipeline.sweep.space import Space
from pipeline.sweep.stage import load_study, run_sweep
from pipeline.tracking import client


class CsvListener:
    """One row per trial that ended, in the file $PARALLAX_TEST_CSV: its point, how it ended, its throughput."""

    def __init__(self, cfg):
        self.path, self.t = Path(os.environ["PARALLAX_TEST_CSV"]), cfg.train

    def _row(self, trial, ended: str, img_s) -> None:
        new = not self.path.exists()
        with self.path.open("a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(["strategy", "devices", "batch_size", "lr", "ended", "img_s", "mlflow_run_id"])
            w.writerow([self.t.strategy, self.t.devices, self.t.batch_size, self.t.lr, ended, img_s, trial.run_id])

    def ended(self, trial, outcome) -> None:
        if outcome.kind in ("finished", "pruned"):
            self._row(trial, outcome.kind, outcome.record["throughput_img_s"])
        elif outcome.kind == "failed":
            self._row(trial, f"failed: {outcome.error.kind}", "")


LISTENER = f"[{__name__}:CsvListener]"


def test_a_csv_listener_gets_a_row_per_sweep_trial(make_cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("PARALLAX_TEST_CSV", str(tmp_path / "trials.csv"))
    cfg = make_cfg(
        "sweep.spaces.single={devices: [1], batch_size: [64], lr: [0.1, 0.2]}",
        "data.train_limit=256",
        "data.test_limit=64",
        f"tracking.listeners={LISTENER}",
    )
    run_sweep(cfg, "single", tmp_path / "single.jsonl")
    rows = list(csv.DictReader((tmp_path / "trials.csv").open()))
    study = load_study(cfg, "single")
    by_run = {t.user_attrs["mlflow_run_id"]: t for t in study.trials}
    assert sorted(r["lr"] for r in rows) == ["0.1", "0.2"] and {r["ended"] for r in rows} == {"finished"}
    for r in rows:  # the same trial as Optuna's and MLflow's, with the record's own throughput
        t = by_run[r["mlflow_run_id"]]
        assert float(r["lr"]) == t.params["lr"] and float(r["img_s"]) > 0


def test_a_listener_that_cannot_be_loaded_stops_the_sweep_before_any_store(make_cfg, tmp_path):
    """A typo in tracking.listeners is a configuration error named before the sweep creates its stores or claims a
    trial: no Optuna or MLflow database exists after it."""
    from pipeline.config.loader import ConfigError

    cfg = make_cfg("sweep.spaces.single={devices: [1], batch_size: [64], lr: [0.1]}", "tracking.listeners=[nope:Csv]")
    with pytest.raises(ConfigError, match="tracking.listeners: 'nope:Csv' cannot be loaded"):
        run_sweep(cfg, "single", tmp_path / "single.jsonl")
    assert not list(tmp_path.rglob("*.db")) and not (tmp_path / "single.jsonl").exists()


class StopAtFirstEpoch:
    """Stops every trial at its first epoch's end."""

    def __init__(self, cfg):
        pass

    def epoch(self, trial, record) -> bool:
        return True


class StoreDown:
    """A store that refuses every trial's end."""

    def __init__(self, cfg):
        pass

    def ended(self, trial, outcome) -> None:
        if outcome.kind == "finished":
            raise RuntimeError("my store is down")


ONE_POINT = ("sweep.spaces.single={devices: [1], batch_size: [64], lr: [0.1]}", "data.train_limit=256")


def _rows(out: Path) -> list:
    import json

    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def _trial_runs(cfg) -> list:
    return [r for r in client.Tracker(cfg).find_runs("tags.strategy = 'single'") if "trial" in r.data.tags]


def test_a_point_a_stopping_listener_cut_short_is_measured_once_it_is_gone(make_cfg, tmp_path):
    limits = (*ONE_POINT, "data.test_limit=64", "train.epochs=2")
    stopping = make_cfg(*limits, f"tracking.listeners=[{__name__}:StopAtFirstEpoch]")
    run_sweep(stopping, "single", tmp_path / "stopped.jsonl")
    (cut,) = _rows(tmp_path / "stopped.jsonl")
    assert cut["state"] == "pruned", cut
    plain = make_cfg(*limits)
    assert Space(plain, "single").name != Space(stopping, "single").name
    run_sweep(plain, "single", tmp_path / "single.jsonl")
    (measured,) = _rows(tmp_path / "single.jsonl")
    assert measured["state"] == "complete" and len(measured["test_acc"]) == 2, measured


def test_a_listener_raising_in_ended_leaves_one_outcome_and_says_it(make_cfg, tmp_path):
    limits = (*ONE_POINT, "data.test_limit=64", "train.epochs=1")
    cfg = make_cfg(*limits, f"tracking.listeners=[{__name__}:StoreDown]")
    with pytest.raises(Stopped) as stopped:
        run_sweep(cfg, "single", tmp_path / "single.jsonl")
    said = " ".join(str(stopped.value).split())
    study = load_study(cfg, "single")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE], said  # not enqueued again
    assert "my store is down" in said and "(COMPLETE): that end stands" in said, said
    assert "RUNNING" not in said and "its MLflow run ended FINISHED" in said, said
    run_sweep(make_cfg(*limits), "single", tmp_path / "single.jsonl")  # the rerun, the store mended: nothing to run
    study = load_study(cfg, "single")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE]
    (row,) = _rows(tmp_path / "single.jsonl")
    (run,) = _trial_runs(cfg)
    assert row["state"] == "complete" and run.info.status == "FINISHED"
