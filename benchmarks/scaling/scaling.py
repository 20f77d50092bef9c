"""Weak-scaling efficiency at k=2 (or every device) per CPU-capable strategy, measured side by side.

    .venv/bin/python -m benchmarks.scaling.scaling [--rounds 3] [--per-device-batch 256]

E_w(k) = T(k, k*b) / (k * T(1, b)) with T = images/s over steady-state steps, LeNet, per-device batch b.
Runs alternate k=1 and k=K for each strategy, so both see the same machine state. DDP-family strategies run twice:
with their default gradient transport (comm_hook=none: DDP's own all-reduce, Gloo on CPU) and, on a CPU host, with
the shared-memory hook (comm_hook=shm, pipeline/strategies/shm_allreduce.py), so the transport's share of the
efficiency is measured, not assumed.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks.common import (
    base_cfg,
    ensure_data,
    host_line,
    med,
    parser,
    probe,
    ratio,
    resolve_source,
    show,
    spread,
    trial,
)
from pipeline.cli.types import count
from pipeline.strategies import STRATEGIES


def main():
    p = parser(__doc__)
    p.add_argument("--rounds", type=count("rounds"), default=3)
    p.add_argument("--per-device-batch", type=count("per-device batch"), default=256)
    p.add_argument("--steps", type=count("steps"), default=150, help="steady-state steps per run")
    p.add_argument("--model", default="lenet")
    p.add_argument("--strategies", nargs="*", default=None)
    p.add_argument("--no-shm", action="store_true", help="skip the ddp/ddp_amp runs with comm_hook=shm (shared memory)")
    args = p.parse_args()
    host = probe()
    k = min(2, host.n) if host.kind == "cpu" else host.n
    source = resolve_source(args)
    ensure_data(args.data, source)
    print(host_line(), f"| data: {source}")
    b = args.per_device_batch
    names = args.strategies or [
        s for s, c in STRATEGIES.items() if s != "single" and c.unavailable_reason(host) is None
    ]
    variants = [(s, s, ()) for s in names]
    if not args.no_shm and host.kind == "cpu":  # shm needs every rank on one CPU host
        variants += [
            (f"{s} comm_hook=shm (shared memory)", s, ("train.comm_hook=shm",))
            for s in names
            if s in ("ddp", "ddp_amp")
        ]
    for label, s, sets in variants:
        one, many, hooks = [], [], set()
        for r in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                for kk, out in ((1, one), (k, many)):
                    cfg = base_cfg(
                        args.data,
                        source,
                        f"data.train_limit={kk * b * (args.steps + 5)}",
                        "data.test_limit=500",
                        "train.warmup_steps=5",
                        *sets,
                    )
                    m = trial(cfg, Path(tmp) / f"{kk}", model=args.model, strategy=s, devices=kk, batch_size=kk * b)
                    out.append(m["throughput_img_s"])
                    if m["comm_hook_used"]:  # ddp, ddp_amp: the gradient transport the trial used
                        hooks.add(f"k={kk}: {m['comm_hook_used']}")
        eff = ratio(ratio(med(many), med(one)), k)  # None where either side timed nothing
        note = (
            ""
            if STRATEGIES[s].parallel_on_cpu or host.kind == "cuda"
            else "  (replicas run one after another in one process: not parallel on CPU)"
        )
        note += f"  [gradient transport {', '.join(sorted(hooks))}]" if hooks else ""
        print(
            f"{label}: T(1, B={b}) {spread(one)} img/s; T({k}, B={k * b}) {spread(many)} img/s; "
            f"weak-scaling efficiency E_w({k}) = {show(eff, '.1%')}{note}",
            flush=True,
        )


if __name__ == "__main__":
    main()
