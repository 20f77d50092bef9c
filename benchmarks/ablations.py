"""What each speed-up of the training step is worth, side by side: channels-last activations and glibc keeping
freed tensor memory (pipeline/devices.py::keep_freed_memory), each on and off, alternating, every run in a fresh
process (as every trial's worker is).

    .venv/bin/python benchmarks/ablations.py [--rounds 3]

LeNet, `single`, B=256, one core, steady-state images/s.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import base_cfg, data_args, ensure_data, host_line, med, resolve_source, spread, trial

VARIANTS = {"both on (default)": ("true", "1"), "channels_last off": ("false", "1"),
            "malloc tuning off": ("true", "0"), "both off": ("false", "0")}


def child(data: Path, source: str, channels_last: str) -> None:
    cfg = base_cfg(data, source, "data.train_limit=16640", "data.test_limit=500", "train.warmup_steps=5",
                   f"train.channels_last={channels_last}")
    with tempfile.TemporaryDirectory() as tmp:
        print(trial(cfg, Path(tmp), strategy="single", devices=1, batch_size=256)["throughput_img_s"])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    data_args(p)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    source = resolve_source(args)
    if args.child is not None:
        return child(args.data, source, args.child)
    ensure_data(args.data, source)
    print(host_line(), f"| data: {source}")
    res = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name, (cl, malloc) in VARIANTS.items():
            out = subprocess.run([sys.executable, "-W", "ignore", __file__, "--child", cl, "--data", str(args.data),
                                  "--source", source], capture_output=True, text=True, check=True,
                                 env={**os.environ, "PARALLAX_MALLOC_TUNING": malloc}).stdout
            res[name].append(float(out.strip().splitlines()[-1]))
    base = med(res["both on (default)"])
    for name, xs in res.items():
        print(f"{name}: {spread(xs)} img/s -> {med(xs) / base:.2f}x the default")


if __name__ == "__main__":
    main()
