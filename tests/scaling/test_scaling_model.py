"""The scaling model's arithmetic (pipeline/scaling/model.py): ring volumes, k=1, monotonicity, labels, the
interconnect file, the error check. No timing."""

from __future__ import annotations

import math

import pytest

from pipeline import catalog
from pipeline.models import MODELS, blocks
from pipeline.scaling import model

LENET_BYTES = 129_068 * 4
STRATEGIES = tuple(n for n in catalog.NAMES if catalog.communicates(n))


def link(alpha=0.0, beta=1e9):
    return model.Interconnect("test link", "profile", {"*": {"alpha_s": alpha, "beta_Bps": beta, "k_ref": None}})


@pytest.fixture(scope="module")
def lenet():
    return model.model_layout("lenet")


@pytest.mark.parametrize("k", [2, 3, 4, 8, 64])
def test_ring_allreduce_moves_2_k_minus_1_over_k_of_the_buffer(k):
    s = 1_000_000
    assert link(beta=1.0).seconds("allreduce", s, k) == pytest.approx(2 * (k - 1) / k * s)
    assert link(beta=1.0).seconds("allgather", s, k) == pytest.approx((k - 1) / k * s)
    assert link(beta=1.0).seconds("reduce_scatter", s, k) == pytest.approx((k - 1) / k * s)
    assert link(beta=1.0).seconds("scratch_allreduce", s, k) == pytest.approx(2 * (k - 1) * s)


def test_latency_grows_with_ring_steps_from_the_measured_k():
    ic = model.Interconnect("m", "measured", {"allreduce": {"alpha_s": 1e-3, "beta_Bps": None, "k_ref": 2}})
    assert ic.seconds("allreduce", 0, 2) == pytest.approx(1e-3)
    assert ic.seconds("allreduce", 0, 4) == pytest.approx(3e-3)  # 2(k-1) steps: 6 vs 2
    assert link(alpha=1e-6).seconds("allgather", 0, 5) == pytest.approx(4e-6)  # profile: per step


def test_lenet_layout_and_buckets(lenet):
    assert lenet["param_bytes"] == LENET_BYTES
    assert model.ddp_buckets([p["bytes"] for p in lenet["params"]], 25.0) == [LENET_BYTES]  # 0.5 MB: one bucket
    calls = model.step_collectives("ddp", 2, lenet)
    assert [(c["collective"], c["bytes"]) for c in calls] == [("allreduce", LENET_BYTES)]


def test_ddp_buckets_cover_every_parameter_and_respect_the_cap():
    sizes = [4_000_000] * 20 + [100] * 5
    buckets = model.ddp_buckets(sizes, 25.0)
    assert sum(buckets) == sum(sizes)
    assert all(b >= 25 * model.MIB for b in buckets[:-1])
    assert len(model.ddp_buckets(sizes, 1.0)) > len(buckets)


def test_resnet18_is_several_buckets():
    r = model.model_layout("resnet18")
    buckets = model.ddp_buckets([p["bytes"] for p in r["params"]], 25.0)
    assert len(buckets) >= 2 and sum(buckets) == r["param_bytes"] == 11_175_818 * 4


@pytest.mark.parametrize("net", list(MODELS))
def test_fsdp_units_are_the_blocks_fsdp_shards(net):
    m = MODELS[net]()
    named = list(blocks(m))  # what fsdp.py shards (tests/strategies/test_fsdp_planning.py)
    units = model.model_layout(net)["fsdp_units"]
    assert [u["name"] for u in units] == [name for name, _ in named]
    assert [u["bytes"] for u in units] == [sum(p.numel() * 4 for p in b.parameters()) for _, b in named]
    assert [u["shapes"] for u in units] == [[list(p.shape) for p in b.parameters()] for _, b in named]


def test_fsdp_pads_dim0_to_a_multiple_of_k():
    assert model.fsdp_gathered_bytes([[20, 1, 3, 3], [20]], 2) == (180 + 20) * 4
    assert model.fsdp_gathered_bytes([[10]], 4) == 12 * 4
    calls = model.step_collectives("fsdp", 2, model.model_layout("lenet"))
    assert [c["collective"] for c in calls[:3]] == ["allgather", "allgather", "reduce_scatter"]
    assert len(calls) == 3 * 4  # LeNet: four units with parameters


