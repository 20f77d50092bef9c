"""pipeline/scaling/collectives.py: the (alpha, beta) fit on synthetic timings, the trials' message sizes, and one real
measurement at k=2 on this host (its keys, not its timings)."""

from __future__ import annotations

import json
import random

import pytest

from pipeline.host.devices import probe
from pipeline.scaling import collectives, model


def synthetic(collective, k, alpha, beta, sizes, noise=0.0, seed=0):
    rng = random.Random(seed)
    f = model.BUS_FACTOR[collective](k)
    return [{"bytes": s, "median_s": (alpha + f * s / beta) * (1 + rng.uniform(-noise, noise))} for s in sizes]


@pytest.mark.parametrize(
    "collective,k",
    [("allreduce", 2), ("allreduce", 8), ("allgather", 4), ("reduce_scatter", 2), ("scratch_allreduce", 3)],
)
def test_fit_recovers_alpha_and_beta(collective, k):
    pts = synthetic(collective, k, 50e-6, 3e9, collectives.FIT_BYTES)
    f = collectives.fit(pts, collective, k)
    assert f["alpha_s"] == pytest.approx(50e-6, rel=1e-6) and f["beta_Bps"] == pytest.approx(3e9, rel=1e-6)
    assert f["rel_rms"] < 1e-9 and f["n_sizes"] == len(collectives.FIT_BYTES)


def test_fit_with_noise_stays_close():
    f = collectives.fit(synthetic("allreduce", 2, 200e-6, 1e9, collectives.FIT_BYTES, noise=0.05), "allreduce", 2)
    assert f["alpha_s"] == pytest.approx(200e-6, rel=0.2) and f["beta_Bps"] == pytest.approx(1e9, rel=0.2)


def test_fit_never_returns_negative_latency_or_bandwidth():
    pts = [{"bytes": s, "median_s": 1e-3 * (s / 1e6) ** 2} for s in (1e5, 1e6, 1e7)]  # superlinear: alpha < 0
    f = collectives.fit(pts, "allreduce", 2)
    assert f["alpha_s"] >= 0 and f["beta_Bps"] > 0 and "clamped" in f["method"]
    flat = collectives.fit([{"bytes": s, "median_s": 1e-3} for s in (1e3, 1e6)], "allreduce", 2)
    assert flat["beta_Bps"] is None and flat["alpha_s"] == pytest.approx(1e-3)


def test_lenet_trial_sizes():
    s = collectives.trial_sizes("lenet", 2, 25.0)
    assert s["allreduce"] == s["allreduce_shm"] == [129_068 * 4]  # one DDP bucket
    assert s["allgather"] == s["reduce_scatter"] == [800, 5160, 100200, 410112]  # FSDP's four units
    assert sum(s["scratch_allreduce"]) <= 129_068 * 4 and len(s["scratch_allreduce"]) <= 8


@pytest.mark.slow
@pytest.mark.skipif(probe().n < 2, reason="needs two devices (cores or GPUs)")
def test_the_stage_measures_k2_with_its_settings_and_writes_the_documented_keys(tmp_path):
    """`python -m pipeline collectives` with params' `collectives` settings (here: --set): each point timed `reps`
    times after `warmup`, the fit's sizes `fit_sizes` powers of 4 from 4 KiB beside the trials' own; the keys
    the scaling model reads."""
    from pipeline.cli.commands import main

    out = tmp_path / "collectives.json"
    sets = ["collectives.reps=3", "collectives.warmup=1", "collectives.gap_s=0.002", "collectives.fit_sizes=2"]
    assert main(["collectives", "--out", str(out), *(a for s in sets for a in ("--set", s))]) == 0
    r = json.loads(out.read_text())
    assert r["settings"]["reps"] == 3 and r["settings"]["warmup"] == 1 and r["settings"]["gap_s"] == 0.002
    assert r["settings"]["fit_bytes"] == [4096, 16384]
    points = [p for c in r["collectives"].values() for m in c["by_k"].get("2", {}).values() for p in m["points"]]
    assert points and all(p["n"] == 3 for p in points)
    assert {4096, 16384} <= {p["bytes"] for p in points} and any(p["in_trial"] for p in points)
    assert r["measured"] is True and r["ks"] == [2] and r["backend"] in ("gloo", "nccl")
    assert {"host", "model", "param_bytes", "settings", "collectives", "wall_s", "measured_at"} <= set(r)
    assert set(r["collectives"]) == set(collectives.ISSUED_BY)
    for name, c in r["collectives"].items():
        assert {"available", "reason", "issued_by", "bus_factor", "by_k"} <= set(c)
        if not c["available"]:
            assert c["reason"] and not c["by_k"]
            continue
        for mode in collectives.MODES:
            m = c["by_k"]["2"][mode]
            assert {"alpha_s", "beta_Bps", "rel_rms", "n_sizes", "method"} <= set(m["fit"])
            assert all(
                {"bytes", "in_trial", "median_s", "min_s", "max_s", "p90_s", "n", "busbw_Bps"} <= set(p)
                for p in m["points"]
            )
            assert any(p["in_trial"] for p in m["points"])
    assert r["collectives"]["allreduce"]["available"] and r["collectives"]["allgather"]["available"]
    if r["backend"] == "gloo":
        assert not r["collectives"]["dp_copy"]["available"] and "CUDA" in r["collectives"]["dp_copy"]["reason"]
    ic = model.from_collectives(r)
    assert ic.kind == "measured" and "allreduce" in ic.links


