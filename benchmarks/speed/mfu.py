"""Model FLOPs utilisation: FLOPs per training image (torch.utils.flop_counter) x images/s / measured matmul peak.

    .venv/bin/python -m benchmarks.speed.mfu [--model lenet] [--batch 256]

Peak: fp32 GEMM on one thread per CPU device, or bf16 GEMM on a GPU, measured here, now (not a datasheet figure).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.common import base_cfg, ensure_data, host_line, med, parser, probe, resolve_source, trial
from pipeline.cli.types import count
from pipeline.models import build_model


def flops_per_image(model_name: str, batch: int, device) -> float:
    model = build_model(model_name, 0).to(device)
    x = torch.randn(batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    with FlopCounterMode(display=False) as fc:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    return fc.get_total_flops() / batch


def matmul_peak(device, n: int, dtype, reps: int = 20) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(5):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(reps):
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 * reps / best


def main():
    p = parser(__doc__)
    p.add_argument("--model", default=None, help="default: lenet on CPU, resnet18 on GPU")
    p.add_argument("--batch", type=count("batch size"), default=256)
    p.add_argument("--rounds", type=count("rounds"), default=3)
    args = p.parse_args()
    host = probe()
    model = args.model or ("lenet" if host.kind == "cpu" else "resnet18")
    device = torch.device("cuda", 0) if host.kind == "cuda" else torch.device("cpu")
    torch.set_num_threads(1)
    if host.kind == "cuda":
        peak, what = matmul_peak(device, 8192, torch.bfloat16), "bf16 GEMM 8192^3, one GPU"
    else:
        peak, what = matmul_peak(device, 1024, torch.float32), "fp32 GEMM 1024^3, one thread (one CPU device)"
    fpi = flops_per_image(model, args.batch, device)
    source = resolve_source(args)
    ensure_data(args.data, source)
    print(host_line(), f"| data: {source}")
    print(f"peak: {peak / 1e9:,.1f} GFLOP/s ({what})")
    print(f"{model}: {fpi / 1e6:,.2f} MFLOP per training image (forward + backward, flop_counter)")
    cfg = base_cfg(
        args.data, source, f"data.train_limit={args.batch * 65}", "data.test_limit=1000", "train.warmup_steps=5"
    )
    rows = [("single", 1, args.batch)] + ([("ddp", host.n, args.batch * host.n)] if host.n > 1 else [])
    for strategy, k, batch in rows:
        with tempfile.TemporaryDirectory() as tmp:
            tput = med(
                [
                    trial(cfg, Path(tmp) / str(r), model=model, strategy=strategy, devices=k, batch_size=batch)[
                        "throughput_img_s"
                    ]
                    for r in range(args.rounds)
                ]
            )
        if tput is None:  # no round timed a step: no figure, said as such
            print(f"{strategy} k={k} B={batch}: no timed step (every step inside the warm-up): no MFU")
            continue
        achieved = fpi * tput
        print(
            f"{strategy} k={k} B={batch}: {tput:,.0f} img/s x {fpi / 1e6:.2f} MFLOP = "
            f"{achieved / 1e9:,.1f} GFLOP/s = MFU {achieved / (peak * k):.1%} of {k} x peak"
        )


if __name__ == "__main__":
    main()
