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
    broadcast           t = alpha(k) +            S / beta         (S = the tensor; a host without a measured
                                                                    broadcast uses its all-gather's alpha and beta)
    alpha(k) = alpha_ref * h(k) / h(k_ref): latency grows with the ring's steps h = 2(k-1) (all-reduce, scratch) or
    k-1 (all-gather, reduce-scatter, broadcast, dp copies); k_ref = the k it was measured at (a profile gives alpha
    per hop).

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
    + sharding    a row whose `shards` (pipeline/catalog.py) hold the optimizer state but not the parameters updates
                  only its shard, then every parameter tensor is broadcast from the rank that owns it, after the
                  step (ZeroRedundancyOptimizer._sync_params, parameters_as_bucket_view=False): nothing to hide behind.

Step time and efficiency:
    compute(k) = T1, or k * T1 where one process runs the k replicas one after another (scratch on a CPU host)
    C(k)       = sum of the collectives' times above
    exposed(k) = max(floor, C(k) - overlap * hideable)     hideable = backward_fraction * T1 (ddp), T1 (fsdp)
                 floor = the last bucket's all-reduce (ddp) / the first all-gather and the last reduce-scatter
                 (fsdp), plus the broadcasts after the step: they have no compute to hide behind. scratch and dp:
                 exposed = C (nothing runs alongside)
    T(k)       = compute(k) + exposed(k),   throughput = k * b / T(k)
    E_w(k)     = throughput(k) / (k * b / T1) = T1 / T(k)         (weak scaling: b fixed per device)

Assumptions (what the model leaves out, so what a miss points to):
  - overlap defaults to 0 (conservative; exact for a single bucket, and 1-thread CPU ranks run DDP's hook inline);
    backward_fraction (default 0.6: backward ~2x forward) only matters when overlap > 0;
  - per-image compute does not change with k: no contention between devices for shared cache, memory bandwidth or
    clocks, and no time lost to lockstep (every synchronous step waits for the slower rank's jitter);
  - no framework cost beyond what the k=1 trial already pays (FSDP's copy-in/out at k > 1, DDP's reducer);
  - beyond the measured k the host's collectives keep their bus bandwidth and their latency grows with the ring's
    steps; a profile's figures are nominal (experiments/interconnects/nominal.yaml), not measured on any machine here;
  - past one node (k > devices_per_node): intra-node figures (this host's measured collectives, or an intra-node
    profile) and inter-node ones (a nominal network profile: nothing here measures collectives between machines)
    are kept apart, and a collective spanning nodes runs as one flat ring bounded by its slowest link
    (Interconnect.seconds); NCCL's hierarchical/tree algorithms would send less over the network.
"""

from __future__ import annotations

import math

from pipeline import catalog

# the interconnects (intra-node, inter-node) live beside this module; these names are part of this one's API
from pipeline.scaling.interconnect import (  # noqa: F401
    BUS_FACTOR,
    HOPS,
    PROFILES_FILE,
    SCOPES,
    STAND_IN,
    Interconnect,
    from_collectives,
    load_profiles,
)

MIB = 1 << 20
DEFAULT_TOLERANCE = 0.10

ONE_PROCESS = ("copy_allreduce", "dp_gather_logits", "dp_gather_losses")  # patterns of one process's k devices
HOOK_BYTES = {"none": 1.0, "shm": 1.0, "fp16": 0.5, "bf16": 0.5}
ASSUMPTIONS = (
    "overlap of communication with backward as given (default 0: all communication exposed)",
    "per-image compute independent of k: no contention for shared cache/memory bandwidth, no lockstep jitter",
    "no framework cost beyond the k=1 trial's (FSDP copy-in/out, DDP reducer)",
    "collectives: bus bandwidth constant in k, latency growing with the ring's steps",
    "past one node: a flat ring through the nodes' links and the network, at the slowest link's pace",
)


# ----------------------------------------------------------------------------- what a strategy sends


def model_layout(model: str = "lenet") -> dict:
    """Parameter tensors of `model` in definition order, and its FSDP units (the blocks fsdp.py shards): a view of
    scaling/memory.py's layout, read from its cache file where `make setup` counted it (then no torch is loaded)."""
    from pipeline.scaling.memory import layout

    lay = layout(model)
    w = 4  # float32 parameters (under autocast too: the master weights)
    params = [{"name": n, "shape": list(s), "bytes": c * w} for n, s, c in zip(lay.names, lay.shapes, lay.numel)]
    units = [
        {"name": name, "shapes": [list(lay.shapes[i]) for i in idx], "bytes": sum(lay.numel[i] for i in idx) * w}
        for name, idx in zip(lay.unit_names, lay.units)
    ]
    return {"model": model, "params": params, "param_bytes": sum(p["bytes"] for p in params), "fsdp_units": units}


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


def step_collectives(
    strategy: str,
    k: int,
    layout: dict,
    per_device_batch: int = 256,
    bucket_cap_mb: float = 25.0,
    comm_hook: str = "none",
    accum_steps: int = 1,
    transport: str | None = None,
) -> list[dict]:
    """The collectives one step of `strategy` issues at k: [{"collective", "bytes", "count", "phase"}].

    count may be fractional (accum_steps: one all-reduce every a micro-steps). transport names the all-reduce that
    carries DDP's buckets (allreduce, or allreduce_shm for comm_hook=shm on one CPU host). The strategy's
    collective pattern is its catalog row's `comm` (pipeline/catalog.py), and its `shards` add what sharding
    issues (sharding_collectives)."""
    calls = _pattern_collectives(
        strategy, k, layout, per_device_batch, bucket_cap_mb, comm_hook, accum_steps, transport
    )
    return calls + sharding_collectives(strategy, layout)


def broadcasts_after_step(strategy: str) -> bool:
    """The row shards the optimizer state but replicates the parameters: each rank updates only its shard."""
    shards = catalog.spec(strategy).shards
    return "optimizer" in shards and "params" not in shards


def sharding_collectives(strategy: str, layout: dict) -> list[dict]:
    """What sharding the optimizer state over replicated parameters adds to a step: each rank updates the
    parameters it owns, then every parameter tensor is broadcast from its owner (ZeroRedundancyOptimizer)."""
    if not broadcasts_after_step(strategy):
        return []
    return [
        {"collective": "broadcast", "bytes": p["bytes"], "count": 1, "phase": "after step"} for p in layout["params"]
    ]


def _pattern_collectives(
    strategy, k, layout, per_device_batch, bucket_cap_mb, comm_hook, accum_steps, transport
) -> list[dict]:
    comm = comm_pattern(strategy)
    if comm == "bucket_allreduce":
        if comm_hook not in HOOK_BYTES:
            raise ValueError(f"comm_hook={comm_hook!r} is not modelled (modelled: {', '.join(HOOK_BYTES)})")
        name = transport or ("allreduce_shm" if comm_hook == "shm" else "allreduce")
        sizes = ddp_buckets([p["bytes"] for p in layout["params"]], bucket_cap_mb)
        return [
            {"collective": name, "bytes": int(s * HOOK_BYTES[comm_hook]), "count": 1 / accum_steps, "phase": "backward"}
            for s in sizes
        ]
    if comm == "shard_units":
        out = []
        for u in layout["fsdp_units"]:
            g = fsdp_gathered_bytes(u["shapes"], k)
            out += [
                {"collective": "allgather", "bytes": g, "count": 1, "phase": "forward", "unit": u["name"]},
                {"collective": "allgather", "bytes": g, "count": 1, "phase": "backward", "unit": u["name"]},
                {"collective": "reduce_scatter", "bytes": g, "count": 1, "phase": "backward", "unit": u["name"]},
            ]
        return out
    if comm == "copy_allreduce":
        return [
            {"collective": "scratch_allreduce", "bytes": p["bytes"], "count": 1, "phase": "after backward"}
            for p in layout["params"]
        ]
    if comm in ("dp_gather_logits", "dp_gather_losses"):
        x = per_device_batch * k * 28 * 28 * 4
        out_bytes = per_device_batch * k * 10 * 4 if comm == "dp_gather_logits" else k * 4
        return [
            {"collective": "dp_copy", "bytes": layout["param_bytes"], "count": 1, "phase": "replicate"},
            {"collective": "dp_scatter", "bytes": x, "count": 1, "phase": "scatter input"},
            {"collective": "dp_scatter", "bytes": out_bytes, "count": 1, "phase": "gather outputs"},
            {"collective": "dp_copy", "bytes": layout["param_bytes"], "count": 1, "phase": "reduce gradients"},
        ]
    if comm == "none":
        return []
    raise ValueError(f"strategy {strategy!r}: the communication pattern {comm!r} has no model")


# the collectives each communication pattern issues (step_collectives' names; allreduce_shm: comm_hook=shm)
PATTERN_COLLECTIVES = {
    "none": (),
    "copy_allreduce": ("scratch_allreduce",),
    "dp_gather_logits": ("dp_copy", "dp_scatter"),
    "dp_gather_losses": ("dp_copy", "dp_scatter"),
    "bucket_allreduce": ("allreduce", "allreduce_shm"),
    "shard_units": ("allgather", "reduce_scatter"),
}


def collectives_of(strategy: str) -> tuple[str, ...]:
    """Every collective a step of `strategy` may issue: its pattern's, and what its sharding adds."""
    extra = ("broadcast",) if broadcasts_after_step(strategy) else ()
    return PATTERN_COLLECTIVES[comm_pattern(strategy)] + extra


def comm_pattern(strategy: str) -> str:
    """The strategy's collective pattern (its catalog row's `comm`); ValueError for a name not in the catalog."""
    try:
        return catalog.spec(strategy).comm
    except catalog.UnknownStrategy as e:
        raise ValueError(f"strategy {strategy!r} has no communication model ({e})") from None


# ----------------------------------------------------------------------------- the projection


def predict(
    strategy: str,
    k: int,
    compute_s_per_image: float,
    interconnect: Interconnect,
    *,
    model: str = "lenet",
    per_device_batch: int = 256,
    bucket_cap_mb: float = 25.0,
    comm_hook: str = "none",
    accum_steps: int = 1,
    transport: str | None = None,
    serial_replicas: bool = False,
    overlap: float = 0.0,
    backward_fraction: float = 0.6,
    layout: dict | None = None,
    devices_per_node: int | None = None,
) -> dict:
    """Modelled step time, throughput and weak-scaling efficiency of `strategy` at k (see the module docstring).

    compute_s_per_image: the strategy's k=1 trial, 1 / (its images/s). serial_replicas: the k replicas run one after
    another in one process (scratch on a CPU host: the trial's parallel_devices is False). devices_per_node: the k
    devices sit on ceil(k / this) nodes, and past one node the collectives use the interconnect's inter-node
    figures too (Interconnect.seconds); None: one node."""
    if not 0 <= overlap <= 1 or not 0 <= backward_fraction <= 1:
        raise ValueError("overlap and backward_fraction are fractions in [0, 1]")
    nnodes = math.ceil(k / devices_per_node) if devices_per_node else 1
    if nnodes > 1 and comm_pattern(strategy) in ONE_PROCESS:
        raise ValueError(
            f"{strategy} runs its k devices in one process, which cannot span nodes (k={k}, nodes of "
            f"{devices_per_node})"
        )
    layout = layout or model_layout(model)
    t1 = per_device_batch * compute_s_per_image
    calls = step_collectives(strategy, k, layout, per_device_batch, bucket_cap_mb, comm_hook, accum_steps, transport)
    for c in calls:
        c["seconds"] = interconnect.seconds(c["collective"], c["bytes"], k, devices_per_node) * c["count"]
    comm = sum(c["seconds"] for c in calls)
    hideable, floor = 0.0, comm
    comm_kind = comm_pattern(strategy)
    after_step = sum(c["seconds"] for c in calls if c["phase"] == "after step")
    if comm_kind == "bucket_allreduce" and calls:
        last = next(c["seconds"] for c in reversed(calls) if c["phase"] == "backward")
        hideable, floor = backward_fraction * t1, last + after_step
    elif comm_kind == "shard_units" and calls:
        hideable = t1
        floor = calls[0]["seconds"] + next(c["seconds"] for c in reversed(calls) if c["collective"] == "reduce_scatter")
    exposed = max(min(floor, comm), comm - overlap * hideable)
    compute = k * t1 if serial_replicas else t1
    step = compute + exposed
    return {
        "modelled": True,
        "interconnect": interconnect.name,
        "interconnect_kind": interconnect.kind,
        "strategy": strategy,
        "model": model,
        "k": k,
        "nnodes": nnodes,
        "devices_per_node": devices_per_node,
        "links": "intra-node + inter-node" if nnodes > 1 else "intra-node",
        "per_device_batch": per_device_batch,
        "compute_s_per_image_k1": compute_s_per_image,
        "compute_s": compute,
        "comm_s": comm,
        "hideable_s": overlap * hideable,
        "exposed_comm_s": exposed,
        "step_s": step,
        "throughput_img_s": k * per_device_batch / step,
        "efficiency": t1 / step,
        "comm_bytes": sum(c["bytes"] * c["count"] for c in calls),
        "collectives": calls,
        "parameters": {
            "overlap": overlap,
            "backward_fraction": backward_fraction,
            "serial_replicas": serial_replicas,
            "bucket_cap_mb": bucket_cap_mb,
            "comm_hook": comm_hook,
            "accum_steps": accum_steps,
            "transport": transport,
        },
        "assumptions": list(ASSUMPTIONS),
    }


def check(prediction: dict, measured_efficiency: float, tolerance: float = DEFAULT_TOLERANCE) -> dict:
    """The model's error against a measured point: relative error of the efficiency, and whether it is within
    `tolerance` (default 10%). A miss is reported as a miss; nothing here adjusts the model."""
    mod = prediction["efficiency"]
    rel = (mod - measured_efficiency) / measured_efficiency
    within = abs(rel) <= tolerance
    return {
        "modelled": True,
        "interconnect": prediction["interconnect"],
        "strategy": prediction["strategy"],
        "k": prediction["k"],
        "measured_efficiency": measured_efficiency,
        "modelled_efficiency": mod,
        "error_points": mod - measured_efficiency,
        "rel_error": rel,
        "tolerance": tolerance,
        "within_tolerance": within,
        "verdict": "within tolerance"
        if within
        else f"MISS: the model is off by {rel:+.1%} (tolerance "
        f"{tolerance:.0%}); its assumptions say what it leaves out",
    }
