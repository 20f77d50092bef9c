"""What bf16 autocast costs a LeNet training step on this CPU: the same step in fp32 and under autocast, alternating.

    .venv/bin/python benchmarks/amp_cost.py [--batch 64 128] [--steps 30] [--rounds 5]

One thread (as each sweep worker process has), channels-last input, SGD, random data: the step's cost does not depend
on the values. Prints the host's ISA and whether bf16 is native (capabilities.py) beside the ratio, so a figure from
one host is never read as another's: on an AVX2-only CPU bf16 is emulated (the issue's user measured ~7x), on an
AVX-512-BF16/AMX CPU it is native.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
from torch import nn

from common import host_line

from pipeline.capabilities import cpu_capabilities
from pipeline.models import build_model


def step_s(batch: int, steps: int, amp: bool) -> float:
    model = build_model("lenet", 0, "default").to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(batch, 1, 28, 28).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,))
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if amp else contextlib.nullcontext
    for i in range(steps + 3):  # 3 warm-up steps
        if i == 3:
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with ctx():
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    return (time.perf_counter() - t0) / steps


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, nargs="+", default=[64, 128], help="per-process batches (default 64 128)")
    p.add_argument("--steps", type=int, default=30, help="timed steps per measurement (default 30)")
    p.add_argument("--rounds", type=int, default=5, help="fp32/bf16 pairs per batch (default 5)")
    args = p.parse_args()
    torch.set_num_threads(1)
    cpu = cpu_capabilities()
    print(host_line(), f"| ISA {','.join(cpu['isa']) or 'none'} | bf16 {cpu['bf16']} ({cpu['bf16_why']}) | "
          f"torch CPU capability {cpu['torch_cpu_capability']}")
    for b in args.batch:
        fp32, bf16 = [], []
        for _ in range(args.rounds):
            fp32.append(step_s(b, args.steps, amp=False))
            bf16.append(step_s(b, args.steps, amp=True))
        f, h = statistics.median(fp32), statistics.median(bf16)
        print(f"b={b}: fp32 {f * 1e3:.2f} ms/step, bf16 autocast {h * 1e3:.2f} ms/step, ratio bf16/fp32 {h / f:.2f} "
              f"(median of {args.rounds} alternating pairs of {args.steps} steps)")


if __name__ == "__main__":
    main()
