"""trial.lifecycle.Trial: the moments of a trial's life reach every listener, in order, once, whatever way it ends
(finished, failed, cancelled by a listener, stopped by a fault or Ctrl-C); a listener named in tracking.listeners
hears them too. A stand-in runner plays the training: these check the lifecycle, not a trial's numbers."""

from __future__ import annotations

import pytest

from pipeline.config import loader as configmod
from pipeline.errors import TrialFailed
from pipeline.trial.lifecycle import Trial

MOMENTS = ("claimed", "started", "noted", "epoch", "ran", "flagged", "finished", "failed", "cancelled", "stopped")


class Log:
    """Writes down every moment it hears, as (moment, detail)."""

    def __init__(self, cfg=None, stop_at_epoch=None):
        self.heard, self.stop_at_epoch = [], stop_at_epoch

    def __getattr__(self, moment):
        if moment not in (*MOMENTS, "closed"):
            raise AttributeError(moment)

        def hear(trial, *args):
            self.heard.append((moment, args[0] if args and moment != "stopped" else args[-1] if args else None))
            if moment == "epoch":
                return args[0]["epoch"] == self.stop_at_epoch

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
    def run(cfg, out_dir, on_epoch=None, progress=True, timeout_s=None, label="", note=None):
        note({"slurm_job_id": "7"})
        for e in range(1, epochs + 1):
            if interrupt:
                raise KeyboardInterrupt
            if on_epoch({"epoch": e, "epochs": epochs}):
                return record(e, stopped=True)
            if fail:
                raise fail
        return record(epochs)

    return run


@pytest.fixture
def cfg(tmp_path):
    return configmod.load(None, ["profile=", "data.source=synthetic"], root=tmp_path)


def test_a_finished_trial_announces_each_moment_in_order(cfg, tmp_path):
    log = Log()
    got = Trial(cfg, tmp_path, [log], runner=runner()).run()
    assert got["test_acc"] == [0.5, 0.5]
    assert log.moments() == ["claimed", "started", "noted", "epoch", "epoch", "ran", "finished", "closed"]
    assert log.heard[2] == ("noted", {"slurm_job_id": "7"})


def test_a_flagged_trial_is_announced_flagged_before_it_finishes(cfg, tmp_path):
    log = Log()
    trial = Trial(cfg, tmp_path, [log], runner=lambda *a, **k: record(interfered=True))
    trial.run()
    assert log.moments()[-3:] == ["flagged", "finished", "closed"] and trial.flagged == "2 cores busy"


def test_a_listener_stops_the_trial_at_an_epoch_end(cfg, tmp_path):
    """Pruning: a listener returning True at epoch 1 ends the run there; every listener still hears that epoch."""
    pruner, other = Log(stop_at_epoch=1), Log()
    got = Trial(cfg, tmp_path, [pruner, other], runner=runner(epochs=3)).run()
    assert got["stopped"] is True and len(got["test_acc"]) == 1
    assert [m for m in other.moments() if m == "epoch"] == ["epoch"]


def test_a_failed_trial_is_announced_failed_then_raised(cfg, tmp_path):
    log = Log()
    with pytest.raises(TrialFailed, match="diverged at step 3"):
        Trial(cfg, tmp_path, [log], runner=runner(fail=TrialFailed("diverged at step 3", "diverged"))).run()
    assert log.moments() == ["claimed", "started", "noted", "epoch", "ran", "failed", "closed"]


def test_a_cancelled_trial_stops_and_announces_nothing_but_its_cancel(cfg, tmp_path):
    log = Log()

    class TakeOver:
        def epoch(self, trial, rec):
            trial.cancel("taken over")
            return False

    assert Trial(cfg, tmp_path, [TakeOver(), log], runner=runner(epochs=3)).run() is None
    assert log.moments() == ["claimed", "started", "noted", "epoch", "ran", "cancelled", "closed"]
    assert log.heard[-2] == ("cancelled", "taken over")


