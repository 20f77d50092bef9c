"""A trial's MLflow run, as every trial keeps it (trial.lifecycle.Trial told to tracking.run_listener.MlflowListener
over a tracking.trial_run.TrialRun): ended exactly once, with the status the trial's outcome calls for, and never
left RUNNING by a refused FINISHED write. A fake store records each write; a stand-in runner plays the training."""

from __future__ import annotations

import pytest

from pipeline.config.schema import Config
from pipeline.errors import TrialFailed
from pipeline.tracking.run_listener import MlflowListener
from pipeline.tracking.trial_run import TrialRun
from pipeline.trial.lifecycle import How, Trial


class FakeTracker:
    def __init__(self, refuse_finished=False):
        self.ends, self.tags, self.refuse_finished = [], {}, refuse_finished

    def start_run(self, name, tags, parent_id=None):
        return "r1"

    def log_params(self, run_id, params):
        pass

    def log_dataset(self, run_id, cfg):
        pass

    def set_tags(self, run_id, tags):
        self.tags.update(tags)

    def end_run(self, run_id, status):
        if status == "FINISHED" and self.refuse_finished:
            raise OSError("disk full")
        self.ends.append(status)


CFG = Config()


class Plan:
    def tags(self):
        return {}

    def params(self):
        return {}


@pytest.fixture(autouse=True)
def no_git(monkeypatch):
    monkeypatch.setattr("pipeline.tracking.client.git_sha", lambda: "abc")
    monkeypatch.setattr("pipeline.tracking.client.log_completed_run", lambda tracker, run_id, record, out: None)


RECORD = {"stopped": False, "throughput_img_s": 1000.0, "steps": 10, "warmup_steps": 1, "test_acc": [0.5]}


def _trial(tracker, tmp_path, runner, note=""):
    run = TrialRun(tracker, cfg=CFG, stage="sweep@ddp")
    listener = MlflowListener(run, "t", Plan(), stopped_note=note)
    return Trial(CFG, tmp_path, [listener], How(runner=runner, host_faults=frozenset({"unwritable"}))), run


def _raises(e):
    def runner(trial):
        raise e

    return runner


@pytest.mark.parametrize(
    "runner, status, failure",
    [
        (lambda trial: RECORD, "FINISHED", None),
        (lambda trial: {**RECORD, "stopped": True}, "KILLED", None),
        (_raises(KeyboardInterrupt()), "KILLED", "interrupted (KeyboardInterrupt); trial enqueued again"),
        (_raises(TrialFailed("diverged", "diverged")), "FAILED", "diverged: diverged"),
        (_raises(TrialFailed("disk full", "unwritable")), "FAILED", "unwritable: disk full; trial enqueued again"),
        (_raises(ValueError("bad")), "FAILED", "error: ValueError: bad; trial enqueued again"),
    ],
)
def test_the_trials_outcome_ends_its_run_once(tmp_path, runner, status, failure):
    """FINISHED when it finished, KILLED when pruned or interrupted, FAILED with the reason when it failed or a fault
    stopped it (with what the sweep does then); a second end writes nothing."""
    tracker = FakeTracker()
    trial, run = _trial(tracker, tmp_path, runner, note="trial enqueued again")
    trial.run()
    run.end("FAILED", "again")
    assert tracker.ends == [status] and tracker.tags.get("failure") == failure, (tracker.ends, tracker.tags)


def test_a_refused_finished_ends_the_run_failed_as_a_fault(tmp_path):
    """The store refuses FINISHED: the trial's outcome is a fault, its run ended FAILED with the refusal as reason."""
    tracker = FakeTracker(refuse_finished=True)
    trial, _ = _trial(tracker, tmp_path, lambda trial: RECORD)
    got = trial.run()
    assert got.kind == "fault" and "disk full" in got.reason
    assert tracker.ends == ["FAILED"] and "disk full" in tracker.tags["failure"]


def test_a_run_never_started_writes_nothing(tmp_path):
    """An error before the run exists (the store refused to create it) ends nothing."""

    class NoStore(FakeTracker):
        def start_run(self, name, tags, parent_id=None):
            raise RuntimeError("no store")

    tracker = NoStore()
    trial, _ = _trial(tracker, tmp_path, lambda trial: RECORD)
    assert trial.run().kind == "fault" and tracker.ends == []
