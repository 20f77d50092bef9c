"""The step-time breakdown's bookkeeping (no timing thresholds: how large each part is belongs to
benchmarks/overhead/breakdown_cost.py): every part present, timed and non-negative, parts + residual = step, no
communication
for one device, sampled steps out of the throughput window; and the interval arithmetic that charges profiled
communication to phases."""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch

from pipeline.host.devices import probe
from pipeline.measure import breakdown, comm_probes, meter
from pipeline.trial.launch import run_trial

TWO = probe().n >= 2
STEPS, EVERY, WARMUP = 16, 3, 1
CASES = [(s, k) for s in ("single", "scratch", "ddp", "fsdp") for k in (1, 2) if not (s == "single" and k == 2)]


@pytest.mark.parametrize("strategy,k", CASES)
def test_every_trial_breakdown_adds_up(make_cfg, tmp_path, monkeypatch, strategy, k):
    if k > 1 and not TWO:
        pytest.skip("needs 2 devices")
    cfg = make_cfg(
        f"train.strategy={strategy}",
        f"train.devices={k}",
        "train.batch_size=64",
        f"train.breakdown_every={EVERY}",
        f"data.train_limit={64 * STEPS}",
        "data.test_limit=128",
        f"train.warmup_steps={WARMUP}",
    )
    m = run_trial(cfg, tmp_path / "o", progress=False)
    b = m["breakdown"]
    n = len(range(EVERY - 1, STEPS - WARMUP, EVERY))  # steady-state steps WARMUP.. sampled every EVERY-th
    assert b["samples"] == n and b["every"] == EVERY
    assert m["timed_steps"] == STEPS - WARMUP - n  # sampled steps left the throughput window
    assert set(b["parts_s"]) == set(breakdown.PARTS)
    assert all(v >= 0 for v in b["parts_s"].values()), b["parts_s"]
    assert sum(b["parts_s"].values()) + b["residual_s"] == pytest.approx(b["step_s"], rel=1e-9)
    assert b["residual_s"] >= 0, b  # the loop's own Python between phases: reported, never negative
    assert all(b["parts_s"][p] > 0 for p in ("forward", "backward_compute")), b  # both phases were timed
    assert set(b["method"]) >= {*breakdown.PARTS, "residual", "step", "sampling"}
    # which steps were sampled, what they added to the epochs, and which probe path measured the communication
    assert b["sampled_steps"] == list(range(EVERY - 1, STEPS - WARMUP, EVERY))
    assert b["sampling_added_s"] == pytest.approx(n * (b["sampled_wall_s"] - b["timed_step_s"]))
    assert b["probe"]["path"] == {"fsdp": "spans", "ddp": "ddp_stats"}.get(strategy, "none")
    assert b["timed_step_s"] > 0 and b["sampled_wall_s"] >= b["step_s"]  # the wall adds the barriers and probe
    assert [r["rank"] for r in b["ranks"]] == list(range(k if strategy in ("ddp", "fsdp") else 1))
    if strategy == "single":
        assert b["parts_s"]["comm_exposed"] == 0 and b["parts_s"]["idle"] == 0
    if strategy in ("ddp", "fsdp") and k == 2:
        # a real collective ran: a probe that read nothing (stale DDP stats, no profiler spans) would give exactly 0
        assert b["parts_s"]["comm_exposed"] > 0
        assert all(r["idle_s"] >= 0 for r in b["ranks"])


# ----------------------------------------------------------------------------- the meter, on a fake clock


class FakeStrategy:
    device = torch.device("cpu")
    devices = (device,)

    def synchronize(self):
        pass


class FakeBreakdown(breakdown.Off):
    """Samples steady-state steps 1, 3, 5, ...; the sampled step itself takes 10 clock reads."""

    def __init__(self):
        self.samples = 0

    def is_sampled(self, n):
        return n >= 0 and n % 2 == 1

    @contextlib.contextmanager
    def sample(self):
        self.samples += 1
        yield breakdown.NO_CLOCK


