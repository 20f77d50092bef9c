"""trial.lifecycle.Trial: a trial's life reaches every listener, in order, once (started, noted, epoch, ended), and
`run()` returns its one outcome (trial/outcome.py), whatever way it ends: finished, pruned, failed, requeued, a
fault, cancelled by its judge, interrupted; a listener named in tracking.listeners hears it too. A stand-in runner
plays the training: these check the lifecycle, not a trial's numbers."""

from __future__ import annotations

import pytest

from pipeline.config import loader
from pipeline.errors import TrialFailed
from pipeline.trial.lifecycle import How, Trial
from pipeline.trial.outcome import Requeued

MOMENTS = ("started", "noted", "epoch", "ended")


class Log:
    """Writes down every moment it hears, as (moment, detail): an epoch's number, an outcome's kind."""

    def __init__(self, cfg=None, stop_at_epoch=None):
        self.heard, self.stop_at_epoch = [], stop_at_epoch

    def __getattr__(self, moment):
        if moment not in MOMENTS:
            raise AttributeError(moment)

        def hear(trial, *args):
            detail = args[0] if args else None
            if moment == "epoch":
                self.heard.append((moment, detail["epoch"]))
                return detail["epoch"] == self.stop_at_epoch
            self.heard.append((moment, detail.kind if moment == "ended" else detail))

        return hear

    def moments(self):
        return [m for m, _ in self.heard]


def record(epochs_run=2, interfered=False, stopped=False):
    return {
        "stopped": stopped,
        "throughput_img_s": 1000.0,
        "steps": 10,
        "warmup_steps": 1,
        "test_acc": [0.5] * epochs_run,
        "interference": {"interfered": interfered, "interference_reason": "2 cores busy" if interfered else ""},
    }


def runner(epochs=2, fail=None, interrupt=False):
    def run(trial):
        trial.note({"slurm_job_id": "7"})
        for e in range(1, epochs + 1):
            if interrupt:
                raise KeyboardInterrupt
            if trial.epoch_ended({"epoch": e, "epochs": epochs}):
                return record(e, stopped=True)
            if fail:
                raise fail
        return record(epochs)

    return run


@pytest.fixture
def cfg(tmp_path):
    return loader.load(None, ["profile=", "data.source=synthetic"], root=tmp_path)


def test_a_finished_trial_announces_each_moment_in_order(cfg, tmp_path):
    log = Log()
    got = Trial(cfg, tmp_path, [log], How(runner=runner())).run()
    assert got.kind == "finished" and got.record["test_acc"] == [0.5, 0.5] and not got.flagged
    assert log.moments() == ["started", "noted", "epoch", "epoch", "ended"]
    assert log.heard[1] == ("noted", {"slurm_job_id": "7"}) and log.heard[-1] == ("ended", "finished")


def test_a_flagged_trial_finishes_flagged(cfg, tmp_path):
    got = Trial(cfg, tmp_path, [Log()], How(runner=lambda trial: record(interfered=True))).run()
    assert got.kind == "finished" and got.flagged == "2 cores busy"


def test_a_listener_stops_the_trial_at_an_epoch_end(cfg, tmp_path):
    """A listener returning True at epoch 1 ends the run there, pruned; every listener still hears that epoch."""
    pruner, other = Log(stop_at_epoch=1), Log()
    got = Trial(cfg, tmp_path, [pruner, other], How(runner=runner(epochs=3))).run()
    assert got.kind == "pruned" and got.record["stopped"] is True and len(got.record["test_acc"]) == 1
    assert [m for m in other.moments() if m == "epoch"] == ["epoch"] and other.heard[-1] == ("ended", "pruned")


def test_the_judge_stops_a_trial_and_hears_its_end(cfg, tmp_path):
    """The owner of the trial's queue judges each epoch's end (pruning), and once more after the training."""
    asked = []

    def judge(trial, rec):
        asked.append(None if rec is None else rec["epoch"])
        return rec is not None and rec["epoch"] == 2

    got = Trial(cfg, tmp_path, [], How(runner=runner(epochs=3), judge=judge)).run()
    assert got.kind == "pruned" and asked == [1, 2, None]


def test_a_failed_trial_returns_its_failure(cfg, tmp_path):
    log = Log()
    got = Trial(cfg, tmp_path, [log], How(runner=runner(fail=TrialFailed("diverged at step 3", "diverged")))).run()
    assert got.kind == "failed" and got.reason == "diverged: diverged at step 3"
    assert log.moments() == ["started", "noted", "epoch", "ended"] and log.heard[-1] == ("ended", "failed")
    with pytest.raises(TrialFailed, match="diverged at step 3"):
        got.record_or_raise()


def test_a_job_the_cluster_ended_is_requeued(cfg, tmp_path):
    got = Trial(cfg, tmp_path, [], How(runner=runner(fail=Requeued("preempted", "slurm_preempted")))).run()
    assert got.kind == "requeued" and not got.kept


