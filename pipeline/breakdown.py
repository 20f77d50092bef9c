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

Cost (benchmarks/breakdown_cost.py, benchmarks/RESULTS.md section 6: a 2-core CPU host, LeNet, every=10, two
rounds): sampling adds 0.1% to single's epoch, 0.6% to ddp's (barriers, DDP's stats) and 3.3% to fsdp's (the
profiler on each sampled step). The unsampled steps' throughput came out 6% (ddp) and 9% (fsdp) lower with sampling
on, in ranges that nearly touch: not resolved; train.breakdown_every=0 gives the undisturbed throughput. Each trial
reports timed_step_s (unsampled) and sampled_wall_s (a sampled step with barriers and probe), so the cost is
visible per trial.
"""
from __future__ import annotations

import contextlib
import time
from collections import defaultdict

from torch.profiler import record_function

from .comm_probes import PHASE

EVERY = 10  # the default of train.breakdown_every
PARTS = ("data", "forward", "backward_compute", "comm_exposed", "optimizer", "idle")


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
