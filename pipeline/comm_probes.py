"""How the step-time breakdown (breakdown.py) finds the communication inside a sampled step's phases: one probe
per kind of strategy, chosen by the strategy's `comm_probe`. DDPStats reads DDP's own runtime statistics (ddp,
ddp_amp); ProfiledComm runs torch.profiler around the step (FSDP's collective spans on CPU; NCCL and copy kernels on
GPUs for fsdp, dp, dp_criterion); NoComm has nothing to split off (single; scratch, whose reduce_gradients phase is
communication in full). `stop()` returns the exposed seconds per clock phase; intervals are merged and intersected
with the helpers at the bottom.
"""
from __future__ import annotations

import os
import time
from collections import defaultdict

import torch

PHASE = "parallax::"  # profiler label of each clock phase (ProfiledComm attributes collectives to phases by it)


class NoComm:
    """No communication inside a phase to split off. `whole`: clock phases that are communication in full
    (scratch: reduce_gradients, its hand-written all-reduce, which nothing overlaps)."""

    labelled = False  # does it read the clock's phase labels from a profiler?

    def __init__(self, method: str, whole: tuple[str, ...] = ()):
        self.method, self.whole = method, whole

    def start(self) -> None:
        pass

    def stop(self) -> dict[str, float]:
        """Seconds of exposed communication inside each clock phase of the step just run."""
        return {}


class DDPStats(NoComm):
    """DDP's own runtime statistics (the reducer's timer: c10::getTime on CPU, CUDA events on GPUs) for the sampled
    iteration. Exposed = backward_comm_time - backward_compute_comm_overlap_time: from the moment autograd finished
    the last gradient to the moment the last bucket's all-reduce completed. The reducer records iterations 1-10 and
    then every sample_rate-th (100 by default): the rate is set to 1 for the sampled step only, its stats logged right
    after backward (DDP itself would log them at the next forward), then the default rate is restored, so DDP runs
    as shipped on every other step."""
    DEFAULT_RATE = 100  # kDDPRuntimeLoggingSampleRate (torch/csrc/distributed/c10d/reducer.hpp)

    def __init__(self, model):
        super().__init__("DDP's runtime stats of the sampled iteration (_get_ddp_logging_data): backward_comm_time "
                         "- backward_compute_comm_overlap_time, i.e. last gradient ready -> last bucket reduced; "
                         "taken out of the backward phase")
        self.model = model
        self.last_iteration, self.t_start = None, 0

    def start(self) -> None:
        self.t_start = time.time_ns()  # the reducer's host timestamps are c10::getTime: CLOCK_REALTIME on Linux
        self.model._set_ddp_runtime_logging_sample_rate(1)

    def stop(self) -> dict[str, float]:
        self.model.logger.set_runtime_stats_and_log()
        self.model._set_ddp_runtime_logging_sample_rate(self.DEFAULT_RATE)
        d = self.model._get_ddp_logging_data()
        iteration, comm_end = d.get("iteration"), d.get("backward_comm_time_end")
        # a micro-batch under no_sync (accumulation) leaves the last synchronising iteration's stats: not this step's
        fresh = iteration is not None and iteration != self.last_iteration and (not comm_end
                                                                                 or comm_end >= self.t_start)
        self.last_iteration = iteration
        if not fresh:
            return {}
        exposed = d.get("backward_comm_time", 0) - d.get("backward_compute_comm_overlap_time", 0)
        return {"backward": max(0, exposed) / 1e9}


class ProfiledComm(NoComm):
    """torch.profiler around the sampled step. CPU: the main thread's time inside the strategy's collective spans
    (FSDP's record_function labels: on Gloo the collective blocks the calling thread, so all of it is exposed).
    CUDA: communication kernels (NCCL) minus the time any other kernel ran, i.e. exposed on the device timeline.
    Each exposed interval is charged to the clock phase (parallax::<phase>) it falls in."""

    labelled = True

    def __init__(self, spans: tuple[str, ...], device: torch.device, method: str,
                 kernels: tuple[str, ...] = ("nccl",)):
        super().__init__(method)
        self.spans, self.device, self.kernels = spans, device, kernels
        self.prof = None

    def start(self) -> None:
        acts = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        else:
            # Kineto logs two lines per profiled step (and, in a CUDA build without a GPU, a spurious
            # "gpuGetDeviceCount failed"): silenced on CPU unless the user set a level. (The autograd profiler,
            # quieter, cannot parse FSDP's record_function spans that close on another thread.)
            os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        self.prof = torch.profiler.profile(activities=acts)
        self.prof.__enter__()

    def stop(self) -> dict[str, float]:
        self.prof.__exit__(None, None, None)
        events, self.prof = self.prof.events(), None
        phases = [(e.name[len(PHASE):], e.time_range.start, e.time_range.end) for e in events
                  if e.name.startswith(PHASE)]
        if self.device.type == "cuda":
            kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
            is_comm = [any(k in e.name.lower() for k in self.kernels) for e in kernels]
            comm = [(e.time_range.start, e.time_range.end) for e, c in zip(kernels, is_comm) if c]
            busy = [(e.time_range.start, e.time_range.end) for e, c in zip(kernels, is_comm) if not c]
        else:
            comm = [(e.time_range.start, e.time_range.end) for e in events if e.name.startswith(self.spans)]
            busy = []
        exposed = subtract(union(comm), union(busy))
        out: dict[str, float] = defaultdict(float)
        for name, a, b in phases:
            if name in ("forward", "backward"):  # a copy in the data phase is moving data in, not communication
                out[name] += overlap(exposed, a, b) / 1e6  # profiler times are microseconds
        return dict(out)


def union(intervals) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the same time."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def subtract(xs, ys) -> list[tuple[float, float]]:
    """Parts of the disjoint intervals xs not covered by the disjoint intervals ys."""
    out = []
    for a, b in xs:
        for c, d in ys:
            if d <= a or c >= b:
                continue
            if c > a:
                out.append((a, c))
            a = max(a, d)
            if a >= b:
                break
        if a < b:
            out.append((a, b))
    return out


def overlap(intervals, a: float, b: float) -> float:
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in intervals)
