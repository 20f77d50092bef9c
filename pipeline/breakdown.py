"""Where a steady-state step goes, measured the same way for every strategy: data in, forward, backward compute,
communication not hidden behind compute (exposed), optimizer, and waiting for the slowest rank (idle).

Only sampled steps are measured: every `every`-th steady-state step (train.breakdown_every, default EVERY; 0 = off).
Sampled steps are real training steps, but the meter keeps them out of the throughput
window (meter.py), so throughput is measured on unsampled steps exactly as before; their cost shows in epoch_s.

On a sampled step:
- every rank meets at a barrier first (outside the step: ranks start together), then the step runs under a
  synchronised wall clock (`strategy.synchronize()` before each reading: CUDA streams on GPUs, nothing on CPU) whose
  phases are the step's hooks (base.train_step): data (the loop's batch indexing/normalising + place_batch),
  forward (autocast + forward_loss), backward, reduce_gradients (scratch's hand-written all-reduce; a no-op
  elsewhere), optimizer (zero_grad + optimizer_step);
- the strategy's `comm_probe` says how much of forward/backward was communication that nothing overlapped:
  DDP's own runtime statistics (DDPStats: ddp, ddp_amp), the profiler (ProfiledComm: FSDP's collective spans on
  CPU, NCCL/copy kernels on GPUs for fsdp, dp, dp_criterion), nothing for one device (NoComm: single; scratch,
  whose reduce_gradients phase is communication in full);
- a timed barrier closes the step: its wait, less the barrier's own latency (the shortest wait over the ranks:
  the last rank to arrive waits only for the message), is idle; the latency is the instrument's, left out of the step.

The parts are a partition of the phases plus idle, so parts + residual = step exactly; the residual (the loop's own
Python between phases) is reported, never folded into a part. Waiting for a slower rank *inside* a collective
(a fast rank's all-reduce waits for the slow rank's bucket) cannot be told apart from transfer time on one rank's
clock: it counts as comm_exposed; the per-rank table lets analysis compare ranks.

Cost (measured on a 2-core CPU host, LeNet, every=10): single/scratch/ddp add 0.1-1% to epoch_s (barriers, DDP's
stats); fsdp ~5% (the profiler's start, stop and parsing on each sampled step, ~40 ms there), and its profiled
step runs ~5% slower than an unsampled one (per-op recording). Each trial reports timed_step_s (unsampled) and
sampled_wall_s (a sampled step with barriers and probe) so the cost is visible per trial.
"""
from __future__ import annotations

import contextlib
import os
import time
from collections import defaultdict

import torch
from torch.profiler import record_function

EVERY = 10  # the default of train.breakdown_every
PARTS = ("data", "forward", "backward_compute", "comm_exposed", "optimizer", "idle")
PHASE = "parallax::"  # profiler label of each clock phase (ProfiledComm attributes collectives to phases by it)


# ----------------------------------------------------------------------------- the phase clock

class NoClock:
    """Off: an unsampled step's phases cost one call each and measure nothing."""

    def __call__(self, phase: str):
        return contextlib.nullcontext()

    def iterate(self, phase: str, items):
        return items


NO_CLOCK = NoClock()


class PhaseClock:
    """Synchronised wall-clock seconds per phase of one sampled step (phases may repeat: they add up)."""

    def __init__(self, synchronize, labelled: bool = False):
        self.synchronize = synchronize
        # profiler labels only where a profiler reads them: each costs tens of microseconds, left in the residual
        self.label = (lambda phase: record_function(PHASE + phase)) if labelled else \
            (lambda phase: contextlib.nullcontext())
        self.s: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, phase: str):
        with self.label(phase):
            self.synchronize()
            t = time.perf_counter()
            try:
                yield
            finally:
                self.synchronize()
                self.s[phase] += time.perf_counter() - t

    def iterate(self, phase: str, items):
        """`items`, each next() timed as `phase` (place_batch may be a generator that moves each chunk lazily)."""
        it = iter(items)
        while True:
            with self(phase):
                item = next(it, _END)
            if item is _END:
                return
            yield item


_END = object()


# ----------------------------------------------------------------------------- communication probes (per strategy)

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


# ----------------------------------------------------------------------------- sampling and the trial's figures

class Off:
    """No breakdown: no step is sampled, no figures."""
    every = 0

    def is_sampled(self, n: int) -> bool:
        return False

    def results(self, timed_step_s: float | None = None, sampled_wall_s: float | None = None) -> None:
        return None


