"""What each speed-up of the training step is worth, side by side: channels-last activations, glibc keeping
freed tensor memory (pipeline/host/devices.py::keep_freed_memory) and in-place ReLUs (pipeline/models.py), each on and
off, alternating, every run in a fresh process (as every trial's worker is). The last variant runs two trainings
at once, one per core, with and without in-place ReLUs: what the shared cache and memory cost either way.

    .venv/bin/python -m benchmarks.speed.ablations [--rounds 3]

LeNet, `single`, B=256, one core per training, steady-state images/s (of the slower one when two run).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import base_cfg, med, ratio, show, spread, trial, variants_in_fresh_processes

# name: (train.channels_last, PARALLAX_MALLOC_TUNING, in-place ReLUs, trainings at once)
VARIANTS = {
    "all on (default)": ("true", "1", "1", 1),
    "channels_last off": ("false", "1", "1", 1),
    "malloc tuning off": ("true", "0", "1", 1),
    "channels_last and malloc tuning off": ("false", "0", "1", 1),
    "in-place ReLU off": ("true", "1", "0", 1),
    "default, 2 at once (one per core)": ("true", "1", "1", 2),
    "in-place ReLU off, 2 at once": ("true", "1", "0", 2),
}


def _relu_not_in_place() -> None:
    """Benchmark only: build the models with out-of-place ReLUs (the "in-place ReLU off" variants)."""
    import pipeline.trial.loop

    build = pipeline.trial.loop.build_model

    def build_out_of_place(*a, **k):
        model = build(*a, **k)
        for m in model.modules():
            if hasattr(m, "inplace"):
                m.inplace = False
        return model

    pipeline.trial.loop.build_model = build_out_of_place


def child(data: Path, source: str, channels_last: str) -> None:
    if os.environ.get("BENCH_RELU_INPLACE") == "0":
        _relu_not_in_place()
    if os.environ.get("BENCH_CORE"):
        os.sched_setaffinity(0, {int(os.environ["BENCH_CORE"])})
    cfg = base_cfg(
        data,
        source,
        "data.train_limit=16640",
        "data.test_limit=500",
        "train.warmup_steps=5",
        f"train.channels_last={channels_last}",
    )
    with tempfile.TemporaryDirectory() as tmp:
        print(trial(cfg, Path(tmp), strategy="single", devices=1, batch_size=256)["throughput_img_s"])


def main():
    started = variants_in_fresh_processes(__doc__, child)
    if started is None:
        return
    args, source = started
    res = {name: [] for name in VARIANTS}
    cores = sorted(os.sched_getaffinity(0))
    for _ in range(args.rounds):
        for name, (cl, malloc, inplace, n) in VARIANTS.items():
            procs = [
                subprocess.Popen(
                    [
                        sys.executable,
                        "-W",
                        "ignore",
                        "-m",
                        __spec__.name,
                        "--child",
                        cl,
                        "--data",
                        str(args.data),
                        "--source",
                        source,
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                    env={
                        **os.environ,
                        "PARALLAX_MALLOC_TUNING": malloc,
                        "BENCH_RELU_INPLACE": inplace,
                        "BENCH_CORE": str(cores[i % len(cores)]),
                    },
                )
                for i in range(n)
            ]
            outs = [q.communicate()[0] for q in procs]
            if any(q.returncode for q in procs):
                sys.exit(f"variant {name!r} failed")
            res[name].append(min(float(o.strip().splitlines()[-1]) for o in outs))  # the slower of the two
    base = med(res["all on (default)"])
    for name, xs in res.items():
        print(f"{name}: {spread(xs)} img/s -> {show(ratio(med(xs), base), '.2f')}x the default")


if __name__ == "__main__":
    main()
