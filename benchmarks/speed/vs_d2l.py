"""Parallax's training vs the seeds' own recipe (../shared/peers/d2l_reference.py), side by side, alternating.

    .venv/bin/python -m benchmarks.speed.vs_d2l [--rounds 3] [--batches 60] [--peer PATH]

The reference script lives beside the repository (../shared/peers/, as in CI's checkout); in a clone elsewhere
pass its path with --peer.

Same model, same data files, same batch size, same host. The reference (torchvision dataset + ToTensor +
DataLoader with 4 workers, fp32) reports images/s over its second epoch; ours reports images/s over
steady-state steps. CPU: LeNet at B=256 (`single` and the best CPU strategy, `ddp` on every core). GPU: ResNet-18
at B=256 and 512.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import (
    REPO,
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

PEER = REPO.parent / "shared" / "peers" / "d2l_reference.py"


def d2l(peer: Path, data: Path, model: str, batch: int, batches: int) -> float:
    proc = subprocess.run(
        [sys.executable, str(peer), str(data), model, str(batch), "0.1", "2", str(batches)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode:
        sys.exit(f"the d2l reference ({peer}) failed with exit code {proc.returncode}:\n{proc.stderr[-2000:]}")
    return float(re.findall(r"epoch 2: [\d.]+ s, (\d+) img/s", proc.stdout)[-1])


def main():
    p = parser(__doc__)
    p.add_argument("--rounds", type=count("rounds"), default=3)
    p.add_argument(
        "--batches", type=count("batches"), default=60, help="batches per epoch for both (steady-state window)"
    )
    p.add_argument("--peer", type=Path, default=PEER, help=f"the seeds' reference script (default {PEER})")
    args = p.parse_args()
    if not args.peer.is_file():
        p.error(
            f"no reference script at {args.peer}: it ships in the project's shared/peers/, beside the "
            f"repository; pass its path with --peer"
        )
    source = resolve_source(args)
    ensure_data(args.data, source)
    host = probe()
    cases = [("lenet", 256)] if host.kind == "cpu" else [("resnet18", 256), ("resnet18", 512)]
    print(host_line(), f"| data: {source}")
    for model, batch in cases:
        ours_single, ours_best, ref = [], [], []
        best_k = host.n
        for r in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                cfg = base_cfg(
                    args.data,
                    source,
                    f"data.train_limit={batch * (args.batches + 5)}",
                    "data.test_limit=1000",
                    "train.warmup_steps=5",
                    "train.epochs=1",
                )
                ours_single.append(
                    trial(cfg, Path(tmp) / "s", model=model, batch_size=batch, strategy="single", devices=1)[
                        "throughput_img_s"
                    ]
                )
                if best_k > 1:
                    ours_best.append(
                        trial(
                            cfg, Path(tmp) / "d", model=model, batch_size=batch * best_k, strategy="ddp", devices=best_k
                        )["throughput_img_s"]
                    )
            ref.append(d2l(args.peer, args.data, model, batch, args.batches))
            print(
                f"  round {r + 1}: single {ours_single[-1]:,.0f} img/s"
                + (f", ddp k={best_k} {ours_best[-1]:,.0f} img/s" if ours_best else "")
                + f", d2l recipe {ref[-1]:,.0f} img/s",
                flush=True,
            )
        print(f"{model} B={batch}: d2l recipe {spread(ref)} img/s")
        print(
            f"{model} B={batch}: parallax single (1 device) {spread(ours_single)} img/s "
            f"-> ratio {show(ratio(med(ours_single), med(ref)), '.2f')}x"
        )
        if ours_best:
            print(
                f"{model} B={batch}/device: parallax ddp k={best_k} (every device) {spread(ours_best)} img/s "
                f"-> ratio {show(ratio(med(ours_best), med(ref)), '.2f')}x"
            )


if __name__ == "__main__":
    main()
