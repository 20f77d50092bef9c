"""What the per-trial step-time breakdown costs: the same trial with sampling off and on, alternating.

    .venv/bin/python -m benchmarks.overhead.breakdown_cost [--rounds 3] [single:1 scratch:2 ddp:2 fsdp:2]

Sampled steps are kept out of the throughput window (breakdown.py), so their cost shows in the epoch: per trial,
samples x (a sampled step's wall, barriers and probe included - an unsampled step) / epoch seconds. Throughput
with sampling on and off is printed beside it (a difference inside the host's noise is no cost).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from benchmarks.common import base_cfg, ensure_data, host_line, parser, resolve_source, spread, trial
from pipeline.cli.types import count


def main():
    p = parser(__doc__)
    p.add_argument("--rounds", type=count("rounds"), default=3)
    p.add_argument(
        "--every",
        type=count("steps between samples"),
        default=10,
        help="breakdown sampling interval when on (default 10)",
    )
    p.add_argument("cases", nargs="*", default=["single:1", "scratch:2", "ddp:2", "fsdp:2"], help="STRATEGY:K")
    args = p.parse_args()
    source = resolve_source(args)
    ensure_data(args.data, source)
    print(host_line(), f"| data: {source}")
    cfg = base_cfg(args.data, source, "data.train_limit=12800", "data.test_limit=256", "train.warmup_steps=3")
    for case in args.cases:
        strategy, k = case.split(":")
        runs = {0: [], args.every: []}
        for _ in range(args.rounds):
            for every in runs:
                with tempfile.TemporaryDirectory() as tmp:
                    runs[every].append(
                        trial(
                            cfg,
                            Path(tmp) / "o",
                            strategy=strategy,
                            devices=int(k),
                            batch_size=128 * int(k),
                            breakdown_every=every,
                        )
                    )
        on = runs[args.every]
        cost = [
            m["breakdown"]["samples"]
            * (m["breakdown"]["sampled_wall_s"] - m["breakdown"]["timed_step_s"])
            / m["epoch_s"][0]
            for m in on
        ]
        print(
            f"{strategy} k={k}: off {spread([m['throughput_img_s'] for m in runs[0]])} img/s | every "
            f"{args.every}: {spread([m['throughput_img_s'] for m in on])} img/s; sampling adds "
            f"{statistics.median(cost):.1%} (min {min(cost):.1%}, max {max(cost):.1%}) to the epoch"
        )


if __name__ == "__main__":
    main()
