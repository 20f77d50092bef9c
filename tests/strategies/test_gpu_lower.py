"""Small GPU costs the CPU can still check: evaluation runs the eager module under torch.compile, DDP broadcasts no
buffers in a world of one, and NVML's used memory leaves the driver's reserve out."""

from __future__ import annotations

import dataclasses
import os
import types

import pytest
import torch

from pipeline.config.loader import Config
from pipeline.host.devices import Host
from pipeline.measure import memory
from pipeline.models import build_model
from pipeline.strategies import STRATEGIES

from . import world

CPU = Host("cpu", 2, "cpu", "h", torch.__version__, "")


def test_evaluation_runs_the_eager_module_under_compile():
    """single and ddp evaluate the module torch.compile wraps, never the compiled one (which would compile twice
    more: eval mode, then the last partial test batch)."""
    t = Config().train
    plain = build_model("lenet", 0, "default")
    assert STRATEGIES["single"](t, CPU).eval_model(torch.compile(plain)) is plain
    assert STRATEGIES["single"](t, CPU).eval_model(plain) is plain

    class Wrapper(torch.nn.Module):  # DDP's shape: the model is its .module
        def __init__(self, module):
            super().__init__()
            self.module = module

    assert STRATEGIES["ddp"](t, CPU).eval_model(torch.compile(Wrapper(plain))) is plain


def _broadcasts() -> bool:
    t = dataclasses.replace(Config().train, strategy="ddp", devices=int(os.environ["WORLD_SIZE"]), model="resnet18")
    strategy = STRATEGIES["ddp"](t, CPU)
    strategy.setup(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    try:
        model, _ = strategy.wrap(build_model("resnet18", 0, "default"), torch.nn.CrossEntropyLoss())
        return model.broadcast_buffers
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("nproc,expected", [(1, False), (2, True)])
def test_ddp_broadcasts_batchnorms_buffers_only_where_there_is_another_rank(nproc, expected):
    """At k=1 there is no other copy of the running statistics to match: no broadcast before each forward."""
    assert set(world.launch(_broadcasts, nproc=nproc).values()) == {expected}


def test_ddp_in_a_world_of_one_syncs_no_buffers_and_warns_of_no_deprecated_name():
    """wrap passes the buffer-sync switch by the name the installed torch takes (forward_sync_buffers from 2.13,
    broadcast_buffers on the floor): no FutureWarning about broadcast_buffers in each trial, and at k=1 no sync of
    BatchNorm's buffers before a forward. In process, a Gloo world of one (the slow test above: both k, by launch)."""
    import warnings

    import torch.distributed as dist

    t = dataclasses.replace(Config().train, strategy="ddp", devices=1, model="resnet18", pin_cores=False)
    strategy = STRATEGIES["ddp"](t, CPU)
    threads = torch.get_num_threads()  # setup pins a rank to one thread: pytest's own is given back below
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        strategy.setup(0, 1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model, _ = strategy.wrap(build_model("resnet18", 0, "default"), torch.nn.CrossEntropyLoss())
    finally:
        dist.destroy_process_group()
        torch.set_num_threads(threads)
    deprecated = [str(w.message) for w in caught if "broadcast_buffers" in str(w.message)]
    assert not deprecated, deprecated
    assert list(model.buffers())  # BatchNorm's running statistics: something a sync would send
    assert model.broadcast_buffers is False and not model.will_sync_module_buffers()
    assert getattr(model, "forward_sync_buffers", False) is False  # torch >= 2.13 keeps the switch under this name


def test_nvml_used_memory_leaves_the_drivers_reserve_out():
    """v2 memory info (used without the driver's reserve) where the driver has it, v1 where it has not."""
    v1 = types.SimpleNamespace(used=1_055_719_424)
    v2 = types.SimpleNamespace(used=552_402_944)

    def info(handle, version=None):
        if version is None:
            return v1
        if handle == "old":
            raise RuntimeError("NVMLError_FunctionNotFound")
        return v2

    nvml = types.SimpleNamespace(nvmlDeviceGetMemoryInfo=info, nvmlMemory_v2=2)
    assert memory._used(nvml, "h") == v2.used
    assert memory._used(nvml, "old") == v1.used
