"""Call-order contracts of the CUDA paths, checked on a CPU with `unittest.mock` and Host(kind="cuda", n=2).

torch.cuda's calls and the process group's creation are replaced by recorders, so what these tests prove is the
intent: which calls the code makes, in which order, with which devices. They do not show CUDA semantics (that a
synchronize waits for the right streams, that NCCL binds the communicator to the device): that needs a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
from unittest import mock

import pytest
import torch
import torch.distributed as dist

from pipeline.config.loader import Config
from pipeline.host.devices import Host
from pipeline.measure import meter
from pipeline.measure.breakdown import NO_CLOCK
from pipeline.rank_env import RankEnv
from pipeline.strategies import STRATEGIES
from pipeline.strategies.dp import DataParallelStrategy

GPUS = Host(kind="cuda", n=2, name="stand-in GPU", hostname="test", torch=torch.__version__, cuda="12")
MULTIPROCESS = [name for name, cls in STRATEGIES.items() if cls.multiprocess]


def _train_cfg(devices: int = 2):
    return dataclasses.replace(Config().train, devices=devices)


@pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled")  # ddp_amp's scaler, built in setup
@pytest.mark.parametrize("name", MULTIPROCESS)
def test_set_device_comes_before_init_process_group_with_the_ranks_device(name, monkeypatch):
    """Each rank binds its GPU (torch.cuda.set_device) before the NCCL process group is created with
    device_id=that GPU, so the communicator, the barrier and all_gather_object use the rank's own device rather than
    cuda:0. Intent only: NCCL's eager communicator set-up on a real device needs a GPU."""
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # keep the test process's own threads
    calls = mock.Mock()
    monkeypatch.setattr(torch.cuda, "set_device", calls.set_device)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", calls.init_process_group)
    monkeypatch.setattr(dist, "get_backend", lambda *a, **k: "nccl")
    strategy = STRATEGIES[name](_train_cfg(), GPUS)
    device = strategy.setup(rank_env=RankEnv(rank=1, world_size=2, local_rank=1))
    assert device == torch.device("cuda", 1)
    names = [c[0] for c in calls.mock_calls]
    assert names == ["set_device", "init_process_group"]
    assert calls.set_device.call_args.args == (torch.device("cuda", 1),)
    kwargs = calls.init_process_group.call_args.kwargs
    assert calls.init_process_group.call_args.args[:1] == ("nccl",) and kwargs["device_id"] == torch.device("cuda", 1)


class _Sampled:
    """A breakdown that samples every other steady-state step and measures nothing."""

    every = 2
    trace = None

    def is_sampled(self, n):
        return n >= 0 and n % 2 == 1

    def sample(self):
        return contextlib.nullcontext(NO_CLOCK)

    def results(self, *a):
        return None


def test_marks_are_events_on_every_device_read_only_after_each_is_synchronised(monkeypatch):
    """Every mark in meter.py (epoch start and end, steady-state start, window edges, around a sampled step) records
    one CUDA event on the current stream of every device in strategy.devices, so queued kernels on any GPU are
    counted in the interval they belong to; an event is read (`elapsed_time`) only after its device has been
    synchronised; the devices are synchronised at the epoch's edges and around sampled steps, never at a window's
    edge. Intent only: what the events and cudaDeviceSynchronize do needs a GPU."""
    strategy = DataParallelStrategy(_train_cfg(), GPUS)
    want = set(strategy.devices)
    assert want == {torch.device("cuda", 0), torch.device("cuda", 1)}
    now, events, syncs = [0.0], [], []

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.device, self.settled = None, False

        def record(self, stream=None):
            now[0] += 1.0
            self.device, self.t = stream, now[0]
            events.append(self)

        def elapsed_time(self, other):
            assert self.settled and other.settled, "an event read before its device was synchronised"
            return (other.t - self.t) * 1000.0

    def synchronize(d=None):
        syncs.append(torch.device(d))
        for e in events:
            e.settled = e.settled or e.device == torch.device(d)

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: torch.device(d))
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    monkeypatch.setattr(meter, "memory_meter", lambda s: mock.Mock())  # the CUDA allocator's peaks: not here
    m = meter.Meter(strategy, batch_size=8, warmup_steps=2, target_acc=1.0, breakdown=_Sampled(), window_steps=3)
    step, window_syncs = 0, []
    for _ in range(2):  # two epochs of 12 steps: warm-up, windows, sampled steps, epoch edges
        m.start_epoch(step)
        for _ in range(12):
            before = len(syncs)
            m.tick(step)  # a window's edge: marks only
            window_syncs.append(len(syncs) - before)
            with m.sample(step):
                pass
            step += 1
        m.end_epoch(step)
    assert m.sampled_steps > 0 and len(m.windows) >= 4 and m.epoch_throughput[-1]  # each kind of mark happened
    assert len(events) % 2 == 0 and all(
        {events[i].device, events[i + 1].device} == want for i in range(0, len(events), 2)
    ), "a mark left out a device"
    assert not any(window_syncs), "a window's edge synchronised the devices"
    assert {d for d in syncs} == want and all(e.settled for e in events)
