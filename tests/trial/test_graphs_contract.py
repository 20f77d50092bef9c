"""train.cuda_graphs' call order, checked on a CPU with torch.cuda's graph and stream calls replaced by recorders
(as tests/strategies/test_gpu_contracts.py does): the eager warm-up steps run on the side stream, the step is
captured once at its capture step on that stream, the batch's gather and normalisation with it, every later step
copies its sample indices into the static buffer and replays, and the capture's peak reaches the memory meter.
Intent only: that a capture of this step works, and what it gains, needs a GPU (docs/gpu.md, R1)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pipeline.data.store import Dataset
from pipeline.host.devices import Host
from pipeline.measure import memory, meter
from pipeline.strategies.base import Learner
from pipeline.strategies.base import Strategy as BaseStrategy
from pipeline.trial import graphs, loop


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
            rec.log.append(("off", s.name))

        @contextlib.contextmanager
        def graph(g, stream=None, capture_error_mode="global"):
            rec.log.append(("capture", stream.name, capture_error_mode))
            rec.capturing = True
            yield
            rec.capturing = False

        @contextlib.contextmanager
        def window():
            rec.log.append(("window", "open"))
            yield
            rec.log.append(("window", "closed"))

        self.window = window
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


def _inputs():
    """The loop's own data path on a tiny resident set: image n is all n, label n % 10."""
    images = torch.arange(12, dtype=torch.uint8).view(12, 1, 1, 1).expand(12, 1, 2, 2).contiguous()
    return loop.Inputs(images, torch.arange(12) % 10, torch.device("cpu"), channels_last=False)


def _epoch(steps=6, batch=2):
    return torch.arange(steps * batch).view(steps, batch)


def test_eager_warm_up_on_the_side_stream_then_one_capture_then_replays(monkeypatch):
    rec = Recorder(monkeypatch)
    strategy = Strategy(rec)
    inputs = _inputs()
    step = graphs.GraphedStep(strategy, at=2, inputs=inputs, window=rec.window)
    opt = SimpleNamespace(zero_grad=lambda set_to_none: rec.log.append(("zero_grad", set_to_none)))
    learner = Learner(None, None, opt)  # the graph only zeroes the optimizer's gradients; the step is this fake's
    batches = _epoch()
    losses = [step(i, learner, batches[i]) for i in range(len(batches))]
    kinds = [k for k, _ in strategy.calls]
    assert kinds == ["eager", "eager", "capture"], "two eager steps, one capture, then no Python step at all"
    assert [e for e in rec.log if e[0] == "capture"] == [("capture", "side", "thread_local")]
    assert sum(e == ("replay",) for e in rec.log) == 4, "the capture step replays once (capturing runs nothing)"
    assert ("zero_grad", True) in rec.log[: rec.log.index(("capture", "side", "thread_local"))]
    window = rec.log.index(("window", "open"))
    assert rec.log[window + 1] == ("capture", "side", "thread_local"), "the memory meter's window holds the capture"
    assert rec.log[window + 2] == ("window", "closed"), "and only the capture: its replay is after the window"
    for i, (_, x) in enumerate(strategy.calls):
        assert torch.equal(x, inputs(batches[i])[0]), "eager and captured steps train on the loop's normalised batch"
    assert step.idx.tolist() == batches[-1].tolist(), "each replay reads the latest indices from the static buffer"
    assert all(loss is step.loss for loss in losses[2:]), "a replayed step's loss is the graph's static output"
    first_eager = rec.log.index(("on", "side"))
    assert ("wait", "side", "main") in rec.log[:first_eager], "the side stream waits for the batch first"
    assert ("wait", "main", "side") in rec.log, "the loop's stream waits for the side stream's eager step"


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_a_replayed_step_launches_one_copy_beside_the_replay(monkeypatch):
    """The batch's gather and normalisation are in the graph: outside it a replayed step dispatches exactly one
    operation, the copy of its sample indices into the static buffer (where the eager data path ran six kernels and
    two more copied the batch into static image and label buffers)."""
    rec = Recorder(monkeypatch)
    step = graphs.GraphedStep(Strategy(rec), at=2, inputs=_inputs(), window=rec.window)
    learner = Learner(None, None, SimpleNamespace(zero_grad=lambda set_to_none: None))
    batches = _epoch()
    for i in range(3):  # two eager steps, the capture
        step(i, learner, batches[i])
    for i in range(3, len(batches)):
        idx = batches[i]  # a view: the loop's selection of the step's row launches nothing
        with _Ops() as seen:
            step(i, learner, idx)
        assert seen.ops == ["copy_"], f"step {i} dispatched {seen.ops} outside the graph"


