"""What channels_last weights at use are worth to FSDP on CPU, side by side: FSDP2 keeps its parameters contiguous,
and oneDNN's convolutions take a slower path with NHWC inputs beside a contiguous weight. Each `fsdp` trial runs with
its convolutions taking a channels_last copy of the weight at each call (the default, pipeline/models.py
`channels_last_at_use`) and without it (the parameters' own layout), beside `single` (channels_last parameters), at
k=1 and k=2, alternating, every trial in a fresh process.

    .venv/bin/python -m benchmarks.speed.fsdp_layout [--rounds 3]

LeNet, B=128 per device, steady-state images/s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import base_cfg, med, ratio, show, spread, trial, variants_in_fresh_processes

# name: (strategy, devices, global batch, convolutions take channels_last weights at use)
VARIANTS = {
    "single k=1": ("single", 1, 128, "1"),
    "fsdp k=1, channels_last at use (default)": ("fsdp", 1, 128, "1"),
    "fsdp k=1, parameters' own layout": ("fsdp", 1, 128, "0"),
    "fsdp k=2, channels_last at use (default)": ("fsdp", 2, 256, "1"),
    "fsdp k=2, parameters' own layout": ("fsdp", 2, 256, "0"),
}


def child(data: Path, source: str, variant: str) -> None:
    strategy, devices, batch, at_use = VARIANTS[variant]
    if at_use == "0":  # benchmark only: the trial's model without the layout change (ranks are forked: they inherit it)
        import pipeline.trial.loop

        pipeline.trial.loop.channels_last_at_use = lambda model, device_type: model
    cfg = base_cfg(
        data,
        source,
        "data.train_limit=12800",
        "data.test_limit=500",
        "train.epochs=1",
        "train.warmup_steps=5",
        "train.channels_last=true",
        "train.start_method=fork",
    )
    with tempfile.TemporaryDirectory() as tmp:
        r = trial(cfg, Path(tmp), strategy=strategy, devices=devices, batch_size=batch)
        print(r["throughput_img_s"])


def main():
    started = variants_in_fresh_processes(__doc__, child)
    if started is None:
        return
    args, source = started
    res = {name: [] for name in VARIANTS}
    for r in range(args.rounds):
        for name in VARIANTS:
            cmd = [sys.executable, "-W", "ignore", "-m", __spec__.name, "--child", name]
            out = subprocess.run(
                [*cmd, "--data", str(args.data), "--source", source], capture_output=True, text=True, env=os.environ
            )
            if out.returncode:
                sys.exit(f"variant {name!r} failed:\n{out.stderr[-2000:]}")
            res[name].append(float(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}: {name}: {res[name][-1]:,.0f} img/s", file=sys.stderr, flush=True)
    for k in (1, 2):
        base = med(res[f"fsdp k={k}, parameters' own layout"])
        for name, xs in res.items():
            if f"k={k}" in name:
                print(
                    f"{name}: {spread(xs)} img/s -> {show(ratio(med(xs), base), '.2f')}x fsdp k={k} "
                    "in its parameters' layout"
                )


if __name__ == "__main__":
    main()