def test_amp_changes_no_gradient_bytes_compression_halves_them(lenet):
    plain = model.step_collectives("ddp_amp", 2, lenet)
    assert plain == model.step_collectives("ddp", 2, lenet)
    assert model.step_collectives("ddp", 2, lenet, comm_hook="fp16")[0]["bytes"] == LENET_BYTES // 2
    with pytest.raises(ValueError, match="powersgd"):
        model.step_collectives("ddp", 2, lenet, comm_hook="powersgd")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_k1_is_efficiency_one(strategy, lenet):
    p = model.predict(strategy, 1, 1e-4, link(alpha=1e-3, beta=1e6), layout=lenet)
    assert p["efficiency"] == 1.0 and p["exposed_comm_s"] == 0.0


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_efficiency_rises_with_bandwidth_and_falls_with_k(strategy, lenet):
    effs = [
        model.predict(strategy, 4, 1e-4, link(alpha=1e-5, beta=b), layout=lenet)["efficiency"]
        for b in (1e7, 1e8, 1e9, 1e10)
    ]
    assert effs == sorted(effs) and effs[0] < effs[-1] <= 1
    by_k = [model.predict(strategy, k, 1e-4, link(alpha=1e-5, beta=1e8), layout=lenet)["efficiency"] for k in (2, 4, 8)]
    assert by_k == sorted(by_k, reverse=True)


def test_step_time_equation(lenet):
    p = model.predict("ddp", 2, 2e-4, link(alpha=5e-4, beta=1e9), per_device_batch=100, layout=lenet)
    comm = 1e-3 + 1.0 * LENET_BYTES / 1e9  # a profile's alpha per ring step x 2(k-1) = 2 steps; 2(k-1)/k = 1
    assert p["comm_s"] == pytest.approx(comm)
    assert p["step_s"] == pytest.approx(100 * 2e-4 + comm)
    assert p["throughput_img_s"] == pytest.approx(200 / p["step_s"])
    assert p["efficiency"] == pytest.approx(100 * 2e-4 / p["step_s"])


def test_serial_replicas_cost_k_times_the_compute(lenet):
    p = model.predict("scratch", 2, 1e-4, link(beta=1e12), serial_replicas=True, layout=lenet)
    assert p["efficiency"] == pytest.approx(0.5, rel=1e-3)


def test_overlap_hides_communication_but_never_the_last_bucket():
    layout = {"params": [{"bytes": 30 * model.MIB}] * 3, "param_bytes": 90 * model.MIB, "fsdp_units": []}
    ic = link(beta=1e9)
    none = model.predict("ddp", 2, 1e-3, ic, layout=layout)
    full = model.predict("ddp", 2, 1e-3, ic, layout=layout, overlap=1.0, backward_fraction=1.0)
    assert none["exposed_comm_s"] == pytest.approx(none["comm_s"])  # default: nothing hidden
    assert full["exposed_comm_s"] == pytest.approx(full["collectives"][-1]["seconds"])
    assert full["efficiency"] > none["efficiency"]


def test_interconnect_file_parses_and_every_profile_names_its_source():
    profiles = model.load_profiles()
    assert {"nvlink4", "pcie_gen4_x16", "pcie_gen5_x16"} <= set(profiles)
    for p in profiles.values():
        assert p.kind == "profile" and p.source.strip() and "nominal" in p.note
        assert p.link("allreduce")["beta_Bps"] > 0
    assert profiles["nvlink4"].link("*")["beta_Bps"] == pytest.approx(450e9)


def test_a_profile_without_a_source_is_refused(tmp_path):
    f = tmp_path / "i.yaml"
    f.write_text("interconnects:\n  x: {busbw_GBps: 1, latency_us: 1, note: nominal}\n")
    with pytest.raises(ValueError, match="source"):
        model.load_profiles(f)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_output_is_labelled_modelled(strategy, lenet):
    ic = model.load_profiles()["pcie_gen4_x16"]
    p = model.predict(strategy, 8, 1e-4, ic, layout=lenet)
    assert p["modelled"] is True and p["interconnect"] == "pcie_gen4_x16" and p["assumptions"]
    c = model.check(p, 0.9)
    assert c["modelled"] is True and c["interconnect"] == "pcie_gen4_x16"