def test_in_the_loop_a_replayed_step_launches_one_copy_and_the_libraries_warm_on_the_side_stream(make_cfg, monkeypatch):
    """loop.train with train.cuda_graphs, on a strategy that computes on the CPU while the memory meter sees two CUDA
    devices (tests/measure/test_memory_contract.py): the memory meter warms the libraries on the stream that
    captures (cuBLAS keeps a workspace per stream), the capture's peak is the step's figure, and between two
    replayed steps the loop itself dispatches nothing that launches a kernel (the epoch's loss sum is in the graph):
    a replayed step is the selection of its row of sample indices (a view), their copy into the static buffer, and
    the replay."""
    from tests.measure import test_memory_contract as contract

    rec = Recorder(monkeypatch)
    alloc = contract.FakeAllocator(rec.log, workspace=contract.WORKSPACE)
    alloc.install(monkeypatch)
    monkeypatch.setattr(memory, "warm_libraries", lambda devices: (rec.log.append(("warm",)), alloc.first_use()))
    monkeypatch.setattr(memory, "memory_meter", lambda s: memory.CudaPeaks(s))
    monkeypatch.setattr(meter, "clock_for", meter.HostClock)

    class FakeCuda(BaseStrategy):
        devices = property(lambda self: contract.DEVICES)

        def synchronize(self):
            pass

        def train_step(self, *args, **kwargs):
            rec.log.append(("train_step", "capture" if rec.capturing else "eager"))
            alloc.step()
            return super().train_step(*args, **kwargs)

    cfg = make_cfg(
        "train.batch_size=16",
        "train.epochs=1",
        "train.breakdown_every=0",
        "train.cuda_graphs=true",
        "train.warmup_steps=3",
        "train.check_every=1000",
    )
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 255, (160, 28, 28), dtype=torch.uint8, generator=g)
    data = Dataset(images, torch.randint(0, 10, (160,), generator=g), images[:32], torch.arange(32) % 10, "synthetic")
    strategy = FakeCuda(cfg.train, Host("cpu", 1, "cpu", "h", torch.__version__, ""))
    strategy.setup()
    ops = _Ops()
    ops.ops = rec.log  # the dispatched operations in order with the streams, captures and replays

    def mark(epoch, done, steps):
        rec.log.append(("step done", done))

    with ops:
        out = loop.train(cfg, strategy, data, progress=mark)

    log = [e for e in rec.log if e != "detach"]  # a detach makes no kernel either
    warm = log.index(("warm",))
    streams = [(i, e) for i, e in enumerate(log) if isinstance(e, tuple) and e[0] in ("on", "off")]
    assert [e for i, e in streams if i < warm][-1] == ("on", "side"), "the libraries warm on the side stream"
    assert [e for i, e in streams if i > warm][0] == ("off", "side")
    assert [e[1] for e in log if e[0] == "train_step"] == ["eager", "eager", "capture"]
    done = [i for i, e in enumerate(log) if e[0] == "step done"]
    for a, b in zip(done[3:], done[4:]):  # every step after the capture's
        assert log[a + 1 : b] == ["select", "copy_", ("replay",)], f"a replayed step in the loop: {log[a + 1 : b]}"
    at_k = contract.STEP_PEAK[0][0] - contract.RESIDENT[0], contract.STEP_PEAK[1][0] - contract.RESIDENT[1]
    assert out["peak_mem_bytes"] == list(at_k), "the capture's peak is the step's"
    assert out["mem_workspace_bytes"] == [contract.WORKSPACE] * 2
