"""What bf16 (or fp16) autocast costs a LeNet training step on this CPU: the same step in fp32 and under autocast,
alternating.

    .venv/bin/python -m benchmarks.speed.amp_cost [--batch 64 128] [--steps 30] [--rounds 5] [--isa-cap AVX2 ...]
                                            [--dtype bf16|fp16]

One thread (as each sweep worker process has), channels-last input, SGD, random data: the step's cost does not depend
on the values. Prints the host's ISA and whether bf16 is native (capabilities.py) beside the ratio, so a figure from
one host is never read as another's: on an AVX2-only CPU bf16 is emulated (~7x slower, measured on such a host), on an
AVX-512-BF16/AMX CPU it is native.

`--isa-cap AVX2` measures the same pairs again under oneDNN's ISA cap (ONEDNN_MAX_CPU_ISA, read once per process,
so each capped pair runs in its own process), alternating with the uncapped pairs in one run: how an AVX-512-BF16
host shows what an AVX2-only CPU does to bf16, side by side with what it does itself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from torch import nn

from benchmarks.common import host_line, parser
from pipeline.cli.types import count
from pipeline.host.capabilities import cpu_capabilities
from pipeline.models import build_model

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def step_s(batch: int, steps: int, amp: str | None) -> float:
    """Seconds per step; amp: None (fp32) or the autocast dtype's name. fp16 without a GradScaler: the step's cost,
    not its numerics, is measured here."""
    model = build_model("lenet", 0, "default").to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(batch, 1, 28, 28).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,))
    ctx = (lambda: torch.autocast("cpu", dtype=DTYPES[amp])) if amp else contextlib.nullcontext
    for i in range(steps + 3):  # 3 warm-up steps
        if i == 3:
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with ctx():
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    return (time.perf_counter() - t0) / steps


def pair(batch: int, steps: int, dtype: str = "bf16") -> tuple[float, float]:
    return step_s(batch, steps, amp=None), step_s(batch, steps, amp=dtype)


def capped_pair(cap: str, batch: int, steps: int, dtype: str = "bf16") -> tuple[float, float]:
    """One fp32/autocast pair in a child process under ONEDNN_MAX_CPU_ISA=cap."""
    out = subprocess.run(
        [sys.executable, "-m", __spec__.name, "--one-pair", str(batch), str(steps), "--dtype", dtype],
        check=True,
        text=True,
        capture_output=True,
        env={**os.environ, "ONEDNN_MAX_CPU_ISA": cap},
    ).stdout
    return tuple(json.loads(out.strip().splitlines()[-1]))


def main():
    p = parser(__doc__, data=False)
    p.add_argument(
        "--batch", type=count("batch size"), nargs="+", default=[64, 128], help="per-process batches (default 64 128)"
    )
    p.add_argument("--steps", type=count("steps"), default=30, help="timed steps per measurement (default 30)")
    p.add_argument("--rounds", type=count("rounds"), default=5, help="fp32/bf16 pairs per batch (default 5)")
    p.add_argument(
        "--isa-cap",
        nargs="*",
        default=[],
        metavar="CAP",
        help="also measure under ONEDNN_MAX_CPU_ISA=CAP (e.g. AVX2), alternating with the uncapped pairs "
        "(default: none, this process's ISA only)",
    )
    p.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default="bf16",
        help="the autocast type to compare with fp32 (default bf16, what ddp_amp picks on a CPU)",
    )
    p.add_argument("--one-pair", nargs=2, type=int, help=argparse.SUPPRESS)  # internal: the child of --isa-cap
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.one_pair:
        print(json.dumps(pair(*args.one_pair, args.dtype)))
        return
    variants, d = [None, *args.isa_cap], args.dtype
    for v in variants:
        env = os.environ if v is None else {**os.environ, "ONEDNN_MAX_CPU_ISA": v}
        cpu = cpu_capabilities(env=env)
        print(
            host_line(),
            f"| ISA {cpu['isa_text']} | {d} {cpu[d]} ({cpu[d + '_why']}) | "
            f"torch CPU capability {cpu['torch_cpu_capability']}",
        )
    for b in args.batch:
        got = {v: ([], []) for v in variants}
        for _ in range(args.rounds):
            for v in variants:  # alternating: every variant once per round
                f, h = pair(b, args.steps, args.dtype) if v is None else capped_pair(v, b, args.steps, args.dtype)
                got[v][0].append(f)
                got[v][1].append(h)
        for v, (fp32, low) in got.items():
            f, h = statistics.median(fp32), statistics.median(low)
            where = "as is" if v is None else f"ONEDNN_MAX_CPU_ISA={v}"
            print(
                f"b={b} {where}: fp32 {f * 1e3:.2f} ms/step, {d} autocast {h * 1e3:.2f} ms/step, ratio {d}/fp32 "
                f"{h / f:.2f} (median of {args.rounds} alternating pairs of {args.steps} steps)"
            )


if __name__ == "__main__":
    main()
