"""The meter's bookkeeping on a fake clock: which steps are timed, per-epoch and overall throughput, time to accuracy,
and the memory probe that runs around step 0 on CPU only (a no-op elsewhere)."""

from __future__ import annotations

import contextlib
import itertools

import torch

from pipeline.measure import meter


class FakeStrategy:
    device = torch.device("cpu")
    devices = (device,)

    def __init__(self):
        self.syncs, self.trackers = 0, []

    def synchronize(self):
        self.syncs += 1

    def memory_tracker(self, model, optimizer):
        tracker = FakeTracker()
        self.trackers.append(tracker)
        return tracker


class FakeTracker(contextlib.nullcontext):
    def peaks(self):
        return [123]


def run(monkeypatch, epochs, steps, warmup, accs, batch=10):
    clock = itertools.count()  # every clock read is one second later
    monkeypatch.setattr(meter.time, "perf_counter", lambda: float(next(clock)))
    strategy = FakeStrategy()
    m = meter.Meter(strategy, batch, warmup, target_acc=0.5)
    step, per_epoch, probes = 0, [], []
    for epoch in range(epochs):
        m.start_epoch(step)
        for _ in range(steps):
            m.tick(step)
            probes.append(m.probe(step, None, None))
            step += 1
        per_epoch.append(m.end_epoch(step))
        m.note_accuracy(accs[epoch])
    return m.results(), per_epoch, probes, strategy


def test_warm_up_spanning_an_epoch_is_not_timed(monkeypatch):
    res, per_epoch, _, _ = run(monkeypatch, epochs=3, steps=2, warmup=3, accs=[0.1, 0.6, 0.9])
    # epoch 1: steps 0-1, all warm-up: no throughput; clock reads t0=0, end=1
    assert per_epoch[0] == (1.0, None)
    # epoch 2: steps 2-3, step 3 timed from its tick (clock 3) to the end (clock 4)
    assert per_epoch[1] == (2.0, 10 / 1.0)
    # epoch 3: steps 4-5, both timed from the epoch's start (clock 5) to its end (clock 6)
    assert per_epoch[2] == (1.0, 20 / 1.0)
    assert res["timed_steps"] == 3 and res["throughput_img_s"] == 30 / 2.0
    # the cold start: epoch 1 whole (clock 0..1) and epoch 2 up to its steady start (clock 2..3)
    assert res["startup_s"] == 2.0
    assert res["epoch_s"] == [1.0, 2.0, 1.0] and res["epoch_throughput_img_s"] == [None, 10.0, 20.0]
    assert res["time_to_acc_s"] == 3.0  # reached after epoch 2: training seconds of epochs 1 and 2


def test_no_timed_step_means_no_throughput(monkeypatch):
    res, _, _, _ = run(monkeypatch, epochs=1, steps=2, warmup=5, accs=[0.1])
    assert res["throughput_img_s"] is None and res["timed_steps"] == 0 and res["time_to_acc_s"] is None


def test_warm_up_of_zero_still_leaves_the_probe_step_untimed(monkeypatch):
    res, _, _, _ = run(monkeypatch, epochs=1, steps=4, warmup=0, accs=[0.1])
    assert res["timed_steps"] == 3


def test_cpu_memory_is_probed_around_step_zero_only(monkeypatch):
    res, _, probes, strategy = run(monkeypatch, epochs=2, steps=2, warmup=1, accs=[0.1, 0.1])
    assert len(strategy.trackers) == 1 and probes[0] is strategy.trackers[0]
    assert all(isinstance(p, contextlib.nullcontext) and not isinstance(p, FakeTracker) for p in probes[1:])
    assert res["peak_mem_bytes"] == [123] and res["mem_method"] == "memtracker"


class EveryThird:
    """A breakdown that samples steady-state steps 2, 5, 8, ... (its own clock: a do-nothing one)."""

    trace = None  # no Chrome trace of a sampled step

    def is_sampled(self, n):
        return n >= 0 and n % 3 == 2

    def sample(self):
        return contextlib.nullcontext(meter.NO_CLOCK)

    def results(self, *_):
        return None


