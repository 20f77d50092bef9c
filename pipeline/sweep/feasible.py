"""Whether this host (or one node of the cluster) runs a point of the sweep: enough devices, and a predicted peak
memory that fits each device. A point it cannot run is skipped with the reason (Infeasible), never run into an error.
"""

from __future__ import annotations

from pipeline.sweep import slurm
from pipeline.trial.launch import Infeasible, check_feasible


def check_memory_fits(tcfg, host) -> None:
    """Raise Infeasible where the memory model (pipeline/scaling/memory.py) puts this point's peak per device above
    the device's memory: the point is skipped with the reason instead of run into an out-of-memory error. GPUs only:
    a CPU host's processes share the host's memory, with no per-device limit to check against."""
    if host.kind != "cuda":
        return
    import torch

    from pipeline.scaling import memory
    from pipeline.scaling.device import fixed_cost

    t = tcfg.train
    device = min(torch.cuda.get_device_properties(i).total_memory for i in range(min(t.devices, host.n)))
    fixed = fixed_cost(torch.cuda.get_device_name(0))  # doctor's measurement where kept, else assumed
    knobs = {
        "grad_as_bucket_view": t.grad_as_bucket_view,
        "autocast": t.autocast or None,
        "backend": "gloo" if t.devices > host.n else "nccl",  # ranks sharing a GPU run Gloo
    }
    p = memory.predict(
        t.strategy,
        t.model,
        t.devices,
        t.batch_size,
        t.optimizer,
        basis="gpu",
        anchors=memory.COUNT_ANCHORS,
        **knobs,
    )
    total = memory.device_total(p, fixed.bytes)
    if total > device:
        g = memory.GIB
        largest = memory.largest_batch(
            t.strategy, t.model, t.devices, device, t.optimizer, fixed.bytes, basis="gpu", **knobs
        )
        raise Infeasible(
            f"predicted need {total / g:.1f} GiB per device > {device / g:.1f} GiB on {host.name}: modelled (the "
            f"memory model's step peak above resident + the resident model, data and buckets, x "
            f"{memory.RESERVED_FACTOR:.2f} for the allocator, assumed) + the fixed cost (context "
            f"{fixed.context.kind}, workspaces {fixed.workspaces.kind}), device "
            f"{p.rank}; the largest batch it fits at k={t.devices} is {largest}"
        )


def check_point(cfg, host, tcfg) -> None:
    """Raise Infeasible where this host cannot run the point whose Config is `tcfg`: more devices than it has (than
    one node has, under SLURM), or a predicted peak above its devices' memory (check_memory_fits)."""
    check_feasible(slurm.sized(cfg, tcfg), slurm.cluster_host(cfg, host))  # SLURM: one node's devices
    check_memory_fits(tcfg, host)