@pytest.mark.parametrize("how", ["host fault", "Ctrl-C", "store refuses the success"])
def test_a_fault_or_ctrl_c_is_announced_stopped_to_every_listener_then_raised(cfg, tmp_path, how):
    """A fault is announced `stopped` (never `failed`), to each listener even when one of them raises on it."""

    class Refuses:
        def finished(self, trial, rec):
            raise OSError("disk full")

        def stopped(self, trial, error, why, interrupted):
            raise OSError("still full")

    first, last = Log(), Log()
    run = {
        "host fault": runner(fail=TrialFailed("scontrol does not answer", "slurm_unreachable")),
        "Ctrl-C": runner(interrupt=True),
        "store refuses the success": runner(),
    }[how]
    raised = {"host fault": TrialFailed, "Ctrl-C": KeyboardInterrupt, "store refuses the success": OSError}[how]
    with pytest.raises(raised):
        Trial(cfg, tmp_path, [first, Refuses(), last], runner=run, host_faults={"slurm_unreachable"}).run()
    for log in (first, last):
        assert log.moments()[-2:] == ["stopped", "closed"] and "failed" not in log.moments()
        assert log.heard[-2][1] is (how == "Ctrl-C")  # interrupted


class Mine(Log):
    """A user's store: a Log whose class names the moments it hears (as the entry's check reads them)."""

    def finished(self, trial, rec):
        self.heard.append(("finished", rec))

    def closed(self, trial):
        self.heard.append(("closed", None))


def test_tracking_listeners_adds_a_users_listener(tmp_path):
    cfg = configmod.load(
        None, ["profile=", "data.source=synthetic", f"tracking.listeners=[{__name__}:Mine]"], root=tmp_path
    )
    trial = Trial(cfg, tmp_path, [], runner=runner())
    trial.run()
    assert trial.listeners[0].moments()[-2:] == ["finished", "closed"]


def test_a_listener_that_cannot_be_loaded_is_named(tmp_path):
    cfg = configmod.load(
        None, ["profile=", "data.source=synthetic", "tracking.listeners=[no_such_module:Store]"], root=tmp_path
    )
    with pytest.raises(configmod.ConfigError, match="tracking.listeners: 'no_such_module:Store' cannot be loaded"):
        Trial(cfg, tmp_path, [], runner=runner())


class Cancels(Log):
    """A user's store that tries to cancel the trial it hears: only the owner of the trial's queue may."""

    def epoch(self, trial, rec):
        trial.cancel("mine")


class Rewrites(Log):
    """A user's store that writes into the record and the trial it hears."""

    def finished(self, trial, rec):
        rec["throughput_img_s"] = 1e9
        trial.record["steps"] = 0


def test_a_users_listener_cannot_cancel_a_trial(tmp_path):
    """A user's listener hears the trial, read-only: its cancel is refused loudly (the trial stops, its point runs
    again), never a point dropped without a trace."""
    cfg = configmod.load(
        None, ["profile=", "data.source=synthetic", f"tracking.listeners=[{__name__}:Cancels]"], root=tmp_path
    )
    log = Log()
    trial = Trial(cfg, tmp_path, [log], runner=runner())
    with pytest.raises(
        configmod.ConfigError, match=rf"'{__name__}:Cancels' cancelled a trial .* cannot cancel a trial"
    ):
        trial.run()
    assert "cancelled" not in log.moments() and log.moments()[-2:] == ["stopped", "closed"]


def test_a_users_listener_cannot_change_the_record(tmp_path):
    cfg = configmod.load(
        None, ["profile=", "data.source=synthetic", f"tracking.listeners=[{__name__}:Rewrites]"], root=tmp_path
    )
    trial = Trial(cfg, tmp_path, [], runner=runner())
    got = trial.run()
    assert got["throughput_img_s"] == 1000.0 and got["steps"] == 10 and trial.record == got
