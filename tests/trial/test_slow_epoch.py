"""A slow epoch callback (a tracking server down for longer than train.timeout_s) does not lose a ddp trial: the
ranks are not left in a collective that times out while the main rank waits for the caller's verdict."""

from __future__ import annotations

import time

import pytest

from pipeline.trial.launch import run_trial

SMALL = ("train.batch_size=32", "data.train_limit=256", "data.test_limit=64")
TIMEOUT_S = 6  # train.timeout_s: the ranks' collective timeout


@pytest.mark.timeout(180)
def test_a_ddp_trial_survives_an_epoch_callback_slower_than_the_collective_timeout(make_cfg, tmp_path):
    """Epoch 1's callback takes longer than train.timeout_s; the trial still runs both epochs and completes, and
    every epoch reaches the callback."""
    seen = []

    def slow_store(record):
        seen.append(record["epoch"])
        if record["epoch"] == 1:
            time.sleep(TIMEOUT_S + 4)  # the tracking server stalls
        return False

    record = run_trial(
        make_cfg(
            "train.strategy=ddp",
            "train.devices=2",
            "train.oversubscribe=true",
            *SMALL,
            "train.epochs=2",
            f"train.timeout_s={TIMEOUT_S}",
        ),
        tmp_path / "o",
        progress=False,
        on_epoch=slow_store,
    )
    assert len(record["test_acc"]) == 2 and not record["stopped"]
    assert seen == [1, 2]


@pytest.mark.timeout(180)
def test_a_late_stop_verdict_is_taken_at_the_next_epoch(make_cfg, tmp_path):
    """A verdict that comes after the main rank stopped waiting (prune, store down) is not lost: the trial stops at
    the next epoch's end."""

    def slow_prune(record):
        if record["epoch"] == 1:
            time.sleep(TIMEOUT_S * 0.75)  # longer than the main rank waits (half of train.timeout_s)
            return True
        return False

    record = run_trial(
        make_cfg(
            "train.strategy=ddp",
            "train.devices=2",
            "train.oversubscribe=true",
            *SMALL,
            "train.epochs=4",
            f"train.timeout_s={TIMEOUT_S}",
        ),
        tmp_path / "o",
        progress=False,
        on_epoch=slow_prune,
    )
    assert record["stopped"] and len(record["test_acc"]) == 2