def windows(monkeypatch, epochs, steps, warmup, window_steps, breakdown=None, batch=10):
    clock = itertools.count()  # every clock read is one second later; steps themselves take no time
    monkeypatch.setattr(meter.time, "perf_counter", lambda: float(next(clock)))
    m = meter.Meter(FakeStrategy(), batch, warmup, 0.5, breakdown, window_steps=window_steps)
    step = 0
    for _ in range(epochs):
        m.start_epoch(step)
        for _ in range(steps):
            m.tick(step)
            with m.sample(step):
                step += 1
        m.end_epoch(step)
    return m.results()["throughput_windows"]


def test_windows_hold_fixed_step_counts_and_drop_a_short_tail(monkeypatch):
    # steps 1-10 and 11-20 are windows (one clock read apart each); the tail 21-24 (4 < half of 10) is not one
    assert windows(monkeypatch, 1, 25, 1, 10) == [100.0, 100.0]
    # a tail of 5 steps (half a window) is one, over its own second
    assert windows(monkeypatch, 1, 26, 1, 10) == [100.0, 100.0, 50.0]


def test_a_window_never_spans_an_epoch_end(monkeypatch):
    # epoch 1: steps 1-10, tail 11-14 dropped; epoch 2 opens a new window at its start: steps 15-24, tail 25-29
    assert windows(monkeypatch, 2, 15, 1, 10) == [100.0, 100.0, 50.0]


def test_sampled_steps_stay_out_of_windows(monkeypatch):
    # window 1: steps 1, 2, 4, 5 (3 is sampled, its 1 s left out): 40 images over 2 s; window 2: steps 7, 8, 10
    # (6 and 9 sampled) over 3 s. A window counts unsampled steps only.
    assert windows(monkeypatch, 1, 11, 1, 4, EveryThird()) == [20.0, 10.0]


def test_no_window_during_warm_up(monkeypatch):
    assert windows(monkeypatch, 1, 4, 5, 2) == []


def test_memory_window_opens_at_each_tick_and_closes_at_evaluation(monkeypatch):
    """Meter.tick() (re)opens the memory window before a step's data; evaluation() closes it before the evaluation
    (the order a GPU run relies on; tests/measure/test_memory_contract.py checks it inside train()). On CPU both do
    nothing
    and the GPU-only figures are None."""
    calls = []
    m = meter.Meter(FakeStrategy(), 10, 1, 0.5)
    assert m.memory.figures() == dict.fromkeys(
        ("mem_workspace_bytes", "mem_resident_bytes", "mem_reserved_peak_bytes", "mem_nvml_used_bytes")
    )
    monkeypatch.setattr(m.memory, "open", lambda steady: calls.append(("open", steady)))
    monkeypatch.setattr(m.memory, "close", lambda: calls.append("close"))
    m.start_epoch(0)
    m.tick(0)
    with m.evaluation():
        calls.append("evaluate")
    m.tick(1)
    assert calls == [("open", False), "close", "evaluate", ("open", True)], "step 0 is warm-up, step 1 steady"


def test_an_untimed_run_names_the_step_limit_that_ended_it():
    """All steps warm-up: where train.max_steps stopped the run, the advice is to raise it, not the data's limit;
    where the data ended it, to raise data.train_limit."""
    capped = {"throughput_img_s": None, "steps": 2, "warmup_steps": 3, "max_steps": 2}
    assert meter.untimed(capped).endswith(
        "(the first 3 are never timed, train.warmup_steps; train.max_steps=2 ended the run there); raise "
        "train.max_steps above 3 or lower train.warmup_steps"
    )
    assert "data.train_limit" not in meter.untimed(capped)
    for by_data in ({**capped, "max_steps": 0}, {**capped, "max_steps": 50}):
        assert meter.untimed(by_data).endswith("raise data.train_limit or lower train.warmup_steps"), by_data
