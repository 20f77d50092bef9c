"""Where a steady-state step goes, measured the same way for every strategy: data in, forward, backward compute,
communication not hidden behind compute (exposed), optimizer, and waiting for the slowest rank (idle).

Only sampled steps are measured: every `every`-th steady-state step (train.breakdown_every, default EVERY; 0 = off).
Sampled steps are real training steps, but the meter keeps them out of the throughput
window (meter.py), so throughput is measured on unsampled steps only; their cost shows in epoch_s.
The trial's breakdown names them (`sampled_steps`: steady-state indices, global step = index + warm-up) and what
they added to the training time (`sampling_added_s` = samples x (sampled_wall_s - timed_step_s)): the epochs'
time without sampling is sum(epoch_s) - sampling_added_s.

On a sampled step:
- every rank meets at a barrier first (outside the step: ranks start together), then the step runs under a
  synchronised wall clock (`strategy.synchronize()` before each reading: CUDA streams on GPUs, nothing on CPU) whose
  phases are the step's hooks (base.train_step): data (the loop's batch indexing/normalising + place_batch),
  forward (autocast + forward_loss), backward, reduce_gradients (scratch's hand-written all-reduce; a no-op
  elsewhere), optimizer (zero_grad + optimizer_step);
- the strategy's `comm_probe` says how much of forward/backward was communication that nothing overlapped:
  DDP's own runtime statistics (DDPStats: ddp, ddp_amp), the profiler (ProfiledComm: FSDP's collective spans on
  Gloo, NCCL/copy kernels on GPUs for fsdp, dp, dp_criterion), nothing for one device (NoComm: single; scratch,
  whose reduce_gradients phase is communication in full);
- a timed barrier closes the step: its wait, less the barrier's own latency (the shortest wait over the ranks:
  the last rank to arrive waits only for the message), is idle; the latency is the instrument's, left out of the step.

The parts are a partition of the phases plus idle, so parts + residual = step exactly; the residual (the loop's own
Python between phases) is reported, never folded into a part. Waiting for a slower rank *inside* a collective
(a fast rank's all-reduce waits for the slow rank's bucket) cannot be told apart from transfer time on one rank's
clock: it counts as comm_exposed; the per-rank table lets analysis compare ranks.

On a GPU a sampled step is a different regime from an unsampled one. `synchronize()` is cudaDeviceSynchronize on
each of the strategy's devices, before and after every phase and every place_batch item, inside the phase's
profiler label. So on a sampled step: the host cannot queue the next phase while the device runs this one, and each
phase's kernel-launch time (Python, dispatch, cudaLaunchKernel) is exposed instead of hidden behind the previous
phase's kernels; no work overlaps a phase boundary (a copy queued with non_blocking in data completes before forward
starts; FSDP's prefetch cannot run into the next phase); scratch's per-replica items are separated by syncs, so its
replicas run one after another, not concurrently across devices; and every kernel of a phase ends inside the phase's
host label, which is what lets ProfiledComm charge device-side intervals to phases. The parts therefore describe
this phase-serialised step: compare step_s with timed_step_s (an unsampled step) before reading them as shares of
an unsampled step. Launch-bound models (LeNet; small batches) show the largest gap.

Profiler sessions on GPUs: each torch.profiler session with CUDA activity starts and stops a Kineto/CUPTI trace,
and each such session costs the steps around it: CUPTI left attached after a session slows every later kernel
launch (pytorch#144455) unless Kineto tears it down (TEARDOWN_CUPTI=1, the default of newer Kineto with CUDA >=
12.6), and teardown followed by re-initialisation in quick succession has crashed (kineto PRs #1169, #1554). A
torch.profiler.profile with a schedule does not avoid this: every cycle ends in stop_trace and the next begins with
prepare_trace/start_trace (torch 2.14.1 torch/profiler/profiler.py:1093-1140, the schedule's action map), i.e. a
Kineto trace disabled and re-enabled per cycle (:468 -> torch/autograd/profiler.py:442 _disable_profiler). So on the
kernel path the probe opens ONE session per trial process, at the first sampled step, and the breakdown samples no
further step (`probe.spent`): dp, dp_criterion and fsdp on NCCL report one sample; the other strategies and every
host-side path (CPU, Gloo: no CUPTI) keep sampling every `every`-th step. This keeps the profiler's cost to one step
that is out of the throughput window, at the price of a one-sample breakdown; whether CUPTI still lingers after
that one session (no teardown) shows in an A/B run with train.breakdown_every=0. The regime, the session count and
TEARDOWN_CUPTI are recorded with the breakdown (`probe`, method["sampling"]). With PARALLAX_DUMP_EVENTS set (doctor
--dump-events DIR), each trial process's first profiled step writes its events there (comm_probes.dump_events), the
replay fixture format of tests/fixtures/, read back by tests/measure/test_comm_replay*.py.

Each rank's first sampled step is also kept as a Chrome trace (chrome_trace.py; `trace` after `results`): the
profiler's own trace where the probe ran one, with the breakdown's track (step, phases, exposed communication, idle)
on the clock that measured them. The rank process writes it to the trial directory (trial/ranks.py).

Cost (benchmarks/overhead/breakdown_cost.py; benchmarks/RESULTS.md, "What the step-time breakdown costs": a 2-core CPU
host, LeNet, every=10, two rounds): sampling adds 0.1% to single's epoch, 0.6% to ddp's (barriers, DDP's stats) and 3.3%
to fsdp's (the profiler on each sampled step). The unsampled steps' throughput came out 6% (ddp) and 9% (fsdp) lower
with sampling on, in ranges that nearly touch: not resolved; train.breakdown_every=0 gives the undisturbed throughput.
Each trial reports timed_step_s (unsampled) and sampled_wall_s (a sampled step with barriers and probe), so the cost is
visible per trial.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import record_function

from pipeline.measure import chrome_trace, comm_probes
from pipeline.measure.comm_probes import PHASE

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
        self.label = (
            (lambda phase: record_function(PHASE + phase)) if labelled else (lambda phase: contextlib.nullcontext())
        )
        self.s: dict[str, float] = defaultdict(float)
        self.spans: list[tuple[str, float, float]] = []  # (phase, start, end), perf_counter seconds, in order

    @contextlib.contextmanager
    def __call__(self, phase: str):
        with self.label(phase):
            self.synchronize()
            t = time.perf_counter()
            try:
                yield
            finally:
                self.synchronize()
                end = time.perf_counter()
                self.s[phase] += end - t
                self.spans.append((phase, t, end))

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
    trace = None  # the first sampled step as a Chrome trace (chrome_trace.py), once `results` ran

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
        self.next_step, self.dumped = None, False
        self.first: dict | None = None  # the first sampled step's clock readings, for its Chrome trace

    def is_sampled(self, n: int) -> bool:
        """n: steady-state step index (0 = the first step after the warm-up). No step once the probe is spent
        (one profiler session per trial on the kernel path)."""
        if self.every > 0 and n >= 0 and n % self.every == self.every - 1 and not self.comm.spent:
            self.next_step = n  # the step the meter's next sample() times
            return True
        return False

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
        self.samples.append(
            {"step": self.next_step, "work_s": t1 - t0, "barrier_s": t2 - t1, "phases": dict(clock.s), "comm": comm}
        )
        if self.first is None:
            exposed = self.comm.exposed_spans(clock.spans)
            self.first = {"step": self.next_step, "t0": t0, "t1": t1, "spans": clock.spans, "exposed": exposed}
        if os.environ.get(comm_probes.DUMP_ENV) and self.comm.events is not None and not self.dumped:
            self._dump(Path(os.environ[comm_probes.DUMP_ENV]), comm)

    def _dump(self, out: Path, comm: dict) -> None:
        """This process's first profiled step, as a replay fixture (comm_probes.dump_events)."""
        s, facts = self.strategy, self.comm.facts()
        rank, world = s.data_shard
        k = world * len(s.devices)
        self.dumped = True
        comm_probes.dump_events(
            out / f"events-{s.name}-k{k}-{facts.get('backend') or 'none'}-rank{rank}.json",
            self.comm.events,
            facts,
            comm,
            strategy=s.name,
            k=k,
            rank=rank,
            world=world,
            step=self.next_step,
            device=str(s.devices[0]),
            torch=torch.__version__,
            cuda=torch.version.cuda,
            teardown_cupti=facts.get("teardown_cupti"),
            note="dumped by a real run (pipeline/measure/breakdown.py); replayed by "
            "tests/measure/test_comm_attribution.py",
        )

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
        mine = {
            "rank": rank,
            "barrier_s": [x["barrier_s"] for x in self.samples],
            "work_s": [x["work_s"] for x in self.samples],
            "parts": [self._parts(x) for x in self.samples],
        }
        everyone = self.strategy.gather(mine)
        # the barrier's own latency: the last rank to arrive waits only for it (the shortest wait of the sample)
        latency = [min(col) for col in zip(*(r["barrier_s"] for r in everyone))]
        per_rank = [_summary(r, latency) for r in everyone]
        out = per_rank[[r["rank"] for r in everyone].index(rank)]
        if self.first is not None:
            self.trace = self._trace(rank, world, max(0.0, self.samples[0]["barrier_s"] - latency[0]))
        added = (
            len(self.samples) * (sampled_wall_s - timed_step_s)
            if timed_step_s is not None and sampled_wall_s is not None
            else None
        )
        return {
            **out,
            "every": self.every,
            "timed_step_s": timed_step_s,
            "sampled_wall_s": sampled_wall_s,
            "sampled_steps": [x.get("step") for x in self.samples],
            "sampling_added_s": added,
            "probe": self.comm.facts(),
            "method": self._methods(world),
            "ranks": [
                {
                    "rank": r["rank"],
                    "step_s": s["step_s"],
                    "idle_s": (s["parts_s"] or {}).get("idle"),
                    "comm_exposed_s": (s["parts_s"] or {}).get("comm_exposed"),
                }
                for r, s in zip(everyone, per_rank)
            ],
        }

    def _trace(self, rank: int, world: int, idle: float) -> dict:
        """The first sampled step as a Chrome trace (chrome_trace.step_trace), with its own parts."""
        parts = {**self._parts(self.samples[0]), "idle": idle}
        step = self.samples[0]["work_s"] + idle
        about = {
            "rank": rank,
            "world": world,
            "strategy": self.strategy.name,
            "step": self.first["step"],
            "step_s": step,
            "parts_s": parts,
            "residual_s": step - sum(parts.values()),
            "what": "the first sampled step of this rank (pipeline/measure/breakdown.py); the parts are this step's, "
            "the trial's breakdown is their mean over its sampled steps",
        }
        return chrome_trace.step_trace(self.first, idle, about, self._kineto())

    def _kineto(self) -> dict | None:
        """The probe's first profiler session as torch.profiler exports it, read back; None without one."""
        fd, name = tempfile.mkstemp(prefix="parallax-trace-", suffix=".json")
        os.close(fd)
        try:
            return json.loads(Path(name).read_text()) if self.comm.chrome_trace(Path(name)) else None
        finally:
            os.unlink(name)

    def _methods(self, world: int) -> dict[str, str]:
        clock = "synchronised wall clock (strategy.synchronize, then perf_counter) around"
        return {
            "step": f"{clock} the whole sampled step (all ranks start together), plus idle",
            "data": f"{clock} the loop's batch indexing + normalise and the strategy's place_batch",
            "forward": f"{clock} autocast + forward_loss, less exposed communication charged to it",
            "backward_compute": f"{clock} backward, less exposed communication charged to it",
            "comm_exposed": self.comm.method,
            "optimizer": f"{clock} zero_grad + optimizer_step",
            "idle": (
                "one process: no other rank to wait for"
                if world == 1
                else "timed barrier (1-element all-reduce) after the step, less its latency (the shortest wait "
                "over the ranks in the same sample)"
            ),
            "residual": "step - sum of parts: the loop's own work between phases, never folded into a part",
            "sampling": self._regime(),
        }

    def _regime(self) -> str:
        sync = (
            "each phase and place_batch item between strategy.synchronize() calls (on GPUs a phase-serialised "
            "step: launch latency exposed, no overlap across phases; breakdown.py)"
        )
        facts = self.comm.facts()
        if getattr(self.comm, "cupti", False):
            how = (
                f"one profiler session per trial (CUDA activity: CUPTI), at the first sampled step, then no "
                f"further sample; sessions opened: {facts.get('profiler_sessions')}; TEARDOWN_CUPTI="
                f"{facts.get('teardown_cupti') or 'unset (the Kineto default)'}"
            )
        elif facts.get("path") in ("kernels", "spans"):
            how = "one profiler session (host-side activity only: no CUPTI) per sampled step"
        else:
            how = "no profiler"
        return f"every {self.every}-th steady-state step; {how}; {sync}"


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
