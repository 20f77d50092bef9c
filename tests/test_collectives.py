"""pipeline/collectives.py: the (alpha, beta) fit on synthetic timings, the trials' message sizes, and one real
measurement at k=2 on this host (its keys, not its timings)."""
from __future__ import annotations

import json
import random

import pytest

from pipeline import collectives
from pipeline import scaling_model as sm
from pipeline.devices import probe


def synthetic(collective, k, alpha, beta, sizes, noise=0.0, seed=0):
    rng = random.Random(seed)
    f = sm.BUS_FACTOR[collective](k)
    return [{"bytes": s, "median_s": (alpha + f * s / beta) * (1 + rng.uniform(-noise, noise))} for s in sizes]


@pytest.mark.parametrize("collective,k", [("allreduce", 2), ("allreduce", 8), ("allgather", 4),
                                          ("reduce_scatter", 2), ("scratch_allreduce", 3)])
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
def test_measure_k2_returns_the_documented_keys():
    r = collectives.measure(ks=[2], reps=2, warmup=1, gap_s=0.002, fit_bytes=(4096, 262144))
    json.dumps(r)  # JSON-able
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
            assert all({"bytes", "in_trial", "median_s", "min_s", "max_s", "p90_s", "n", "busbw_Bps"} <= set(p)
                       for p in m["points"])
            assert any(p["in_trial"] for p in m["points"])
    assert r["collectives"]["allreduce"]["available"] and r["collectives"]["allgather"]["available"]
    if r["backend"] == "gloo":
        assert not r["collectives"]["dp_copy"]["available"] and "CUDA" in r["collectives"]["dp_copy"]["reason"]
    ic = sm.from_collectives(r)
    assert ic.kind == "measured" and "allreduce" in ic.links
