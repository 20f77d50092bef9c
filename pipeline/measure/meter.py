"""What a trial measures, kept out of the training loop: warm-up, clocks, throughput, time to accuracy, memory.

The loop tells the meter where it is (`start_epoch`, `tick`, `sample`, `probe`, `end_epoch`, `note_accuracy`) and
asks it for the figures at the end (`results`). Where a measurement does not apply, its object does nothing (the
memory probe of a step other than step 0 on CPU, or of any step on GPUs, is a `nullcontext`; so is the breakdown's
clock on an unsampled step), as `autocast` is for fp32 strategies.

- images/s over steady-state steps: the first `warmup_steps` (at least 1: step 0 is the CPU memory probe) are not
  timed. **No host synchronisation inside the epoch**: a clock read is a mark (a CUDA event recorded on each device's
  stream; on CPU, where operators finish before the call returns, the host's clock), and the marks are turned into
  seconds at the epoch's end, after one synchronisation. Only the breakdown's sampled steps synchronise (below);
- the step-time breakdown (breakdown.py) on every `every`-th steady-state step: such a sampled step is kept out of
  the throughput window (its images and its seconds, from a synchronised mark before it to one after: the rare eager
  probe segment, the only steps that stall the device), so
  throughput is the unsampled steps' alone; the sampled steps still count in epoch_s and time to accuracy;
- steady-state images/s per measurement window of WINDOW_STEPS timed steps (`throughput_windows`: the spread of
  the trial's throughput, for stats.py's intervals): a window closes at a mark before the step
  that would be its (N+1)-th unsampled one, never spans an epoch's end (evaluation), and leaves out sampled steps as
  the overall figure does; an epoch's tail shorter than half a window is not a window (it counts in the overall
  figure only);
- seconds per epoch (training only, evaluation excluded) and time to the target accuracy (their running sum);
- the cold start (`startup_s`): the seconds of the warm-up steps (lazy loading, the autotuner's trials, compilation),
  inside the first epoch's seconds but never in throughput, reported on their own so a warm epoch can be told apart;
- memory per device (pipeline.measure.memory.memory_meter): on GPUs the libraries are warmed up and what is
  resident recorded at the first `tick` (model, optimizer, data, the libraries' workspaces); the allocator's window
  opens at the first steady step's `tick` and closes at `evaluation()` and at `results`, so the step's peak above
  resident is the strategy's own; on CPU, tensor memory of a probe step.
"""

from __future__ import annotations

import contextlib
import time

import torch

from pipeline.measure.breakdown import NO_CLOCK, Off
from pipeline.measure.memory import memory_meter

_UNSAMPLED = contextlib.nullcontext(NO_CLOCK)


class HostClock:
    """Marks on the host's clock: on CPU an operator has finished when its call returns, so a mark is a clock read."""

    def __init__(self, strategy):
        self.strategy = strategy

    def mark(self):
        return time.perf_counter()

    def seconds(self, a, b) -> float:
        return b - a

    def settle(self) -> None:
        """Wait for the work queued before the last mark (nothing on CPU; a synchronisation on GPUs)."""


class StreamClock(HostClock):
    """Marks as CUDA events recorded on the current stream of each device this process drives: recording one never
    stalls the host. Seconds between two marks are read once both have completed (after `settle`); with several
    devices in one process (dp, scratch) the slowest device's span counts."""

    def __init__(self, strategy):
        super().__init__(strategy)
        self.devices = sorted({d for d in strategy.devices if d.type == "cuda"}, key=str)

    def mark(self):
        events = []
        for d in self.devices:
            e = torch.cuda.Event(enable_timing=True)
            e.record(torch.cuda.current_stream(d))
            events.append(e)
        return events

    def seconds(self, a, b) -> float:
        return max(x.elapsed_time(y) for x, y in zip(a, b)) / 1000.0

    def settle(self) -> None:
        self.strategy.synchronize()


def clock_for(strategy) -> HostClock:
    """The marks of this process's devices: CUDA events where it drives a GPU, the host's clock otherwise."""
    return StreamClock(strategy) if any(d.type == "cuda" for d in strategy.devices) else HostClock(strategy)


