"""fsdp's final state: on Gloo (CPU hosts, ranks sharing a GPU) rank 0 joins CPU copies of the ranks' shards with
one c10d gather, so no collective runs on a CUDA tensor over Gloo; on NCCL distributed checkpointing's full
state_dict gathers it. Here: which path each backend takes, that the join equals the unsharded model's state in a
real Gloo world of 3 CPU ranks (uneven shards, an empty one) and distributed checkpointing's result after a step,
and that an oversubscribed 3-rank trial still equals single's step. That a Gloo world on one GPU no longer crashes
needs a GPU. pytest tests/strategies/test_fsdp_state.py -q"""

from __future__ import annotations

import copy
import dataclasses
from unittest import mock

import pytest
import torch
from torch import nn

from pipeline.config.loader import Config
from pipeline.doctor import equivalence
from pipeline.host.devices import Host
from pipeline.models import build_model
from pipeline.strategies import fsdp
from pipeline.strategies.base import Learner
from tests.strategies import world

WORLD = 3  # LeNet's rows split unevenly (20 -> 7, 7, 6), and the head's 4 rows leave rank 2 none
CPU = Host(kind="cpu", n=WORLD, name="cpu", hostname="test", torch=torch.__version__, cuda="")


def test_nccl_gathers_through_distributed_checkpointing_every_other_backend_through_cpu_shards():
    assert fsdp.full_state_fn("nccl") is fsdp.full_state_from_dcp
    for backend in ("gloo", "fake"):
        assert fsdp.full_state_fn(backend) is fsdp.full_state_from_cpu_shards


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_the_strategys_state_dict_takes_its_backends_path(backend, monkeypatch):
    """Gloo never reaches get_model_state_dict; NCCL calls it for the full state on CPU."""
    from torch.distributed.checkpoint import state_dict as dcp

    dcp_call = mock.Mock(return_value={"w": torch.ones(2)})
    monkeypatch.setattr(dcp, "get_model_state_dict", dcp_call)
    monkeypatch.setattr(fsdp, "full_state_from_cpu_shards", lambda model: {"w": torch.zeros(2)})
    strategy = fsdp.FSDPStrategy(Config().train, CPU)
    strategy.backend = backend
    got = strategy.state_dict(nn.Linear(2, 2))
    if backend == "gloo":
        assert not dcp_call.called and torch.equal(got["w"], torch.zeros(2))
    else:
        options = dcp_call.call_args.kwargs["options"]
        assert options.full_state_dict and options.cpu_offload and torch.equal(got["w"], torch.ones(2))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(build_model("lenet", 0), nn.Linear(10, 4))


def _worker() -> dict:
    import os

    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    t = dataclasses.replace(Config().train, devices=WORLD, timeout_s=60)
    strategy = fsdp.FSDPStrategy(t, CPU)
    strategy.setup(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    plain = _model()
    model, criterion = strategy.wrap(copy.deepcopy(plain), nn.CrossEntropyLoss())
    try:
        rows = {k: v.to_local().shape[0] for k, v in model.state_dict().items() if isinstance(v, DTensor)}
        before = strategy.state_dict(model)
        g = torch.Generator().manual_seed(strategy.rank)  # different data per rank
        x, y = torch.randn(4, 1, 28, 28, generator=g), torch.randint(0, 4, (4,), generator=g)
        strategy.train_step(Learner(model, criterion, strategy.build_optimizer(model)), x, y)
        with torch.no_grad():  # the loop evaluates before it saves: FSDP's root stays unsharded after a forward
            model.eval()(x)
        after = strategy.state_dict(model)
        dcp = fsdp.full_state_from_dcp(model)
        return {
            "backend": strategy.backend,
            "rows": rows,
            "plain": plain.state_dict(),
            "before": before,
            "after": after,
            "dcp": dcp,
        }
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_the_joined_cpu_shards_are_the_full_state_on_rank_0():
    res = world.launch(_worker, nproc=WORLD, rdzv_timeout_s=120)
    r0 = res[0]
    assert all(res[r]["backend"] == "gloo" for r in res)
    assert [res[r]["rows"]["0.0.weight"] for r in sorted(res)] == [7, 7, 6]  # uneven
    assert [res[r]["rows"]["1.weight"] for r in sorted(res)] == [2, 2, 0]  # rank 2 holds none
    assert all(res[r]["before"] == {} and res[r]["after"] == {} for r in res if r != 0)
    assert r0["before"].keys() == r0["plain"].keys() == r0["after"].keys() == r0["dcp"].keys()
    for k, v in r0["plain"].items():  # the joined state is the unsharded model's, bit for bit
        assert r0["before"][k].device.type == "cpu" and torch.equal(r0["before"][k], v), k
    moved = False
    for k, v in r0["dcp"].items():  # after a step: what distributed checkpointing gathers, bit for bit
        assert torch.equal(r0["after"][k], v), k
        moved |= not torch.equal(v, r0["plain"][k])
    assert moved


@pytest.mark.slow
def test_an_oversubscribed_fsdp_step_over_gloo_equals_singles(make_cfg, tmp_path):
    """The trial's own path: 3 ranks on this host's cores (train.oversubscribe), LeNet's shards uneven, the final
    state joined from CPU shards, equals single-device SGD's step on the same global batch."""
    batch = 66  # divisible by 3: equal chunks, so the mean of the ranks' means is the batch mean
    extra = ("train.oversubscribe=true",)
    ref, _ = equivalence.one_step(make_cfg(), tmp_path / "single", "single", 1, batch=batch)
    got, metrics = equivalence.one_step(make_cfg(), tmp_path / "fsdp", "fsdp", WORLD, batch=batch, extra=extra)
    assert metrics["devices"] == WORLD and metrics["backend"] == "gloo"
    verdict = equivalence.check(ref, got, metrics, init=equivalence.initial_state(), device_kind="cpu")
    assert verdict.ok, verdict.detail
