"""fsdp's sharding plan for an 8-GPU world, in one CPU process: the fake process group and a model on `meta`.

The fake backend (torch/testing/_internal/distributed/fake_pg.py) lets one process act as rank r of a world of 8
without peers: collectives complete without moving data, and DeviceMesh skips device set-up for it
(torch/distributed/device_mesh.py, `backend == "fake"`). A `meta` model has shapes and no storage. What this proves
is the plan: which modules `FSDPStrategy.wrap` shards, each rank's shard shapes, the mesh, and the state_dict keys.
It shows nothing about NCCL, streams, the all-gather/reduce-scatter overlap or memory on a GPU.
"""

from __future__ import annotations

import dataclasses
import math
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from pipeline.config.loader import Config
from pipeline.host.devices import Host
from pipeline.models import blocks, build_model
from pipeline.strategies.fsdp import FSDPStrategy

WORLD = 8
GPUS = Host(kind="cuda", n=WORLD, name="stand-in GPU", hostname="test", torch=torch.__version__, cuda="12")


@pytest.fixture
def fake_world(request):
    """This process as rank `request.param` of a fake world of 8; the group is destroyed afterwards."""
    assert not dist.is_initialized()
    dist.init_process_group("fake", store=FakeStore(), rank=request.param, world_size=WORLD)
    try:
        yield request.param
    finally:
        dist.destroy_process_group()


def _shard_rows(n: int, rank: int) -> int:
    """Rows of an n-row parameter on `rank` under FSDP2's dim-0 sharding (torch.chunk: ceil(n/W) per rank, the last
    ranks get what is left, possibly none)."""
    per = math.ceil(n / WORLD)
    return max(0, min(per, n - rank * per))


@pytest.mark.parametrize("fake_world", [0, WORLD - 1], indirect=True)
@pytest.mark.parametrize("model_name", ["lenet", "resnet18"])
def test_fsdp_shards_each_block_then_the_root(fake_world, model_name):
    """wrap() makes each of models.blocks and the root an FSDP module and nothing else; every parameter becomes a
    dim-0 shard of the full parameter on a 1-D mesh of the 8 ranks, this rank holding its torch.chunk share
    (the last ranks hold fewer rows, or none: LeNet's 20-channel conv on rank 7); the state_dict keeps the plain
    model's keys, so checkpoints and the equivalence check see the same names."""
    rank = fake_world
    with torch.device("meta"):
        plain, model = build_model(model_name, 0), build_model(model_name, 0)
    names = {id(m): n for n, m in plain.named_modules()}
    want_units = {names[id(b)] for _, b in blocks(plain)} | {""}
    strategy = FSDPStrategy(dataclasses.replace(Config().train, devices=WORLD), GPUS)
    wrapped, _ = strategy.wrap(model, torch.nn.CrossEntropyLoss())

    assert {n for n, m in wrapped.named_modules() if isinstance(m, FSDPModule)} == want_units
    assert len(want_units) > 2  # blocks, not just the root
    full = dict(plain.named_parameters())
    sharded = dict(wrapped.named_parameters())
    assert sharded.keys() == full.keys()
    for name, p in sharded.items():
        assert isinstance(p, DTensor) and p.placements == (Shard(0),), name
        mesh = p.device_mesh
        assert mesh.mesh.tolist() == list(range(WORLD)) and mesh.get_local_rank() == rank, name
        assert p.shape == full[name].shape, name
        assert p.to_local().shape == (_shard_rows(full[name].shape[0], rank), *full[name].shape[1:]), name
    assert list(wrapped.state_dict().keys()) == list(plain.state_dict().keys())


@pytest.mark.parametrize("fake_world", [3], indirect=True)
def test_fsdp_default_mesh_on_a_gpu_host_is_every_rank_on_the_set_device(fake_world):
    """On a CUDA host fully_shard's default mesh (no mesh is passed by wrap) is a 1-D CUDA mesh of the whole world,
    and FSDP computes on the current device, the one DistributedStrategy.setup set (cuda:local_rank) before the
    process group. The accelerator and current device are mocked: intent only. Uses FSDP2's private helpers
    (_fsdp_init._init_default_fully_shard_mesh, _get_device_from_mesh): skipped, with the reason, where they moved."""
    from torch.distributed.fsdp._fully_shard import _fsdp_init

    default_mesh = getattr(_fsdp_init, "_init_default_fully_shard_mesh", None)
    device_from_mesh = getattr(_fsdp_init, "_get_device_from_mesh", None)
    if default_mesh is None or device_from_mesh is None:
        pytest.skip("this torch's FSDP2 has no _init_default_fully_shard_mesh/_get_device_from_mesh")
    with (
        mock.patch.object(torch._C, "_get_accelerator", lambda: torch.device("cuda")),
        mock.patch.object(torch.cuda, "current_device", lambda: fake_world),
    ):
        mesh = default_mesh()
        assert mesh.device_type == "cuda" and mesh.mesh.tolist() == list(range(WORLD))
        assert device_from_mesh(mesh) == torch.device("cuda", fake_world)