def test_check_reports_a_miss_and_changes_nothing(lenet):
    p = model.predict("ddp", 2, 1e-4, link(alpha=1e-4, beta=1e9), layout=lenet)
    before = dict(p)
    ok = model.check(p, p["efficiency"] * 1.05)
    miss = model.check(p, p["efficiency"] * 0.8)
    assert ok["within_tolerance"] and ok["rel_error"] == pytest.approx(1 / 1.05 - 1)
    assert not miss["within_tolerance"] and miss["verdict"].startswith("MISS") and miss["tolerance"] == 0.10
    assert model.check(p, p["efficiency"] * 0.8, tolerance=0.3)["within_tolerance"]
    assert p == before


def test_measured_host_interconnect_from_a_collectives_result():
    fit = {"alpha_s": 1e-4, "beta_Bps": 2e9}
    measured = {
        "host": {"hostname": "h"},
        "backend": "gloo",
        "ks": [2],
        "measured_at": "now",
        "collectives": {
            "allreduce": {"available": True, "by_k": {"2": {"after_compute": {"fit": fit}}}},
            "dp_copy": {"available": False, "by_k": {}},
        },
    }
    ic = model.from_collectives(measured)
    assert ic.kind == "measured" and "measured" in ic.name and set(ic.links) == {"allreduce"}
    assert ic.seconds("allreduce", 1e6, 2) == pytest.approx(1e-4 + 1e6 / 2e9)
    assert math.isclose(ic.seconds("allreduce", 0, 3), 2e-4)


@pytest.fixture
def optimizer_sharded_ddp(monkeypatch):
    """A catalog row `ddp` whose optimizer state is sharded (what ZeroRedundancyOptimizer over DDP is)."""
    import dataclasses

    row = dataclasses.replace(catalog.spec("ddp"), shards=("optimizer",))
    monkeypatch.setitem(catalog.SPECS, "ddp", row)
    return "ddp"


def test_optimizer_sharding_broadcasts_every_parameter_after_the_step(optimizer_sharded_ddp, lenet):
    """Sharding only the optimizer state adds one broadcast per parameter tensor (its bytes) after the step, on top
    of the bucket all-reduce; sharding the parameters too (fsdp) adds none."""
    calls = model.step_collectives(optimizer_sharded_ddp, 2, lenet)
    after = [c for c in calls if c["phase"] == "after step"]
    assert [c["collective"] for c in after] == ["broadcast"] * len(lenet["params"])
    assert sum(c["bytes"] for c in after) == LENET_BYTES
    assert [c for c in calls if c["phase"] != "after step"] == model.step_collectives("ddp_amp", 2, lenet)
    assert "broadcast" in model.collectives_of(optimizer_sharded_ddp)
    assert not any(c["collective"] == "broadcast" for c in model.step_collectives("fsdp", 2, lenet))


def test_the_broadcasts_after_the_step_are_never_hidden(optimizer_sharded_ddp):
    layout = {"params": [{"bytes": 30 * model.MIB}] * 3, "param_bytes": 90 * model.MIB, "fsdp_units": []}
    full = model.predict(
        optimizer_sharded_ddp, 2, 1e-3, link(beta=1e9), layout=layout, overlap=1.0, backward_fraction=1.0
    )
    after = sum(c["seconds"] for c in full["collectives"] if c["phase"] == "after step")
    assert after == pytest.approx(3 * 30 * model.MIB / 1e9)  # a broadcast moves its tensor once: factor 1
    last_bucket = [c for c in full["collectives"] if c["phase"] == "backward"][-1]["seconds"]
    assert full["exposed_comm_s"] == pytest.approx(last_bucket + after)


def test_a_host_without_a_measured_broadcast_prices_it_as_its_all_gather():
    ic = model.Interconnect("host", "measured", {"allgather": {"alpha_s": 1e-5, "beta_Bps": 1e9, "k_ref": 2}})
    assert ic.seconds("broadcast", 1e6, 2) == pytest.approx(1e-5 + 1e6 / 1e9)
    with pytest.raises(KeyError, match="no figures for 'allreduce'"):
        ic.seconds("allreduce", 1e6, 2)
