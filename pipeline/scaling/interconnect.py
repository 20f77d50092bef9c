"""Interconnects for the scaling model (model.py): per collective, a latency alpha and a bus bandwidth beta, of one
scope: intra-node (the devices of one node: NVLink, PCIe, or this host's collectives as measured by collectives.py)
or inter-node (the network between nodes: nominal InfiniBand profiles). The two are kept apart: a measurement on
one host says nothing about the network between hosts, and every nominal figure is labelled as such.

A collective over k devices on nodes of g uses the intra-node figures while k <= g; past one node, the
interconnect's inter-node figures too, the flat ring moving at its slowest link's pace (Interconnect.seconds).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

PROFILES_FILE = Path(__file__).resolve().parents[2] / "experiments" / "interconnects" / "nominal.yaml"

# bytes a collective moves per message byte, and its latency steps h(k)
BUS_FACTOR = {
    "allreduce": lambda k: 2 * (k - 1) / k,
    "allreduce_shm": lambda k: 2 * (k - 1) / k,
    "allgather": lambda k: (k - 1) / k,
    "reduce_scatter": lambda k: (k - 1) / k,
    "scratch_allreduce": lambda k: 2 * (k - 1),
    "dp_copy": lambda k: k - 1,
    "dp_scatter": lambda k: (k - 1) / k,
    "broadcast": lambda k: 1.0,
}
HOPS = {
    "allreduce": lambda k: 2 * (k - 1),
    "allreduce_shm": lambda k: 2 * (k - 1),
    "allgather": lambda k: k - 1,
    "reduce_scatter": lambda k: k - 1,
    "scratch_allreduce": lambda k: 2 * (k - 1),
    "dp_copy": lambda k: k - 1,
    "dp_scatter": lambda k: k - 1,
    "broadcast": lambda k: k - 1,
}
# a collective a host has no measured figures for, priced with one it has: a ring broadcast's per-hop link is the
# all-gather's
STAND_IN = {"broadcast": "allgather"}


@dataclass(frozen=True)
class Interconnect:
    """Per collective: (alpha_s at k_ref, beta in bus bytes/s, k_ref); "*" applies to every collective.

    `links` are the figures of one scope: "intra-node" (devices of one node: NVLink, PCIe, this host's measured
    collectives) or "inter-node" (the network between nodes: InfiniBand, Ethernet). An intra-node interconnect may
    carry an inter-node one (`inter`, see across_nodes): a collective over k devices on nodes of g then uses both
    when k > g (seconds())."""

    name: str
    # "measured" (this host, pipeline/scaling/collectives.py) | "profile" (experiments/interconnects/nominal.yaml)
    kind: str
    links: dict = field(default_factory=dict)
    source: str = ""
    note: str = ""
    scope: str = "intra-node"
    inter: Interconnect | None = None

    def link(self, collective: str) -> dict:
        if collective in self.links:
            return self.links[collective]
        if STAND_IN.get(collective) in self.links:
            return self.links[STAND_IN[collective]]
        if "*" in self.links:
            return self.links["*"]
        raise KeyError(f"interconnect {self.name!r} has no figures for {collective!r} (it has {', '.join(self.links)})")

    def across_nodes(self, inter: Interconnect) -> Interconnect:
        """This (intra-node) interconnect with `inter` (an inter-node one) between its nodes."""
        if self.scope != "intra-node" or inter.scope != "inter-node":
            raise ValueError(
                f"across_nodes pairs an intra-node interconnect with an inter-node one, not "
                f"{self.name!r} ({self.scope}) with {inter.name!r} ({inter.scope})"
            )
        kind = self.kind if self.kind == inter.kind else f"{self.kind} + {inter.kind}"
        return dataclasses.replace(self, name=f"{self.name} + {inter.name} between nodes", kind=kind, inter=inter)

    def _terms(self, collective: str, nbytes: float, k: int) -> tuple[float, float]:
        """(latency, transfer) seconds of one `collective` of `nbytes` at k over this interconnect's own links."""
        li = self.link(collective)
        hops = HOPS[collective]
        alpha = li["alpha_s"] * hops(k) / hops(li["k_ref"]) if li.get("k_ref") else li["alpha_s"] * hops(k)
        beta = li["beta_Bps"]
        return alpha, (BUS_FACTOR[collective](k) * nbytes / beta if beta else 0.0)

    def seconds(self, collective: str, nbytes: float, k: int, devices_per_node: int | None = None) -> float:
        """Modelled time of one `collective` of `nbytes` at k, the k devices on nodes of `devices_per_node` (None:
        all on one node).

        k <= devices_per_node: the intra-node links only. k > devices_per_node: the ring passes through both the
        nodes' own links and the network between them, and a ring all-reduce (all-gather, reduce-scatter) moves at
        the pace of its slowest link: each step waits for its slowest hop, so the latency term is the larger of the
        two scopes' and the transfer term the larger (the smaller bandwidth's). NCCL's hierarchical and tree
        algorithms, which send less over the network, are not modelled: this bound is pessimistic for them."""
        if k <= 1:
            return 0.0
        alpha, transfer = self._terms(collective, nbytes, k)
        if devices_per_node is None or k <= devices_per_node:
            return alpha + transfer
        if self.inter is None:
            raise ValueError(
                f"interconnect {self.name!r} has no inter-node figures, and k={k} spans "
                f"{math.ceil(k / devices_per_node)} nodes of {devices_per_node}: pair it with an "
                f"inter-node profile (Interconnect.across_nodes)"
            )
        alpha_x, transfer_x = self.inter._terms(collective, nbytes, k)
        return max(alpha, alpha_x) + max(transfer, transfer_x)


