"""zero1 in one CPU process as each rank of a fake world of 2 (the fake backend of test_fsdp_planning.py:
collectives complete without moving data): the optimizer is the project's, wrapped; each rank keeps the state of
its own shard of the parameters only. Its one-step parity with single runs in test_strategies.py."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.testing._internal.distributed.fake_pg import FakeStore

from pipeline.config.loader import Config
from pipeline.host.devices import Host
from pipeline.models import build_model
from pipeline.scaling.model import model_layout, step_collectives
from pipeline.strategies import STRATEGIES, Strategy

WORLD = 2
CPU = Host(kind="cpu", n=WORLD, name="cpu", hostname="test", torch=torch.__version__, cuda="")


def _optimizer_as_rank(rank: int, model) -> ZeroRedundancyOptimizer:
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=WORLD)
    try:
        return STRATEGIES["zero1"](Config().train, CPU).build_optimizer(model)
    finally:
        dist.destroy_process_group()


def _state_bytes(opt) -> int:
    return sum(t.numel() * t.element_size() for s in opt.optim.state.values() for t in s.values() if torch.is_tensor(t))


def test_the_optimizer_is_the_projects_wrapped():
    """ZeroRedundancyOptimizer around base.Strategy's optimizer class, with its settings (lr, momentum, ...)."""
    model = build_model("lenet", 0)
    plain = Strategy(Config().train, CPU).build_optimizer(model)
    opt = _optimizer_as_rank(0, model)
    assert isinstance(opt, ZeroRedundancyOptimizer) and type(opt.optim) is type(plain)
    assert {k: opt.optim.defaults[k] for k in plain.defaults} == plain.defaults


def test_each_rank_updates_a_disjoint_shard_of_the_parameters():
    """The ranks' local optimizers split the parameters between them: together all of them, none twice."""
    model = build_model("lenet", 0)
    index = {id(p): i for i, p in enumerate(model.parameters())}
    shards = [
        {index[id(p)] for g in _optimizer_as_rank(r, model).optim.param_groups for p in g["params"]}
        for r in range(WORLD)
    ]
    assert shards[0] and shards[1] and not shards[0] & shards[1]
    assert shards[0] | shards[1] == set(index.values())


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_a_rank_keeps_optimizer_state_for_its_shard_only(monkeypatch, momentum):
    """With a stateful optimizer (momentum) rank 0 holds the momentum of its shard, less than the whole model's;
    with the project's plain SGD there is no state, so sharding it saves nothing (the report shows 0)."""
    monkeypatch.setattr(
        Strategy, "build_optimizer", lambda self, m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=momentum)
    )
    model = build_model("lenet", 0)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    try:
        opt = STRATEGIES["zero1"](Config().train, CPU).build_optimizer(model)
        model(torch.randn(4, 1, 28, 28)).sum().backward()
        opt.step()
    finally:
        dist.destroy_process_group()
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    mine = sum(p.numel() * p.element_size() for g in opt.optim.param_groups for p in g["params"])
    assert _state_bytes(opt) == (mine if momentum else 0) and mine < whole


def test_the_scaling_model_counts_its_broadcasts_after_the_step():
    """zero1's step: ddp's bucket all-reduce, then one broadcast per parameter tensor (all of LeNet's bytes)."""
    layout = model_layout("lenet")
    calls = step_collectives("zero1", 2, layout)
    assert [c for c in calls if c["phase"] == "backward"] == step_collectives("ddp", 2, layout)
    after = [c for c in calls if c["phase"] == "after step"]
    assert {c["collective"] for c in after} == {"broadcast"}
    assert sum(c["bytes"] for c in after) == layout["param_bytes"]
