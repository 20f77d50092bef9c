"""Per-device memory measurement and the derived figures every strategy reports the same way.

CUDA: the caching allocator's peak per device (`torch.cuda.max_memory_allocated`) over the whole run.
CPU worker processes: tensor memory of one probe step (the first step, which is a warm-up step and so never
timed), seen through PyTorch's MemTracker (FSDPMemTracker for FSDP): parameters, gradients, optimizer state,
activations and temporaries that pass through the dispatcher. Communication buffers allocated outside the
dispatcher (e.g. DDP's gradient buckets when they are not views) are not counted: the figure is a lower bound.
"""
from __future__ import annotations

import contextlib

import torch


class CpuMemProbe:
    """Context: peak tensor bytes of one step, one entry per device this process drives."""
    method = "memtracker"

    def __init__(self, devices, model, optimizer, tracker=None):
        from torch.distributed._tools.mem_tracker import MemTracker
        self.devices = devices
        self.tracker = tracker or MemTracker()
        # a hand-written optimizer (scratch's manual SGD) keeps no state tensors to track
        self.tracker.track_external(model, optimizer if isinstance(optimizer, torch.optim.Optimizer) else None)
        self.peak = 0

    def __enter__(self):
        self.tracker.__enter__()
        return self

    def __exit__(self, *exc):
        self.tracker.__exit__(*exc)
        snap = self.tracker.get_tracker_snapshot("peak")
        self.peak = int(sum(v.get("Total", 0) for v in snap.values()))
        return False

    def peaks(self) -> list[int]:
        # On a CPU host a process is one device; a single process driving k replicas (scratch)
        # holds them all in one address space, so one figure is reported for it.
        return [self.peak]


class CudaPeaks:
    """Per-device memory on GPUs: the allocator's peak over the whole run; no step is probed."""
    method = "cuda_allocator"

    def __init__(self, strategy):
        self.devices = strategy.devices
        reset_cuda_peaks(self.devices)

    def probe(self, step: int, model, optimizer):
        return contextlib.nullcontext()

    def peaks(self) -> list[int]:
        return cuda_peaks(self.devices)


class CpuStepPeaks:
    """Per-device memory on a CPU host: the strategy's tracker around step 0 (a warm-up step, never timed); every
    other step runs unprobed."""
    method = "memtracker"

    def __init__(self, strategy):
        self.strategy, self.tracker = strategy, None

    def probe(self, step: int, model, optimizer):
        if step != 0:
            return contextlib.nullcontext()
        self.tracker = self.strategy.memory_tracker(model, optimizer)
        return self.tracker

    def peaks(self) -> list[int] | None:
        return self.tracker.peaks() if self.tracker else None


def memory_meter(strategy) -> CudaPeaks | CpuStepPeaks:
    """How this process's devices report peak memory: the CUDA allocator, or a probe step on CPU."""
    return CudaPeaks(strategy) if strategy.device.type == "cuda" else CpuStepPeaks(strategy)


def cuda_peaks(devices) -> list[int]:
    return [int(torch.cuda.max_memory_allocated(d)) for d in devices]


def reset_cuda_peaks(devices) -> None:
    for d in devices:
        if d.type == "cuda":
            torch.cuda.reset_peak_memory_stats(d)
