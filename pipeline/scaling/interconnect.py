"""Interconnects for the scaling model: per collective, the latency alpha and bus bandwidth beta, from this host's
measured collectives (pipeline/scaling/collectives.py) or a nominal profile (experiments/interconnects/nominal.yaml),
and the cost of one collective on them (the formulas: pipeline/scaling/model.py's docstring)."""
from __future__ import annotations

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
    "allreduce": lambda k: 2 * (k - 1), "allreduce_shm": lambda k: 2 * (k - 1),
    "allgather": lambda k: k - 1, "reduce_scatter": lambda k: k - 1,
    "scratch_allreduce": lambda k: 2 * (k - 1), "dp_copy": lambda k: k - 1, "dp_scatter": lambda k: k - 1,
    "broadcast": lambda k: k - 1,
}
# a collective a host has no measured figures for, priced with one it has: a ring broadcast's per-hop link is the
# all-gather's
STAND_IN = {"broadcast": "allgather"}


@dataclass(frozen=True)
class Interconnect:
    """Per collective: (alpha_s at k_ref, beta in bus bytes/s, k_ref); "*" applies to every collective."""
    name: str
    # "measured" (this host, pipeline/scaling/collectives.py) | "profile" (experiments/interconnects/nominal.yaml)
    kind: str
    links: dict = field(default_factory=dict)
    source: str = ""
    note: str = ""

    def link(self, collective: str) -> dict:
        if collective in self.links:
            return self.links[collective]
        if STAND_IN.get(collective) in self.links:
            return self.links[STAND_IN[collective]]
        if "*" in self.links:
            return self.links["*"]
        raise KeyError(f"interconnect {self.name!r} has no figures for {collective!r} "
                       f"(it has {', '.join(self.links)})")

    def seconds(self, collective: str, nbytes: float, k: int) -> float:
        """Modelled time of one `collective` of `nbytes` at k."""
        if k <= 1:
            return 0.0
        li = self.link(collective)
        hops = HOPS[collective]
        alpha = li["alpha_s"] * hops(k) / hops(li["k_ref"]) if li.get("k_ref") else li["alpha_s"] * hops(k)
        beta = li["beta_Bps"]
        return alpha + (BUS_FACTOR[collective](k) * nbytes / beta if beta else 0.0)


def load_profiles(path: Path | str | None = None) -> dict[str, Interconnect]:
    """The nominal interconnect profiles (experiments/interconnects/nominal.yaml): name -> Interconnect."""
    import yaml  # a data file, not configuration: config.py stays the only reader of params and profiles
    raw = yaml.safe_load(Path(path or PROFILES_FILE).read_text())
    out = {}
    for name, p in raw["interconnects"].items():
        for key in ("busbw_GBps", "latency_us", "source", "note"):
            if key not in p:
                raise ValueError(f"interconnect profile {name!r} lacks `{key}`")
        out[name] = Interconnect(name=name, kind="profile", source=p["source"], note=p["note"],
                                 links={"*": {"alpha_s": p["latency_us"] * 1e-6, "beta_Bps": p["busbw_GBps"] * 1e9,
                                              "k_ref": None}})
    return out


def from_collectives(measured: dict, mode: str = "after_compute", k: int | None = None) -> Interconnect:
    """This host's interconnect from pipeline.scaling.collectives.measure(): each collective's fit at the largest
    measured k
    (or `k`), in `mode` ("after_compute": issued after a compute phase, as in a step; or "back_to_back")."""
    links = {}
    for name, c in measured["collectives"].items():
        if not c.get("available"):
            continue
        ks = sorted(int(x) for x in c["by_k"])
        kk = k if k is not None else ks[-1]
        fit = c["by_k"][str(kk)][mode]["fit"]
        links[name] = {"alpha_s": fit["alpha_s"], "beta_Bps": fit["beta_Bps"], "k_ref": kk}
    h = measured["host"]
    return Interconnect(name=f"host {h['hostname']} (measured, {measured['backend']}, {mode.replace('_', ' ')})",
                        kind="measured", links=links, source="pipeline/scaling/collectives.py on this host",
                        note=f"measured {measured['measured_at']}; beyond k={max(measured['ks'])} extrapolated")
