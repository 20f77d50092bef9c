"""A new store is one listener class and a setting: this file's CsvListener, named in tracking.listeners, gets a
row per trial of a real sweep with no sweep code changed, beside MLflow and Optuna."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import optuna
import pytest

from pipeline.sweep.stage import open_storage, run_sweep, study_name


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

    def finished(self, trial, record) -> None:
        self._row(trial, "pruned" if record["stopped"] else "finished", record["throughput_img_s"])

    def failed(self, trial, error) -> None:
        self._row(trial, f"failed: {error.kind}", "")


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
    study = optuna.load_study(study_name=study_name(cfg, "single"), storage=open_storage(cfg))
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
