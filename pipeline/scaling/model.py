"""A projection, labelled as modelled: step time and weak-scaling efficiency of a strategy at any k, from the k=1
compute time measured on this host, the strategy's communication per step, and an interconnect's (alpha, beta).

    python -m benchmarks.scaling.model_check      # fits on k=1 + the measured collectives, checks every measured k > 1

Every figure returned here carries "modelled": True and the interconnect's name; nothing here is a measurement.

Notation: k devices, b images per device per step, c = measured seconds per image of the strategy's own k=1 trial
(forward + backward + optimizer + whatever else its k=1 step does), so T1 = b * c.

Collective cost (nccl-tests' convention; S = message bytes, beta = bus bandwidth in bytes/s):
    all-reduce          t = alpha(k) + 2(k-1)/k * S / beta         (S = the buffer)
    all-gather          t = alpha(k) +  (k-1)/k * S / beta         (S = the gathered, whole tensor)
    reduce-scatter      t = alpha(k) +  (k-1)/k * S / beta         (S = the whole input)
    scratch all-reduce  t = alpha(k) +  2(k-1)  * S / beta         (d2l's copy-based sum into device 0 and back)
    dp copies           t = alpha(k) +  (k-1)   * S / beta         (replicate, reduce: device 0 to/from each other)
    alpha(k) = alpha_ref * h(k) / h(k_ref): latency grows with the ring's steps h = 2(k-1) (all-reduce, scratch) or
    k-1 (all-gather, reduce-scatter, dp copies); k_ref = the k it was measured at (a profile gives alpha per hop).

Communication per step (what each strategy issues; sizes from the model's parameters, float32 gradients):
    ddp, ddp_amp  one all-reduce per gradient bucket (DDP's greedy assignment in reverse parameter order, a bucket
                  closes once it holds >= train.bucket_cap_mb MiB; LeNet's 0.5 MB is one bucket). Gradients stay
                  float32 under autocast, so amp changes no byte; an fp16/bf16 compression hook halves them;
                  accum_steps = a divides the per-micro-step volume by a. powersgd is not modelled.
    fsdp          per sharded unit (fsdp.py's blocks): an all-gather before forward, one before backward (units are
                  resharded after forward) and a reduce-scatter of its gradients; dim 0 padded to a multiple of k.
    scratch       one copy-based all-reduce per parameter tensor, after the whole backward.
    dp, dp_crit.  replicate the parameters ((k-1) copies), scatter the input batch, gather the logits (dp) or the
                  k losses (dp_criterion), reduce the gradients to device 0 ((k-1) copies): CUDA only.

Step time and efficiency:
    compute(k) = T1, or k * T1 where one process runs the k replicas one after another (scratch on a CPU host)
    C(k)       = sum of the collectives' times above
    exposed(k) = max(floor, C(k) - overlap * hideable)     hideable = backward_fraction * T1 (ddp), T1 (fsdp)
                 floor = the last bucket's all-reduce (ddp) / the first all-gather and the last reduce-scatter
                 (fsdp): they have no compute to hide behind. scratch and dp: exposed = C (nothing runs alongside)
    T(k)       = compute(k) + exposed(k),   throughput = k * b / T(k)
    E_w(k)     = throughput(k) / (k * b / T1) = T1 / T(k)         (weak scaling: b fixed per device)

Assumptions (what the model leaves out, so what a miss points to):
  - overlap defaults to 0 (conservative; exact for a single bucket, and 1-thread CPU ranks run DDP's hook inline);
    backward_fraction (default 0.6: backward ~2x forward) only matters when overlap > 0;
  - per-image compute does not change with k: no contention between devices for shared cache, memory bandwidth or
    clocks, and no time lost to lockstep (every synchronous step waits for the slower rank's jitter);
  - no framework cost beyond what the k=1 trial already pays (FSDP's copy-in/out at k > 1, DDP's reducer);
  - beyond the measured k the host's collectives keep their bus bandwidth and their latency grows with the ring's
    steps; a profile's figures are nominal (experiments/interconnects/nominal.yaml), not measured on any machine here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from pipeline import catalog

MIB = 1 << 20
DEFAULT_TOLERANCE = 0.10
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
}
HOPS = {
    "allreduce": lambda k: 2 * (k - 1), "allreduce_shm": lambda k: 2 * (k - 1),
    "allgather": lambda k: k - 1, "reduce_scatter": lambda k: k - 1,
    "scratch_allreduce": lambda k: 2 * (k - 1), "dp_copy": lambda k: k - 1, "dp_scatter": lambda k: k - 1,
}
HOOK_BYTES = {"none": 1.0, "shm": 1.0, "fp16": 0.5, "bf16": 0.5}
ASSUMPTIONS = (
    "overlap of communication with backward as given (default 0: all communication exposed)",
    "per-image compute independent of k: no contention for shared cache/memory bandwidth, no lockstep jitter",
    "no framework cost beyond the k=1 trial's (FSDP copy-in/out, DDP reducer)",
    "collectives: bus bandwidth constant in k, latency growing with the ring's steps",
)


# ----------------------------------------------------------------------------- what a strategy sends

def model_layout(model: str = "lenet") -> dict:
    """Parameter tensors of `model` in definition order, and its FSDP units (the blocks fsdp.py shards)."""
    from torch import nn

    from pipeline.models import MODELS
    m = MODELS[model]()
    params = [{"name": n, "shape": list(p.shape), "bytes": p.numel() * p.element_size()}
              for n, p in m.named_parameters()]
    units = []
    for name, unit in _fsdp_units(m, nn):
        units.append({"name": name, "shapes": [list(p.shape) for p in unit.parameters()],
                      "bytes": sum(p.numel() * p.element_size() for p in unit.parameters())})
    return {"model": model, "params": params, "param_bytes": sum(p["bytes"] for p in params), "fsdp_units": units}


def _fsdp_units(model, nn):
    # the same rule as strategies/fsdp.py's blocks (kept in step by tests/scaling/test_scaling_model.py)
    for name, child in model.named_children():
        if isinstance(child, nn.Sequential) and len(list(child.children())) > 1:
            yield from ((f"{name}.{n}", b) for n, b in child.named_children() if any(True for _ in b.parameters()))
        elif any(True for _ in child.parameters()):
            yield name, child


def ddp_buckets(param_bytes: list[int], bucket_cap_mb: float) -> list[int]:
    """Bucket sizes in bytes, in all-reduce order: DDP's greedy assignment over the parameters in reverse
    (gradient-ready) order; a bucket closes once it holds >= the cap (an explicit bucket_cap_mb sets the first
    bucket's cap too)."""
    cap, out, cur = bucket_cap_mb * MIB, [], 0
    for b in reversed(param_bytes):
        cur += b
        if cur >= cap:
            out.append(cur)
            cur = 0
    return out + ([cur] if cur else [])


def fsdp_gathered_bytes(shapes: list[list[int]], k: int, elem: int = 4) -> int:
    """Bytes of one unit's all-gather output at k: each parameter's dim 0 padded to a multiple of k."""
    total = 0
    for s in shapes:
        rest = math.prod(s[1:]) if len(s) > 1 else 1
        total += math.ceil(s[0] / k) * k * rest * elem
    return total


def step_collectives(strategy: str, k: int, layout: dict, per_device_batch: int = 256, bucket_cap_mb: float = 25.0,
                     comm_hook: str = "none", accum_steps: int = 1, transport: str | None = None) -> list[dict]:
    """The collectives one step of `strategy` issues at k: [{"collective", "bytes", "count", "phase"}].

    count may be fractional (accum_steps: one all-reduce every a micro-steps). transport names the all-reduce that
    carries DDP's buckets (allreduce, or allreduce_shm for comm_hook=shm on one CPU host). The strategy's
    collective pattern is its catalog row's `comm` (pipeline/catalog.py)."""
    comm = comm_pattern(strategy)
    if comm == "bucket_allreduce":
        if comm_hook not in HOOK_BYTES:
            raise ValueError(f"comm_hook={comm_hook!r} is not modelled (modelled: {', '.join(HOOK_BYTES)})")
        name = transport or ("allreduce_shm" if comm_hook == "shm" else "allreduce")
        sizes = ddp_buckets([p["bytes"] for p in layout["params"]], bucket_cap_mb)
        return [{"collective": name, "bytes": int(s * HOOK_BYTES[comm_hook]), "count": 1 / accum_steps,
                 "phase": "backward"} for s in sizes]
    if comm == "shard_units":
        out = []
        for u in layout["fsdp_units"]:
            g = fsdp_gathered_bytes(u["shapes"], k)
            out += [{"collective": "allgather", "bytes": g, "count": 1, "phase": "forward", "unit": u["name"]},
                    {"collective": "allgather", "bytes": g, "count": 1, "phase": "backward", "unit": u["name"]},
                    {"collective": "reduce_scatter", "bytes": g, "count": 1, "phase": "backward", "unit": u["name"]}]
        return out
    if comm == "copy_allreduce":
        return [{"collective": "scratch_allreduce", "bytes": p["bytes"], "count": 1, "phase": "after backward"}
                for p in layout["params"]]
    if comm in ("dp_gather_logits", "dp_gather_losses"):
        x = per_device_batch * k * 28 * 28 * 4
        out_bytes = per_device_batch * k * 10 * 4 if comm == "dp_gather_logits" else k * 4
        return [{"collective": "dp_copy", "bytes": layout["param_bytes"], "count": 1, "phase": "replicate"},
                {"collective": "dp_scatter", "bytes": x, "count": 1, "phase": "scatter input"},
                {"collective": "dp_scatter", "bytes": out_bytes, "count": 1, "phase": "gather outputs"},
                {"collective": "dp_copy", "bytes": layout["param_bytes"], "count": 1, "phase": "reduce gradients"}]
    if comm == "none":
        return []
    raise ValueError(f"strategy {strategy!r}: the communication pattern {comm!r} has no model")


def comm_pattern(strategy: str) -> str:
    """The strategy's collective pattern (its catalog row's `comm`); ValueError for a name not in the catalog."""
    try:
        return catalog.spec(strategy).comm
    except catalog.UnknownStrategy as e:
        raise ValueError(f"strategy {strategy!r} has no communication model ({e})") from None


# ----------------------------------------------------------------------------- interconnects

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


# ----------------------------------------------------------------------------- the projection

def predict(strategy: str, k: int, compute_s_per_image: float, interconnect: Interconnect, *, model: str = "lenet",
            per_device_batch: int = 256, bucket_cap_mb: float = 25.0, comm_hook: str = "none",
            accum_steps: int = 1, transport: str | None = None, serial_replicas: bool = False,
            overlap: float = 0.0, backward_fraction: float = 0.6, layout: dict | None = None) -> dict:
    """Modelled step time, throughput and weak-scaling efficiency of `strategy` at k (see the module docstring).

    compute_s_per_image: the strategy's k=1 trial, 1 / (its images/s). serial_replicas: the k replicas run one after
    another in one process (scratch on a CPU host: the trial's parallel_devices is False)."""
    if not 0 <= overlap <= 1 or not 0 <= backward_fraction <= 1:
        raise ValueError("overlap and backward_fraction are fractions in [0, 1]")
    layout = layout or model_layout(model)
    t1 = per_device_batch * compute_s_per_image
    calls = step_collectives(strategy, k, layout, per_device_batch, bucket_cap_mb, comm_hook, accum_steps, transport)
    for c in calls:
        c["seconds"] = interconnect.seconds(c["collective"], c["bytes"], k) * c["count"]
    comm = sum(c["seconds"] for c in calls)
    hideable, floor = 0.0, comm
    comm_kind = comm_pattern(strategy)
    if comm_kind == "bucket_allreduce" and calls:
        hideable, floor = backward_fraction * t1, calls[-1]["seconds"]
    elif comm_kind == "shard_units" and calls:
        hideable = t1
        floor = calls[0]["seconds"] + next(c["seconds"] for c in reversed(calls) if c["collective"] == "reduce_scatter")
    exposed = max(min(floor, comm), comm - overlap * hideable)
    compute = k * t1 if serial_replicas else t1
    step = compute + exposed
    return {
        "modelled": True, "interconnect": interconnect.name, "interconnect_kind": interconnect.kind,
        "strategy": strategy, "model": model, "k": k, "per_device_batch": per_device_batch,
        "compute_s_per_image_k1": compute_s_per_image, "compute_s": compute, "comm_s": comm,
        "hideable_s": overlap * hideable, "exposed_comm_s": exposed, "step_s": step,
        "throughput_img_s": k * per_device_batch / step, "efficiency": t1 / step,
        "comm_bytes": sum(c["bytes"] * c["count"] for c in calls), "collectives": calls,
        "parameters": {"overlap": overlap, "backward_fraction": backward_fraction, "serial_replicas": serial_replicas,
                       "bucket_cap_mb": bucket_cap_mb, "comm_hook": comm_hook, "accum_steps": accum_steps,
                       "transport": transport},
        "assumptions": list(ASSUMPTIONS),
    }


def check(prediction: dict, measured_efficiency: float, tolerance: float = DEFAULT_TOLERANCE) -> dict:
    """The model's error against a measured point: relative error of the efficiency, and whether it is within
    `tolerance` (default 10%). A miss is reported as a miss; nothing here adjusts the model."""
    mod = prediction["efficiency"]
    rel = (mod - measured_efficiency) / measured_efficiency
    within = abs(rel) <= tolerance
    return {"modelled": True, "interconnect": prediction["interconnect"], "strategy": prediction["strategy"],
            "k": prediction["k"], "measured_efficiency": measured_efficiency, "modelled_efficiency": mod,
            "error_points": mod - measured_efficiency, "rel_error": rel, "tolerance": tolerance,
            "within_tolerance": within,
            "verdict": "within tolerance" if within else
            f"MISS: the model is off by {rel:+.1%} (tolerance {tolerance:.0%}); its assumptions say what it leaves out"}