def test_sampled_steps_leave_the_throughput_window(monkeypatch):
    clock = itertools.count()  # every clock read is one second later
    monkeypatch.setattr(meter.time, "perf_counter", lambda: float(next(clock)))
    bd = FakeBreakdown()
    m = meter.Meter(FakeStrategy(), 10, 1, target_acc=0.5, breakdown=bd)
    m.start_epoch(0)  # clock 0
    for step in range(6):
        m.tick(step)  # step 1: clock 1 (steady state starts)
        with m.sample(step) as c:  # sampled steps 2 and 4: clock reads before and after
            assert c is breakdown.NO_CLOCK
    epoch_s, throughput = m.end_epoch(6)  # clock 6
    assert bd.samples == 2
    # steady steps 1-5 over clock 1..6 (5 s) less the sampled steps' 2 x 1 s: 3 steps in 3 s
    assert throughput == 30 / 3.0 and epoch_s == 6.0
    assert m.results()["timed_steps"] == 3


def test_unsampled_steps_get_the_do_nothing_clock():
    m = meter.Meter(FakeStrategy(), 10, 1, target_acc=0.5)  # no breakdown: Off
    m.start_epoch(0)
    with m.sample(5) as c:
        assert c is breakdown.NO_CLOCK
    with c("forward"):
        pass
    assert list(c.iterate("data", [1, 2])) == [1, 2]
    assert m.results()["breakdown"] is None


# ----------------------------------------------------------------------------- the arithmetic


def test_interval_arithmetic():
    assert comm_probes.union([(5, 6), (0, 2), (1, 3)]) == [(0, 3), (5, 6)]
    assert comm_probes.subtract([(0, 10)], [(2, 3), (5, 7)]) == [(0, 2), (3, 5), (7, 10)]
    assert comm_probes.subtract([(0, 2), (4, 6)], [(1, 5)]) == [(0, 1), (5, 6)]
    assert comm_probes.subtract([(0, 2)], []) == [(0, 2)]
    assert comm_probes.overlap([(0, 2), (3, 5)], 1, 4) == 2


def test_phase_clock_times_each_phase_and_each_next():
    syncs = []
    c = breakdown.PhaseClock(lambda: syncs.append(1))
    with c("forward"):
        pass
    with c("forward"):
        pass
    assert list(c.iterate("data", iter([1, 2]))) == [1, 2]
    assert set(c.s) == {"forward", "data"} and len(syncs) == 2 * 2 + 2 * 3  # before and after each; 3 next() calls


class OneRank:
    data_shard = (0, 2)

    def __init__(self, other):
        self.other = other

    def comm_probe(self, model):
        return comm_probes.NoComm("test", whole=("reduce_gradients",))

    def gather(self, obj):
        return [obj, self.other]


def test_idle_is_the_barrier_wait_less_its_latency_and_parts_partition_the_phases():
    other = {
        "rank": 1,
        "barrier_s": [0.001, 0.004],
        "work_s": [1.0, 1.0],
        "parts": [dict.fromkeys(breakdown.PARTS, 0.0)] * 2,
    }
    b = breakdown.Breakdown(OneRank(other), None, every=2)
    b.samples = [
        {
            "work_s": 1.0,
            "barrier_s": 0.003,
            "comm": {"backward": 0.1},
            "phases": {"data": 0.1, "forward": 0.2, "backward": 0.5, "reduce_gradients": 0.05, "optimizer": 0.1},
        },
        {
            "work_s": 1.2,
            "barrier_s": 0.001,
            "comm": {"backward": 0.9},  # more than the phase: clamped
            "phases": {"data": 0.1, "forward": 0.2, "backward": 0.5, "optimizer": 0.1},
        },
    ]
    r = b.results(timed_step_s=0.9)
    # sample 1: latency = min(0.003, 0.001) = 0.001, idle 0.002; sample 2: latency 0.001, idle 0
    assert r["parts_s"]["idle"] == pytest.approx(0.001)
    assert r["step_s"] == pytest.approx((1.002 + 1.2) / 2)
    assert r["parts_s"]["comm_exposed"] == pytest.approx((0.1 + 0.05 + 0.5) / 2)
    assert r["parts_s"]["backward_compute"] == pytest.approx((0.4 + 0.0) / 2)
    assert r["residual_s"] == pytest.approx(r["step_s"] - sum(r["parts_s"].values()))
    assert r["ranks"][1]["idle_s"] == pytest.approx((0.0 + 0.003) / 2)
    assert r["timed_step_s"] == 0.9 and r["samples"] == 2
