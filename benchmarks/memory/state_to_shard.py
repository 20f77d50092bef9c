"""What ZeRO-1 and FSDP save per device once the optimizer keeps state: per-device peaks of ddp, zero1 and fsdp.

    .venv/bin/python -m benchmarks.memory.state_to_shard [--optimizers sgd,adamw] [--devices 2] [--batch 256]
        [--bucket-copies] [--data DIR] [--source synthetic]

Real trials on this host, one per (optimizer, strategy): LeNet, k devices, 2 steps; the figure is each device's
peak as the trial records it (on CPU: MemTracker over the probe step, optimizer state included; docs/metrics.md).
Printed per optimizer: every strategy's per-device peaks in MiB and, for zero1 and fsdp, the saving against ddp on
their largest device and over all devices together. `--bucket-copies` also runs ddp with
train.grad_as_bucket_view=false (the default is on): DDP then keeps its gradients and a bucket copy of them, one set
of gradients more per device (MemTracker counts the buckets: measure/memory.py).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks.common import base_cfg, ensure_data, host_line, parser, resolve_source, trial
from pipeline.cli.types import count
from pipeline.config.schema import DEVICES_MAX

LR = {"sgd": 0.1, "sgd_momentum": 0.1, "adamw": 0.001}
MIB = 2**20


def main():
    p = parser(__doc__)
    p.add_argument("--optimizers", default="sgd,adamw", help="comma-separated: sgd, sgd_momentum, adamw")
    p.add_argument("--devices", type=count("devices", hi=DEVICES_MAX), default=2)
    p.add_argument("--batch", type=count("batch size"), default=256, help="global batch")
    p.add_argument("--bucket-copies", action="store_true", help="also ddp with train.grad_as_bucket_view=false")
    args = p.parse_args()
    source = resolve_source(args)
    ensure_data(args.data, source)
    k, batch = args.devices, args.batch
    cfg = base_cfg(
        args.data,
        source,
        f"data.train_limit={batch * 4}",
        "data.test_limit=128",
        "train.max_steps=2",
        "train.warmup_steps=1",
        "train.oversubscribe=true",
        "train.interference_threshold=1e6",
    )
    print(host_line(), f"| data: {source}", flush=True)
    runs = [("ddp", {}), ("zero1", {}), ("fsdp", {})]
    if args.bucket_copies:
        runs.append(("ddp", {"grad_as_bucket_view": False}))
    with tempfile.TemporaryDirectory() as tmp:
        for opt in [o.strip() for o in args.optimizers.split(",") if o.strip()]:
            peaks = {}
            for strategy, extra in runs:
                label = strategy + (" (bucket copies)" if extra else "")
                m = trial(
                    cfg,
                    Path(tmp) / f"{opt}-{label}",
                    strategy=strategy,
                    devices=k,
                    batch_size=batch,
                    lr=LR[opt],
                    optimizer=opt,
                    **extra,
                )
                peaks[label] = [b / MIB for b in m["peak_mem_bytes"]]
                print(
                    f"{opt:12s} {label:20s} per device " + ", ".join(f"{v:.3f}" for v in peaks[label]) + " MiB",
                    flush=True,
                )
            base = peaks["ddp"]
            for s in ("zero1", "fsdp"):
                largest, total = max(base) - max(peaks[s]), sum(base) - sum(peaks[s])
                print(
                    f"{opt:12s} {s} saves against ddp: {largest:.3f} MiB on its largest device, {total:.3f} MiB "
                    f"over all {k} ({100 * largest / max(base):.1f}% of ddp's largest)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