def test_a_cancelled_trial_stops_and_keeps_nothing(cfg, tmp_path):
    log = Log()

    def taken_over(trial, rec):
        trial.cancel("taken over")
        return False

    got = Trial(cfg, tmp_path, [log], How(runner=runner(epochs=3), judge=taken_over)).run()
    assert got.kind == "cancelled" and got.reason == "taken over" and got.record is None
    assert log.moments() == ["started", "noted", "epoch", "ended"] and log.heard[-1] == ("ended", "cancelled")


@pytest.mark.parametrize("how", ["host fault", "Ctrl-C", "store refuses the success", "a user's store refuses"])
def test_a_fault_or_ctrl_c_is_heard_by_every_listener_and_returned(cfg, tmp_path, how):
    """A fault is an outcome of its own (never `failed`), heard by each listener even when one of them raises on it;
    a store refusing a success turns it into a fault, and where that store is a user's, the end stands."""

    class Refuses:
        def ended(self, trial, outcome):
            raise OSError("disk full")

    first, last = Log(), Log()
    run = {
        "host fault": runner(fail=TrialFailed("scontrol does not answer", "slurm_unreachable")),
        "Ctrl-C": runner(interrupt=True),
    }.get(how, runner())
    listeners = [first, last] if how == "a user's store refuses" else [first, Refuses(), last]
    trial = Trial(cfg, tmp_path, listeners, How(runner=run, host_faults=frozenset({"slurm_unreachable"})))
    if how == "a user's store refuses":
        trial.listeners.append(Refuses())  # as tracking.listeners adds it: after the sweep's own
    got = trial.run()
    kind = "interrupted" if how == "Ctrl-C" else "fault"
    assert got.kind == kind and trial.outcome is got
    raised = {"host fault": TrialFailed, "Ctrl-C": KeyboardInterrupt}.get(how, OSError)
    with pytest.raises(raised):
        got.record_or_raise()
    for log in (first, last):
        assert log.heard[-1] == ("ended", kind) and "failed" not in [d for _, d in log.heard]
    assert (got.stands is not None and got.stands.kind == "finished") is (how == "a user's store refuses")


class Mine(Log):
    """A user's store: a Log whose class names the moments it hears (as the entry's check reads them)."""

    def ended(self, trial, outcome):
        self.heard.append(("ended", outcome.kind))


def test_tracking_listeners_adds_a_users_listener(tmp_path):
    cfg = loader.load(
        None, ["profile=", "data.source=synthetic", f"tracking.listeners=[{__name__}:Mine]"], root=tmp_path
    )
    trial = Trial(cfg, tmp_path, [], How(runner=runner()))
    trial.run()
    assert trial.listeners[0].heard[-1] == ("ended", "finished")


def test_a_listener_that_cannot_be_loaded_is_named(tmp_path):
    cfg = loader.load(
        None, ["profile=", "data.source=synthetic", "tracking.listeners=[no_such_module:Store]"], root=tmp_path
    )
    with pytest.raises(loader.ConfigError, match="tracking.listeners: 'no_such_module:Store' cannot be loaded"):
        Trial(cfg, tmp_path, [], How(runner=runner()))


class Cancels(Log):
    """A user's store that tries to cancel the trial it hears: only the owner of the trial's queue may."""

    def epoch(self, trial, rec):
        trial.cancel("mine")


class Rewrites(Log):
    """A user's store that writes into the record and the trial it hears."""

    def ended(self, trial, outcome):
        outcome.record["throughput_img_s"] = 1e9
        outcome.record["steps"] = 0


def test_a_users_listener_cannot_cancel_a_trial(tmp_path):
    """A user's listener hears the trial, read-only: its cancel is refused loudly (the trial stops, its point runs
    again), never a point dropped without a trace."""
    cfg = loader.load(
        None, ["profile=", "data.source=synthetic", f"tracking.listeners=[{__name__}:Cancels]"], root=tmp_path
    )
    log = Log()
    trial = Trial(cfg, tmp_path, [log], How(runner=runner()))
    got = trial.run()
    with pytest.raises(loader.ConfigError, match=rf"'{__name__}:Cancels' cancelled a trial .* cannot cancel a trial"):
        got.record_or_raise()
    assert got.kind == "fault" and log.heard[-1] == ("ended", "fault")


def test_a_users_listener_cannot_change_the_record(tmp_path):
    cfg = loader.load(
        None, ["profile=", "data.source=synthetic", f"tracking.listeners=[{__name__}:Rewrites]"], root=tmp_path
    )
    got = Trial(cfg, tmp_path, [], How(runner=runner())).run()
    assert got.kind == "finished" and got.record["throughput_img_s"] == 1000.0 and got.record["steps"] == 10
