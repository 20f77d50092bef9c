"""Two sweep workers logging the same data set at the same moment: MLflow's SQL store looks the data set up, then
inserts it, so the later insert fails on the unique key. Tracker.log_dataset tries again, finds the row and links its
run to it; any other error is raised as it is."""

from __future__ import annotations

import pytest
import sqlalchemy.exc
from mlflow.exceptions import MlflowException

from pipeline.tracking import client


def _race_then_real(real, failures: int, error=None):
    calls = []

    def log_inputs(run_id, inputs):
        calls.append(run_id)
        if len(calls) <= failures:
            try:  # as MLflow's store raises it: SQLAlchemy's error, wrapped
                raise error or sqlalchemy.exc.IntegrityError("INSERT INTO datasets", {}, Exception("UNIQUE constraint"))
            except sqlalchemy.exc.IntegrityError as e:
                raise MlflowException(f"(sqlite3.IntegrityError) {e}") from e
        return real(run_id, inputs)

    return log_inputs, calls


def test_the_later_of_two_racing_inserts_links_the_existing_data_set(make_cfg, synthetic_root, monkeypatch):
    tracker = client.Tracker(make_cfg())
    run_id = tracker.start_run("t", {})
    fake, calls = _race_then_real(tracker.client.log_inputs, failures=1)
    monkeypatch.setattr(tracker.client, "log_inputs", fake)
    tracker.log_dataset(run_id, make_cfg())
    assert len(calls) == 2
    inputs = tracker.client.get_run(run_id).inputs.dataset_inputs
    assert [d.dataset.name for d in inputs] == ["synthetic"]


def test_other_store_errors_are_not_retried(make_cfg, monkeypatch):
    tracker = client.Tracker(make_cfg())
    run_id = tracker.start_run("t", {})

    def broken(run_id, inputs):
        broken.calls += 1
        raise MlflowException("disk I/O error")

    broken.calls = 0
    monkeypatch.setattr(tracker.client, "log_inputs", broken)
    with pytest.raises(MlflowException, match="disk I/O"):
        tracker.log_dataset(run_id, make_cfg())
    assert broken.calls == 1


def test_a_race_that_never_settles_is_raised_after_three_tries(make_cfg, monkeypatch):
    tracker = client.Tracker(make_cfg())
    run_id = tracker.start_run("t", {})
    fake, calls = _race_then_real(tracker.client.log_inputs, failures=10)
    monkeypatch.setattr(tracker.client, "log_inputs", fake)
    with pytest.raises(MlflowException, match="IntegrityError"):
        tracker.log_dataset(run_id, make_cfg())
    assert len(calls) == 3
