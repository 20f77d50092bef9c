"""What a CUDA process holds on its device before and beside any strategy: the context and loaded kernels (NVML),
the cuBLAS workspace one matrix product leaves allocated, and per model the first training step's peak against the
later ones' (the first holds the libraries' workspaces and, with cudnn.benchmark, the autotuner's trials). These
are the figures `fit`'s fixed cost assumes where `doctor` has kept none for the device (pipeline/scaling/device.py).

    PYTHONPATH=. python3 -m benchmarks.gpu.fixed_cost > fixed_cost.json      (a CUDA host; needs pynvml)

Plain SGD steps at LeNet B=128 and ResNet-18 B=256, 28x28 inputs, fp32, each with cudnn.benchmark off then on; bytes.
"""

from __future__ import annotations

import json

import torch
from torch import nn

from pipeline.models import build_model


def nvml_used() -> dict:
    import pynvml

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        out = {"used": pynvml.nvmlDeviceGetMemoryInfo(h).used}
        try:
            v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
            out.update(v2_used=v2.used, v2_reserved=v2.reserved)
        except Exception as e:  # an older driver or pynvml: v1 only
            out["v2"] = repr(e)
        out["procs"] = [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
        return out
    finally:
        pynvml.nvmlShutdown()


def main() -> None:
    r = {"nvml_before": nvml_used()}
    free, total = torch.cuda.mem_get_info(0)
    r.update(mem_get_info_total=total, free_after_init=free, name=torch.cuda.get_device_name(0))
    r["nvml_after_init"] = nvml_used()
    a0 = torch.cuda.memory_allocated()
    x = torch.randn(256, 256, device="cuda")
    y = x @ x
    torch.cuda.synchronize()
    r["cublas_ws_fwd"] = torch.cuda.memory_allocated() - a0 - 2 * 256 * 256 * 4
    del x, y
    for name, batch in (("lenet", 128), ("resnet18", 256)):
        for bench in (False, True):
            torch.backends.cudnn.benchmark = bench
            m = build_model(name, 0, "default").cuda()
            opt = torch.optim.SGD(m.parameters(), lr=0.1)
            xb = torch.randn(batch, 1, 28, 28, device="cuda")
            yb = torch.randint(0, 10, (batch,), device="cuda")
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            peaks = []
            for _ in range(4):
                torch.cuda.reset_peak_memory_stats()
                start = torch.cuda.memory_allocated()
                opt.zero_grad(set_to_none=True)
                nn.functional.cross_entropy(m(xb), yb).backward()
                opt.step()
                torch.cuda.synchronize()
                peaks.append(torch.cuda.max_memory_allocated() - start)
            key = f"{name}_B{batch}_bench{int(bench)}"
            r[f"{key}_step_peaks_above_start"] = peaks
            r[f"{key}_retained_after_4"] = torch.cuda.memory_allocated() - base
            del m, opt, xb, yb
            torch.cuda.empty_cache()
    r["reserved_end"] = torch.cuda.memory_reserved()
    r["nvml_end"] = nvml_used()
    print(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
