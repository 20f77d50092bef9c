"""train.cuda_graphs' call order, checked on a CPU with torch.cuda's graph and stream calls replaced by recorders
(as tests/strategies/test_gpu_contracts.py does): the eager warm-up steps run on the side stream, the step is
captured once at its capture step on that stream, every later step copies its batch into the static buffers and
replays, and the capture's peak reaches the memory meter. Intent only: that a capture of this step works, and what
it gains, needs a GPU (docs/gpu.md, R1)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from pipeline.strategies.base import Learner
from pipeline.trial import graphs


class Recorder:
    def __init__(self, monkeypatch):
        self.log = []
        self.capturing = False
        rec = self

        class Stream:
            def __init__(self, device=None):
                self.name = "side"

            def wait_stream(self, other):
                rec.log.append(("wait", self.name, other.name))

        class Graph:
            def replay(self):
                rec.log.append(("replay",))

        @contextlib.contextmanager
        def stream(s):
            rec.log.append(("on", s.name))
            yield

        @contextlib.contextmanager
        def graph(g, stream=None, capture_error_mode="global"):
            rec.log.append(("capture", stream.name, capture_error_mode))
            rec.capturing = True
            yield
            rec.capturing = False

        main = SimpleNamespace(name="main", wait_stream=lambda other: rec.log.append(("wait", "main", other.name)))
        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "stream", stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: main)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", graph)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d: rec.log.append(("reset", str(d))))
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: 12_345)
        monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: None)


class Strategy:
    """Records each train_step: its step inputs and whether it ran under capture."""

    def __init__(self, rec):
        self.rec, self.device, self.devices, self.calls = rec, torch.device("cuda", 0), [torch.device("cuda", 0)], []

    def train_step(self, learner, x, y, clock=None):
        self.calls.append(("capture" if self.rec.capturing else "eager", x.clone()))
        return torch.tensor(1.0)


@pytest.mark.parametrize("strategy,at", [("single", 2), ("ddp", 11), ("ddp_amp", 11)])
def test_capture_step_is_after_the_strategys_warm_up(strategy, at):
    """`single` captures after 2 eager steps; DDP's rows after the 11 in which DDP's reducer settles."""
    assert graphs.capture_step(strategy) == at


def test_eager_warm_up_on_the_side_stream_then_one_capture_then_replays(monkeypatch):
    rec = Recorder(monkeypatch)
    strategy = Strategy(rec)
    peaks = []
    step = graphs.GraphedStep(strategy, at=2, on_capture=peaks.append)
    opt = SimpleNamespace(zero_grad=lambda set_to_none: rec.log.append(("zero_grad", set_to_none)))
    batches = [torch.full((2, 3), float(i)) for i in range(6)]
    learner = Learner(None, None, opt)  # the graph only zeroes the optimizer's gradients; the step is this fake's
    losses = [step(i, learner, x, x[:, 0].long()) for i, x in enumerate(batches)]
    kinds = [k for k, _ in strategy.calls]
    assert kinds == ["eager", "eager", "capture"], "two eager steps, one capture, then no Python step at all"
    assert [e for e in rec.log if e[0] == "capture"] == [("capture", "side", "thread_local")]
    assert sum(e == ("replay",) for e in rec.log) == 4, "the capture step replays once (capturing runs nothing)"
    assert ("zero_grad", True) in rec.log[: rec.log.index(("capture", "side", "thread_local"))]
    assert peaks == [[12_345]], "the capture's peak goes to the memory meter"
    assert step.x.tolist() == batches[-1].tolist(), "each replay reads the latest batch from the static buffer"
    assert all(loss is step.loss for loss in losses[2:]), "a replayed step's loss is the graph's static output"
    first_eager = rec.log.index(("on", "side"))
    assert ("wait", "side", "main") in rec.log[:first_eager], "the side stream waits for the batch first"
    assert ("wait", "main", "side") in rec.log, "the loop's stream waits for the side stream's eager step"