WINDOW_STEPS = 10  # timed steps per throughput window: ~13 windows per epoch in the cpu profile at B=128


class Meter:
    def __init__(
        self,
        strategy,
        batch_size: int,
        warmup_steps: int,
        target_acc: float,
        breakdown=None,
        window_steps: int = WINDOW_STEPS,
        memory=None,
    ):
        self.strategy, self.batch_size, self.target_acc = strategy, batch_size, target_acc
        self.window_steps = max(window_steps, 1)
        self.windows: list[float] = []  # images/s per closed window
        self.pending: list[tuple] = []  # this epoch's closed windows as (steps, mark, mark, sampled seconds inside)
        self.window = None  # the open window: (first step, mark, excluded steps and seconds at its start)
        self.clock = clock_for(strategy)
        self.warmup = max(warmup_steps, 1)  # step 0 is the memory probe on CPU: never timed
        # the loop's, which a CUDA-graph step also reaches (its capture); its window opens at the first tick
        self.memory = memory or memory_meter(strategy)
        self.breakdown = breakdown or Off()
        self.sampled_s, self.sampled_steps = 0.0, 0  # sampled steps' wall time, instrument included
        self.timed_images, self.timed_s, self.time_to_acc = 0, 0.0, None
        self.startup_s = 0.0  # the warm-up steps' seconds, over the epochs they span
        self.epoch_s: list[float] = []
        self.epoch_throughput: list[float | None] = []

    def start_epoch(self, step: int) -> None:
        self.first_step = step
        self.excluded_steps, self.excluded_s = 0, 0.0  # this epoch's sampled steps, kept out of throughput
        self.strategy.synchronize()  # the boundary: the device is idle after the last evaluation's read
        self.t0 = self.t_steady = self.clock.mark()
        self.window = self._open(step, self.t0) if step >= self.warmup else None

    def tick(self, step: int) -> None:
        """Before global step `step`: steady state starts at the end of the warm-up (a mark); a full window closes at
        a mark and the next one opens. Never a synchronisation. The memory window (re)opens: at the first steady step
        the warm-up's peaks (the autotuner's trials, compilation) are set aside."""
        self.memory.open(steady=step >= self.warmup)
        if step == self.warmup:
            self.t_steady = self.clock.mark()
            self.window = self._open(step, self.t_steady)
        elif self.window is not None and self._window_steps(step) >= self.window_steps:
            now = self.clock.mark()
            self._close(step, now)
            self.window = self._open(step, now)

    def _open(self, step: int, t: float) -> tuple:
        return step, t, self.excluded_steps, self.excluded_s

    def _window_steps(self, step: int) -> int:
        first, _, excluded, _ = self.window
        return step - first - (self.excluded_steps - excluded)

    def _close(self, step: int, t) -> None:
        """Keep the open window (read at the epoch's end) if it holds at least half a window of unsampled steps."""
        n, (_, t0, _, excluded_s) = self._window_steps(step), self.window
        if 2 * n >= self.window_steps:
            self.pending.append((n, t0, t, self.excluded_s - excluded_s))
        self.window = None

    def _read_windows(self) -> None:
        """The epoch's closed windows as images/s, once its marks have completed."""
        for n, a, b, excluded_s in self.pending:
            seconds = self.clock.seconds(a, b) - excluded_s
            if seconds > 0:
                self.windows.append(n * self.batch_size / seconds)
        self.pending = []

    def sample(self, step: int):
        """A context around global step `step` (data in + train_step) giving its phase clock: the breakdown's on a
        sampled step, whose time leaves the throughput window; a do-nothing clock otherwise."""
        if not self.breakdown.is_sampled(step - self.warmup):
            return _UNSAMPLED
        return self._sampled()

    @contextlib.contextmanager
    def _sampled(self):
        self.strategy.synchronize()  # the rare eager probe segment: the only steps that stall the device
        t = self.clock.mark()
        with self.breakdown.sample() as clock:
            yield clock
        end = self.clock.mark()
        self.strategy.synchronize()
        wall = self.clock.seconds(t, end)
        self.excluded_steps, self.excluded_s = self.excluded_steps + 1, self.excluded_s + wall
        self.sampled_steps, self.sampled_s = self.sampled_steps + 1, self.sampled_s + wall

    def probe(self, step: int, model, optimizer):
        """A context around the step's train_step: the memory probe, or a no-op."""
        return self.memory.probe(step, model, optimizer)

    @contextlib.contextmanager
    def evaluation(self):
        """Around an evaluation: its memory is not the strategy's step (the peaks are read before it; the window
        reopens at the next tick)."""
        self.memory.close()
        yield

    def end_epoch(self, step: int) -> tuple[float, float | None]:
        """After the epoch's last step (global `step` steps done): (epoch seconds, steady-state images/s or None).
        The epoch's one synchronisation: its marks are read here."""
        t_end = self.clock.mark()
        if self.window is not None:
            self._close(step, t_end)
        self.clock.settle()
        # this epoch's steps after the warm-up, less the breakdown's sampled ones
        timed = max(0, step - max(self.first_step, self.warmup)) - self.excluded_steps
        timed_s = self.clock.seconds(self.t_steady, t_end) - self.excluded_s
        epoch_s = self.clock.seconds(self.t0, t_end)
        if self.first_step < self.warmup:  # warm-up steps ran in this epoch: up to the steady start, or to its end
            self.startup_s += self.clock.seconds(self.t0, self.t_steady if step > self.warmup else t_end)
        self._read_windows()
        throughput = timed * self.batch_size / timed_s if timed else None
        if timed:
            self.timed_images += timed * self.batch_size
            self.timed_s += timed_s
        self.epoch_s.append(epoch_s)
        self.epoch_throughput.append(throughput)
        return epoch_s, throughput

    def note_accuracy(self, acc: float) -> None:
        """After an epoch's evaluation: the training time to the target is the epochs' seconds so far."""
        if self.time_to_acc is None and acc >= self.target_acc:
            self.time_to_acc = sum(self.epoch_s)

    def results(self) -> dict:
        """This process's figures (the memory window closed at the last evaluation). Collective in a multi-process
        trial (the breakdown gathers every rank's samples): every rank calls it."""
        timed_steps = self.timed_images // self.batch_size
        breakdown = self.breakdown.results(
            self.timed_s / timed_steps if timed_steps else None,
            self.sampled_s / self.sampled_steps if self.sampled_steps else None,
        )
        return {
            "breakdown": breakdown,
            "trace": self.breakdown.trace,  # this rank's first sampled step as a Chrome trace, or None
            "throughput_img_s": self.timed_images / self.timed_s if self.timed_s > 0 else None,
            "throughput_windows": list(self.windows),
            "timed_steps": timed_steps,
            "time_to_acc_s": self.time_to_acc,
            "startup_s": self.startup_s,
            "epoch_s": self.epoch_s,
            "epoch_throughput_img_s": self.epoch_throughput,
            "peak_mem_bytes": self.memory.peaks(),
            "mem_method": self.memory.method,
            "mem_basis": self.memory.basis,
            **self.memory.figures(),
        }


def untimed(record) -> str:
    """Why a finished trial has no images/s, in words for the console, the sweep table's reason and MLflow; "" when
    it has them. A run of no more steps than the warm-up times none of them; its accuracy still stands. The advice
    names what ended the run: its step limit (train.max_steps) where it reached it, else its data."""
    if record["throughput_img_s"] is not None:
        return ""
    steps, warmup = record["steps"], max(record["warmup_steps"], 1)
    if steps > warmup:
        return f"no steady-state step was timed in its {steps} step(s)"
    why = f"no steady-state step was timed: all {steps} step(s) of the run were warm-up (the first {warmup} are never "
    if (cap := record.get("max_steps")) and steps >= cap:  # the run stopped at its step limit, not its data's end
        return (
            f"{why}timed, train.warmup_steps; train.max_steps={cap} ended the run there); raise train.max_steps "
            f"above {warmup} or lower train.warmup_steps"
        )
    return f"{why}timed, train.warmup_steps); raise data.train_limit or lower train.warmup_steps"


def speed_text(record) -> str:
    """The trial's speed as the console prints it: its images/s, or why it has none."""
    why = untimed(record)
    return f"no throughput ({why})" if why else f"{record['throughput_img_s']:.0f} img/s"
