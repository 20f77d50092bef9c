"""train.cuda_graphs: the whole training step (forward, backward, DDP's all-reduce, the optimizer's update, the
epoch's running loss sum) captured once as a CUDA graph and replayed at every later step, so the host launches one
copy (the step's sample indices) and one graph per step instead of every kernel: what bounds small models such as
LeNet on a fast GPU is the host's per-launch cost, not the GPU.

Written here, not taken from a library: `torch.cuda.make_graphed_callables` graphs the forward and backward of a
module but not the optimizer step or DDP's reducer, and torch.compile's reduce-overhead mode (train.compile_mode)
graphs only what it compiles. The recipe is PyTorch's "whole-network capture" (torch.cuda.graphs docs):

- warm-up on a side stream, the model (DDP's constructor included) built on that stream too, and the memory
  meter's warm-up of the libraries, so the autograd nodes DDP keeps and the cuBLAS workspaces belong to the stream
  that captures;
- `capture_step(strategy)` eager steps first: SINGLE_WARMUP_STEPS for `single`, DDP_SETTLE_STEPS for the rows
  whose step is DDP's bucketed all-reduce, whose reducer synchronises its runtime statistics on its first iterations
  and rebuilds its buckets after the first (DDP runs with static_graph; config/settle.py); a trial's warm-up covers
  the capture (`min_warmup`), so every timed step is a replay;
- the batch's gather and normalisation inside the graph (trial/loop.py `Inputs`), reading a static index buffer:
  a replayed step launches two things, one copy (the step's sample indices into that buffer) and the replay,
  where gathering and normalising the batch eagerly, then copying it into static buffers, launches eight kernels
  before the replay; the loss is added to the epoch's running sum (a static buffer, zeroed at each epoch's start)
  inside the graph too;
- gradients set to None once, before capture: the captured backward writes them into the graph's own memory, and
  every replay overwrites them;
- the optimizer's step inside the graph (SGD's foreach update as it is; AdamW with capturable=True, so its step
  count stays on the device: strategies/base.py);
- nothing in the step reads the host (FiniteWatch's copy of the loss happens after the replay, outside the graph).

What cannot be captured is refused by launch.mode_refusal, with the reason: the catalog rows without the knob (dp,
dp_criterion, scratch, zero1, fsdp), Gloo (ranks sharing a GPU), fp16 (GradScaler), compile, the breakdown's sampled
steps, gradient accumulation and comm hooks.

Memory: a replay allocates nothing (its tensors live in the graph's private pool), so the memory meter reads the
step's peak around the capture, which allocates what an eager step does (`window`: measure/memory.py
`CudaPeaks.capture`).
"""

from __future__ import annotations

import torch

from pipeline import catalog

# DDP's captures come at DDP_SETTLE_STEPS, after the iterations 1-10 its reducer synchronises on (config/settle.py)
from pipeline.config.settle import DDP_SETTLE_STEPS
from pipeline.strategies.base import Learner

SINGLE_WARMUP_STEPS = 2


def capture_step(strategy: str) -> int:
    """The (0-based) step at which `strategy`'s graph is captured: after its eager warm-up steps, past DDP's
    synchronised iterations where its step is DDP's (the bucketed all-reduce rows)."""
    return DDP_SETTLE_STEPS if settles(strategy) else SINGLE_WARMUP_STEPS


def settles(strategy: str) -> bool:
    """Whether `strategy`'s step is DDP's reducer, which synchronises the host on its first iterations."""
    return catalog.SPECS[strategy].comm == "bucket_allreduce"


def min_warmup(strategy: str) -> int:
    """The fewest warm-up steps (train.warmup_steps) of a graph trial of `strategy`: its eager steps and the capture
    inside the warm-up, so its timed window holds replays only."""
    return capture_step(strategy) + 1


class GraphedStep:
    """`strategy.train_step` in eager steps on a side stream until `at`, then captured once and replayed. `window`:
    the context the capture runs in, the memory meter's (`CudaPeaks.capture`). `loss_sum`: the epoch's losses."""

    def __init__(self, strategy, at: int, inputs, window):
        self.strategy, self.at, self.inputs, self.window = strategy, at, inputs, window
        self.stream = torch.cuda.Stream(strategy.device)
        self.graph = None
        self.idx = self.loss = None
        self.loss_sum = torch.zeros((), device=inputs.device)

    def start_epoch(self) -> None:
        self.loss_sum.zero_()

    def side(self):
        """The context the model is built in (its parameters, DDP's buckets and hooks on the capture's stream)."""
        return torch.cuda.stream(self.stream)

    def joined(self) -> None:
        """The current stream waits for the side stream's work (after building, after each eager step)."""
        torch.cuda.current_stream(self.strategy.device).wait_stream(self.stream)

    def __call__(self, step: int, learner: Learner, idx, clock=None, probe=None) -> torch.Tensor:
        """Step `step` on the sample indices `idx` (on the device). `clock` and `probe` are the eager step's: graphs
        refuse the breakdown's sampled steps, and the memory probe is CPU's (on CUDA the allocator's window reads)."""
        if self.graph is not None:
            self.idx.copy_(idx)
            self.graph.replay()
            return self.loss
        self.stream.wait_stream(torch.cuda.current_stream(self.strategy.device))
        if step < self.at:
            with torch.cuda.stream(self.stream):
                x, y = self.inputs(idx)
                loss = self.strategy.train_step(learner, x, y)
                self.loss_sum += loss.detach()
            self.joined()
            loss.record_stream(torch.cuda.current_stream(self.strategy.device))
            return loss
        return self._capture(learner, idx)

    def _capture(self, learner: Learner, idx) -> torch.Tensor:
        with torch.cuda.stream(self.stream):
            self.idx = idx.clone()
        torch.cuda.synchronize(self.strategy.device)
        learner.optimizer.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: other threads (NCCL's watchdog polling earlier collectives' events) may call CUDA during the
        # capture; only this thread's unsafe calls would break it
        with self.window(), torch.cuda.graph(self.graph, stream=self.stream, capture_error_mode="thread_local"):
            x, y = self.inputs(self.idx)
            self.loss = self.strategy.train_step(learner, x, y)
            self.loss_sum += self.loss.detach()
        self.graph.replay()  # capturing runs nothing: this is the step's own update
        return self.loss