SCOPES = ("intra-node", "inter-node")


def load_profiles(path: Path | str | None = None, scope: str | None = "intra-node") -> dict[str, Interconnect]:
    """The nominal interconnect profiles (experiments/interconnects/nominal.yaml) of `scope` ("intra-node", the
    default; "inter-node"; None: every one): name -> Interconnect. An entry without `scope` is intra-node."""
    import yaml  # a data file, not configuration: config/loader.py stays the only reader of params and profiles

    raw = yaml.safe_load(Path(path or PROFILES_FILE).read_text())
    out = {}
    for name, p in raw["interconnects"].items():
        for key in ("busbw_GBps", "latency_us", "source", "note"):
            if key not in p:
                raise ValueError(f"interconnect profile {name!r} lacks `{key}`")
        if p.get("scope", "intra-node") not in SCOPES:
            raise ValueError(f"interconnect profile {name!r}: scope {p['scope']!r} is not one of {', '.join(SCOPES)}")
        ic = Interconnect(
            name=name,
            kind="profile",
            source=p["source"],
            note=p["note"],
            scope=p.get("scope", "intra-node"),
            links={"*": {"alpha_s": p["latency_us"] * 1e-6, "beta_Bps": p["busbw_GBps"] * 1e9, "k_ref": None}},
        )
        if scope is None or ic.scope == scope:
            out[name] = ic
    return out


def from_collectives(measured: dict, mode: str = "after_compute", k: int | None = None) -> Interconnect:
    """This host's interconnect from pipeline.scaling.collectives.measure(): each collective's fit at the largest
    measured k (or `k`), in `mode` ("after_compute": issued after a compute phase, as in a step; or
    "back_to_back"). Every rank of that measurement ran on this host, so these are intra-node figures: past one node,
    pair them with an inter-node profile (Interconnect.across_nodes)."""
    links = {}
    for name, c in measured["collectives"].items():
        if not c.get("available"):
            continue
        ks = sorted(int(x) for x in c["by_k"])
        kk = k if k is not None else ks[-1]
        fit = c["by_k"][str(kk)][mode]["fit"]
        links[name] = {"alpha_s": fit["alpha_s"], "beta_Bps": fit["beta_Bps"], "k_ref": kk}
    h = measured["host"]
    return Interconnect(
        name=f"host {h['hostname']} (measured intra-node, {measured['backend']}, {mode.replace('_', ' ')})",
        kind="measured",
        links=links,
        source="pipeline/scaling/collectives.py on this host",
        note=f"measured {measured['measured_at']} on one node; beyond k={max(measured['ks'])} extrapolated",
        scope="intra-node",
    )
