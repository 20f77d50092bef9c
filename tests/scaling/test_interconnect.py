"""Intra-node and inter-node interconnect figures kept apart: a prediction past one node uses the network's figures,
bounded by the slowest link; the nominal profiles label their scope; the host's measured figures are intra-node."""

from __future__ import annotations

import pytest

from pipeline.scaling import model


def ic(name, alpha, beta, scope="intra-node"):
    return model.Interconnect(name, "profile", {"*": {"alpha_s": alpha, "beta_Bps": beta, "k_ref": None}}, scope=scope)


@pytest.fixture(scope="module")
def lenet():
    return model.model_layout("lenet")


FAST, NET = ic("fast", 1e-6, 100e9), ic("net", 5e-6, 10e9, "inter-node")


def test_within_a_node_only_the_intra_node_figures_count():
    """k <= devices_per_node: the same time as without the network (and as with no node size at all)."""
    both = FAST.across_nodes(NET)
    for k in (2, 8):
        assert both.seconds("allreduce", 1e8, k, 8) == pytest.approx(FAST.seconds("allreduce", 1e8, k))


def test_past_one_node_the_ring_moves_at_the_slowest_links_pace():
    """k > devices_per_node: latency of the slower hop, transfer at the smaller bandwidth (2(k-1)/k S / beta_min)."""
    both = FAST.across_nodes(NET)
    k, s = 16, 1e8
    assert both.seconds("allreduce", s, k, 8) == pytest.approx(5e-6 * 2 * (k - 1) + 2 * (k - 1) / k * s / 10e9)
    slow_inside = ic("slow", 1e-6, 1e9).across_nodes(NET)  # the slowest link may be the node's own
    assert slow_inside.seconds("allgather", s, k, 8) == pytest.approx(5e-6 * (k - 1) + (k - 1) / k * s / 1e9)


def test_spanning_nodes_without_inter_node_figures_or_in_one_process_is_refused(lenet):
    """No silent use of intra-node figures across the network; one-process strategies cannot span nodes."""
    with pytest.raises(ValueError, match="no inter-node figures"):
        FAST.seconds("allreduce", 1e6, 16, 8)
    with pytest.raises(ValueError, match="pairs an intra-node"):
        NET.across_nodes(FAST)
    with pytest.raises(ValueError, match="cannot span nodes"):
        model.predict("scratch", 16, 1e-4, FAST.across_nodes(NET), layout=lenet, devices_per_node=8)


def test_predict_says_how_many_nodes_and_which_links(lenet):
    """A 16-device ddp prediction on nodes of 8 uses 2 nodes and both scopes, and is slower than one node of 16."""
    both = FAST.across_nodes(NET)
    one = model.predict("ddp", 16, 1e-4, both, layout=lenet)
    two = model.predict("ddp", 16, 1e-4, both, layout=lenet, devices_per_node=8)
    assert (one["nnodes"], one["links"]) == (1, "intra-node")
    assert (two["nnodes"], two["links"]) == (2, "intra-node + inter-node") and two["modelled"] is True
    assert two["efficiency"] < one["efficiency"] and "between nodes" in two["interconnect"]


def test_nominal_profiles_have_a_scope_and_inter_node_entries():
    """load_profiles() stays intra-node (the single-node projections); the InfiniBand entries are inter-node."""
    intra, inter = model.load_profiles(), model.load_profiles(scope="inter-node")
    assert {"nvlink4", "pcie_gen4_x16"} <= set(intra) and {p.scope for p in intra.values()} == {"intra-node"}
    assert {"ib_edr_100", "ib_hdr_200", "ib_ndr_400"} <= set(inter)
    for p in inter.values():
        assert p.scope == "inter-node" and "nominal" in p.note and p.source.strip()
    assert inter["ib_ndr_400"].link("*")["beta_Bps"] == pytest.approx(50e9)  # 400 Gb/s
    assert set(model.load_profiles(scope=None)) == set(intra) | set(inter)


def test_a_measured_host_is_labelled_intra_node():
    """This host's collectives (every rank on one machine) are intra-node figures, named so."""
    fit = {"alpha_s": 1e-4, "beta_Bps": 2e9}
    measured = {
        "host": {"hostname": "h"},
        "backend": "gloo",
        "ks": [2],
        "measured_at": "now",
        "collectives": {"allreduce": {"available": True, "by_k": {"2": {"after_compute": {"fit": fit}}}}},
    }
    host = model.from_collectives(measured)
    assert host.scope == "intra-node" and "intra-node" in host.name and host.kind == "measured"
    paired = host.across_nodes(model.load_profiles(scope="inter-node")["ib_hdr_200"])
    assert paired.kind == "measured + profile"
    # the host's gloo figures (2 GB/s, 100 us per step) are the slower link here: the ring moves at their pace
    assert paired.seconds("allreduce", 1e6, 4, 2) == pytest.approx(host.seconds("allreduce", 1e6, 4))
