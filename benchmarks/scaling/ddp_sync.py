"""Where does `ddp` lose time at k=2 on a CPU host? Two 1-thread ranks pinned one per core, measured side by side.

    .venv/bin/python -m benchmarks.scaling.ddp_sync [--rounds 12] [--block 20]

1. The gradient all-reduce alone (LeNet's 129,068 fp32 gradients), over Gloo's TCP loopback and over the shared-
   memory transport (comm_hook=shm, one CPU host): back to back, and right after 60 ms of computation, which is
   how DDP calls it (once per step, after backward).
2. One LeNet step at per-device batch 256, in blocks of `--block` steps, alternating within one process group:
   rank 0 alone (the k=1 reference, rank 1 idle), rank 1 alone (is one core slower?), both ranks without any
   communication (what the shared cache
   and memory cost), both with a barrier per step (what lockstep costs: each step waits for the slower rank),
   DDP over shared memory and DDP over Gloo. Efficiency = alone / pair step time.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid

from benchmarks.common import host_line, parser
from pipeline.cli.types import count


def _rank(rounds: int, block: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch import nn

    from pipeline.host.devices import keep_freed_memory
    from pipeline.models import build_model
    from pipeline.strategies import shm_allreduce

    torch.set_num_threads(1)
    keep_freed_memory()
    rank = int(os.environ["RANK"])
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})
    dist.init_process_group("gloo")
    n_grad = 129_068
    out: dict = {}
    # --- 1. the all-reduce alone
    buf, ar = torch.zeros(n_grad), shm_allreduce.ShmAllreduce(4 * n_grad, timeout_s=60)
    a = torch.randn(256, 256)
    for name, fn in (("gloo", lambda: dist.all_reduce(buf)), ("shm", lambda: ar(buf))):
        for mode in ("back to back", "after 60 ms of compute"):
            ts = []
            for i in range(60):
                dist.barrier()
                if mode != "back to back":
                    t = time.perf_counter()
                    while time.perf_counter() - t < 0.06:
                        a @ a
                t = time.perf_counter()
                fn()
                if i >= 10:
                    ts.append(time.perf_counter() - t)
            out[f"allreduce {name}, {mode}"] = ts
    # --- 2. the step, alone and in pairs
    crit = nn.CrossEntropyLoss()
    x = torch.randn(256, 1, 28, 28).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (256,))

    def model(kind):
        m = build_model("lenet", 0).to(memory_format=torch.channels_last)
        if kind.startswith("ddp"):
            m = nn.parallel.DistributedDataParallel(m)
            if kind == "ddp, shared memory":
                m.register_comm_hook(
                    shm_allreduce.ShmAllreduce(4 * n_grad, timeout_s=60), shm_allreduce.shm_allreduce_hook
                )
        return m, torch.optim.SGD(m.parameters(), lr=0.01)

    kinds = [
        "alone (rank 0)",
        "alone (rank 1)",
        "pair, no communication",
        "pair, barrier per step",
        "ddp, shared memory",
        "ddp, gloo",
    ]
    setups = {k: model(k) for k in kinds}
    barrier = shm_allreduce.ShmAllreduce(64, timeout_s=60)
    one = torch.zeros(1)
    for r in range(rounds + 1):
        for k in kinds:
            m, opt = setups[k]
            dist.barrier()
            t = time.perf_counter()
            if not k.startswith("alone") or k == f"alone (rank {rank})":
                for _ in range(block):
                    s = time.perf_counter()
                    opt.zero_grad(set_to_none=True)
                    crit(m(x), y).backward()
                    opt.step()
                    if k == "pair, barrier per step":
                        barrier(one)
                    if r and k.startswith("alone"):
                        out.setdefault(f"steps {k}", []).append(time.perf_counter() - s)
            if r:
                out.setdefault(k, []).append((time.perf_counter() - t) / block)
    dist.barrier()
    dist.destroy_process_group()
    return out


def main():
    p = parser(__doc__, data=False)
    p.add_argument("--rounds", type=count("rounds"), default=12)
    p.add_argument("--block", type=count("steps per block"), default=20, help="steps per timed block")
    args = p.parse_args()
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    print(host_line())
    lc = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=2,
        run_id=uuid.uuid4().hex[:8],
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=0,
        start_method="fork",
        monitor_interval=0.1,
    )
    res = elastic_launch(lc, _rank)(args.rounds, args.block)
    r0, r1 = res[0], res[1]
    print("1. all-reduce of 129,068 fp32 gradients between the two ranks (rank 0's view, ms):")
    for k in [k for k in r0 if k.startswith("allreduce")]:
        xs = sorted(v * 1e3 for v in r0[k])
        print(f"   {k[10:]:36s} median {statistics.median(xs):6.2f}  p90 {xs[int(0.9 * len(xs))]:6.2f}")
    alone = statistics.median(r0["alone (rank 0)"])
    print(
        f"2. LeNet step, per-device batch 256 ({args.rounds} rounds of {args.block} steps; "
        f"slower rank's median; efficiency = rank 0 alone / this):"
    )
    for k in [
        "alone (rank 0)",
        "alone (rank 1)",
        "pair, no communication",
        "pair, barrier per step",
        "ddp, shared memory",
        "ddp, gloo",
    ]:
        t = {"alone (rank 0)": alone, "alone (rank 1)": statistics.median(r1["alone (rank 1)"])}.get(k) or max(
            statistics.median(r0[k]), statistics.median(r1[k])
        )
        print(f"   {k:26s} {t * 1e3:6.2f} ms/step  -> {alone / t:6.1%}")
    for rank, r in ((0, r0), (1, r1)):
        xs = sorted(v * 1e3 for v in r[f"steps alone (rank {rank})"])
        print(
            f"   rank {rank} alone, single steps: median {statistics.median(xs):.2f} ms, "
            f"stdev {statistics.stdev(xs):.2f} ms, p95 {xs[int(0.95 * len(xs))]:.2f} ms (n={len(xs)})"
        )


if __name__ == "__main__":
    main()
