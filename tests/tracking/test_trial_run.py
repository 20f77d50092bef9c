"""tracking.trial_run.TrialRun: a trial's MLflow run ends exactly once, with the status its block's outcome calls
for, and is never left RUNNING by a refused FINISHED write. A fake store records each write."""

from __future__ import annotations

import pytest

from pipeline.config.schema import Config
from pipeline.tracking.trial_run import TrialRun


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


def test_the_blocks_outcome_ends_the_run_once():
    """FINISHED without an error, KILLED on Ctrl-C, FAILED with the error's kind on any other error; an `end` in
    the block wins over the exit's, and a second end writes nothing."""
    for raised, status in ((None, "FINISHED"), (KeyboardInterrupt(), "KILLED"), (ValueError("bad"), "FAILED")):
        tracker = FakeTracker()
        with pytest.raises(type(raised)) if raised else _nothing():
            with TrialRun(tracker, cfg=CFG, stage="train") as run:
                run.start("t", Plan())
                if raised:
                    raise raised
        assert tracker.ends == [status]
    assert tracker.tags["failure"] == "ValueError: bad"
    tracker = FakeTracker()
    with TrialRun(tracker, cfg=CFG, stage="sweep@ddp") as run:
        run.start("t", Plan())
        run.end("KILLED", "pruned")
        run.end("FAILED", "again")
    assert tracker.ends == ["KILLED"] and tracker.tags["failure"] == "pruned"


def test_a_refused_finished_ends_the_run_failed_and_raises():
    """The store refuses FINISHED: the run is ended FAILED with the refusal as reason, and the refusal raised."""
    tracker = FakeTracker(refuse_finished=True)
    with pytest.raises(OSError, match="disk full"):
        with TrialRun(tracker, cfg=CFG, stage="train") as run:
            run.start("t", Plan())
    assert tracker.ends == ["FAILED"] and "disk full" in tracker.tags["failure"]


def test_a_run_never_started_writes_nothing():
    """An error before the run exists (the store refused to create it) ends nothing."""
    tracker = FakeTracker()
    with pytest.raises(RuntimeError):
        with TrialRun(tracker, cfg=CFG, stage="train"):
            raise RuntimeError("no store")
    assert tracker.ends == []


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