# ----------------------------------------------------------------------------- structure of the timing (GPU-free)


def _record(log_dir, kind, name, t0, t1):
    import os

    with open(log_dir / f"{os.getpid()}.log", "a") as f:
        f.write(f"{kind} {os.environ.get('RANK', '?')} {name} {t0!r} {t1!r}\n")


@pytest.mark.skipif(probe().n < 2, reason="needs two CPU cores for two Gloo ranks")
def test_no_other_rank_is_inside_a_collective_while_rank0_times_the_in_process_ops(tmp_path, monkeypatch):
    """While rank 0 times the in-process ops (scratch_allreduce; dp_copy and dp_scatter on GPUs), ranks 1..k-1 are
    inside no torch.distributed call. On NCCL such a call is a kernel spinning on the very GPUs that rank 0's
    broadcast and scatter use, so they would be timed against another process's resident kernel.

    Two forked Gloo ranks, with every torch.distributed collective and every in-process op wrapped to log its
    (CLOCK_MONOTONIC) interval; no logged collective interval of rank 1 may intersect one of rank 0's in-process
    op intervals. Structural only: how much a spinning NCCL kernel slows the copies needs GPUs."""
    import time

    import torch.distributed as dist

    for name in (
        "barrier",
        "monitored_barrier",
        "all_reduce",
        "broadcast",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_single",
        "reduce_scatter_tensor",
        "reduce_scatter_single",
        "all_gather_object",
    ):
        if hasattr(dist, name):

            def wrapped(*a, _f=getattr(dist, name), _n=name, **kw):
                t0 = time.monotonic()
                try:
                    return _f(*a, **kw)
                finally:
                    _record(tmp_path, "coll", _n, t0, time.monotonic())

            monkeypatch.setattr(dist, name, wrapped)
    local_op = collectives._local_op

    def logged_local_op(name, *a, **kw):
        fn = local_op(name, *a, **kw)

        def run():
            t0 = time.monotonic()
            fn()
            _record(tmp_path, "local", name, t0, time.monotonic())

        return run

    monkeypatch.setattr(collectives, "_local_op", logged_local_op)
    plan = {
        "backend": "gloo",
        "device_kind": "cpu",
        "sizes": {"allreduce": [4096], "scratch_allreduce": [4096]},
        "reps": 2,
        "warmup": 1,
        "gap_s": 0.0,
        "modes": ["back_to_back"],
        "timeout_s": 60,
        "ops_per_sync": 1,
    }
    ranks = collectives._launch(2, plan, "fork")  # fork: the ranks inherit the wrappers
    assert "scratch_allreduce" in ranks[0]["times"]
    rows = [line.split() for p in tmp_path.glob("*.log") for line in p.read_text().splitlines()]
    local = [(float(t0), float(t1)) for kind, rank, _, t0, t1 in rows if kind == "local" and rank == "0"]
    others = [(name, float(t0), float(t1)) for kind, rank, name, t0, t1 in rows if kind == "coll" and rank != "0"]
    assert local and others  # both were logged
    inside = [(name, c0, c1) for name, c0, c1 in others if any(c0 < l1 and l0 < c1 for l0, l1 in local)]
    assert not inside, f"rank 1 was inside {inside[0][0]} while rank 0 timed its in-process ops"


class _Clock:
    """perf_counter that advances one second per timed op, so a repeat's recorded time is its per-op time."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


@pytest.mark.parametrize("n", [1, 5])
def test_a_repeat_is_n_back_to_back_ops_between_one_sync_pair_reported_per_op(monkeypatch, n):
    """A repeat issues N ops back to back between one synchronise before and one after, and records the elapsed
    time divided by N: one host sync per op (its ~10 us plus Python's) is what overstates NCCL's small-message
    latency, and nccl-tests times N ops the same way. Checks the call structure with a fake clock and counters, not
    CUDA semantics: the size of the bias needs GPUs."""
    clock, calls = _Clock(), []
    monkeypatch.setattr(collectives, "time", clock)

    def op():
        calls.append("op")
        clock.now += 1.0

    plan = {"warmup": 1, "reps": 3, "gap_s": 0.0}
    out = collectives._timed(
        op, plan, "back_to_back", None, lambda: calls.append("sync"), lambda: calls.append("barrier"), ops=n
    )
    assert out == [1.0] * 3  # per-op time
    assert calls == (["barrier", "sync"] + ["op"] * n + ["sync"]) * 4  # one sync pair per repeat of n ops


def test_only_back_to_back_on_gpus_batches_ops():
    """N ops per sync pair on GPUs in back-to-back mode only: after_compute times the first op after idle compute
    (batching would make ops 2..N warm), and the CPU's Gloo ops are synchronous calls, timed one by one."""
    gpu, cpu = {"device_kind": "cuda", "ops_per_sync": 20}, {"device_kind": "cpu", "ops_per_sync": 20}
    assert collectives._ops_per_sync(gpu, "back_to_back") == 20
    assert collectives._ops_per_sync(gpu, "after_compute") == 1
    assert collectives._ops_per_sync(cpu, "back_to_back") == collectives._ops_per_sync(cpu, "after_compute") == 1