class Breakdown(Off):
    """The sampled steps of one process; `results` (a collective) combines every rank's."""

    def __init__(self, strategy, model, every: int = EVERY):
        self.strategy, self.every = strategy, every
        self.comm = strategy.comm_probe(model)
        self.samples: list[dict] = []

    def is_sampled(self, n: int) -> bool:
        """n: steady-state step index (0 = the first step after the warm-up)."""
        return self.every > 0 and n >= 0 and n % self.every == self.every - 1

    @contextlib.contextmanager
    def sample(self):
        """Around one sampled step: yields its PhaseClock; the barriers and probe start/stop are outside the step."""
        s = self.strategy
        s.synchronize()
        self.comm.start()
        s.barrier()  # every rank starts the step together
        clock = PhaseClock(s.synchronize, self.comm.labelled)
        t0 = time.perf_counter()
        try:
            yield clock
            s.synchronize()
            t1 = time.perf_counter()
            s.barrier()  # waits for the slowest rank
            t2 = time.perf_counter()
        finally:
            comm = self.comm.stop()
        self.samples.append({"work_s": t1 - t0, "barrier_s": t2 - t1, "phases": dict(clock.s), "comm": comm})

    def _parts(self, x: dict) -> dict[str, float]:
        """One sample's parts before idle: each phase, less the exposed communication charged to it."""
        parts = dict.fromkeys(PARTS, 0.0)
        part_of = {"data": "data", "forward": "forward", "backward": "backward_compute", "optimizer": "optimizer"}
        for phase, s in x["phases"].items():
            c = s if phase in self.comm.whole else min(s, x["comm"].get(phase, 0.0))
            parts["comm_exposed"] += c
            if phase in part_of:
                parts[part_of[phase]] += s - c
        return parts

    def results(self, timed_step_s: float | None = None, sampled_wall_s: float | None = None) -> dict:
        """The trial's breakdown as this rank sees it, with every rank's step, idle and exposed communication.
        timed_step_s: an unsampled step (the throughput window's mean); sampled_wall_s: a sampled step's wall time,
        barriers and probe included (what sampling costs the epoch: samples x (sampled_wall_s - timed_step_s)).
        Collective in a multi-process trial: every rank calls it."""
        rank, world = self.strategy.data_shard
        mine = {"rank": rank, "barrier_s": [x["barrier_s"] for x in self.samples],
                "work_s": [x["work_s"] for x in self.samples], "parts": [self._parts(x) for x in self.samples]}
        everyone = self.strategy.gather(mine)
        # the barrier's own latency: the last rank to arrive waits only for it (the shortest wait of the sample)
        latency = [min(col) for col in zip(*(r["barrier_s"] for r in everyone))]
        per_rank = [_summary(r, latency) for r in everyone]
        out = per_rank[[r["rank"] for r in everyone].index(rank)]
        return {**out, "every": self.every, "timed_step_s": timed_step_s, "sampled_wall_s": sampled_wall_s,
                "method": self._methods(world),
                "ranks": [{"rank": r["rank"], "step_s": s["step_s"], "idle_s": (s["parts_s"] or {}).get("idle"),
                           "comm_exposed_s": (s["parts_s"] or {}).get("comm_exposed")}
                          for r, s in zip(everyone, per_rank)]}

    def _methods(self, world: int) -> dict[str, str]:
        clock = "synchronised wall clock (strategy.synchronize, then perf_counter) around"
        return {
            "step": f"{clock} the whole sampled step (all ranks start together), plus idle",
            "data": f"{clock} the loop's batch indexing + normalise and the strategy's place_batch",
            "forward": f"{clock} autocast + forward_loss, less exposed communication charged to it",
            "backward_compute": f"{clock} backward, less exposed communication charged to it",
            "comm_exposed": self.comm.method,
            "optimizer": f"{clock} zero_grad + optimizer_step",
            "idle": ("one process: no other rank to wait for" if world == 1 else
                     "timed barrier (1-element all-reduce) after the step, less its latency (the shortest wait "
                     "over the ranks in the same sample)"),
            "residual": "step - sum of parts: the loop's own work between phases, never folded into a part",
        }


def _summary(r: dict, latency: list[float]) -> dict:
    """One rank's mean over its samples: step = work + idle, parts, residual = step - sum(parts)."""
    n = len(r["parts"])
    if not n:
        return {"samples": 0, "step_s": None, "parts_s": None, "residual_s": None}
    parts = dict.fromkeys(PARTS, 0.0)
    step = 0.0
    for p, work, wait, lat in zip(r["parts"], r["work_s"], r["barrier_s"], latency):
        idle = max(0.0, wait - lat)
        for k in PARTS:
            parts[k] += (idle if k == "idle" else p[k]) / n
        step += (work + idle) / n
    return {"samples": n, "step_s": step, "parts_s": parts, "residual_s": step - sum(parts.values())}
