"""Is a k=2 slowdown the hardware's or the strategy's? Two independent `single` trainings pinned one per core,
alone and at the same time, side by side.

    .venv/bin/python -m benchmarks.scaling.contention [--rounds 2]

If each keeps its solo images/s when both run, the cores do not slow each other down (shared cache, memory
bandwidth, frequency) and any loss in a k=2 trial belongs to the strategy's communication and synchronisation.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import base_cfg, ensure_data, host_line, parser, resolve_source, trial
from pipeline.cli.types import count


def one(core: int, data: Path, source: str) -> float:
    os.sched_setaffinity(0, {core})
    cfg = base_cfg(data, source, "data.train_limit=33280", "data.test_limit=500", "train.warmup_steps=5")
    with tempfile.TemporaryDirectory() as tmp:
        return trial(cfg, Path(tmp), strategy="single", devices=1, batch_size=256)["throughput_img_s"]


def spawn(core: int, args, source):
    return subprocess.Popen(
        [
            sys.executable,
            "-W",
            "ignore",
            "-m",
            __spec__.name,
            "--child",
            str(core),
            "--data",
            str(args.data),
            "--source",
            source,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def main():
    p = parser(__doc__)
    p.add_argument("--rounds", type=count("rounds"), default=2)
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    source = resolve_source(args)
    if args.child is not None:
        print(one(args.child, args.data, source))
        return
    ensure_data(args.data, source)
    print(host_line(), f"| data: {source}")
    for r in range(args.rounds):
        alone = float(spawn(0, args, source).communicate()[0])
        procs = [spawn(c, args, source) for c in (0, 1)]
        together = [float(q.communicate()[0]) for q in procs]
        print(
            f"round {r + 1}: alone on core 0 {alone:,.0f} img/s; together: core 0 {together[0]:,.0f}, core 1 "
            f"{together[1]:,.0f} img/s -> {min(together) / alone:.1%} of the solo speed",
            flush=True,
        )


if __name__ == "__main__":
    main()
