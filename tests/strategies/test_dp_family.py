"""dp and dp_criterion without GPUs: their arithmetic and their calls into torch.nn.parallel, on CPU stand-ins.

torch.nn.parallel's scatter, replicate, parallel_apply and gather need CUDA devices (replicate broadcasts through
NCCL/P2P copies), so each test swaps them for CPU stand-ins that keep their contracts: scatter = `chunk`, replicate =
modules sharing the original parameters (replica 0 the parameters themselves, replicas 1.. contiguous copies, as
`broadcast_coalesced` makes them), parallel_apply = a sequential loop, gather = `cat`. What these tests prove is the
strategies' arithmetic (one step equals single's loss, gradients and weights) and their intent (which devices and
memory formats they ask for). They do not show CUDA semantics: streams, NCCL broadcasts, P2P copies, cuDNN's layout
choices and their cost need a GPU (tests/strategies/test_strategies.py::test_dp_one_step_matches_single_on_gpus).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect

import pytest
import torch
from torch import nn

from pipeline.config.loader import Config
from pipeline.host.devices import Host
from pipeline.models import build_model
from pipeline.strategies import dp, dp_criterion
from pipeline.strategies.base import Learner, Strategy

K = 2
GPUS = Host(kind="cuda", n=K, name="stand-in GPU", hostname="test", torch=torch.__version__, cuda="12")
CPU = Host(kind="cpu", n=1, name="cpu", hostname="test", torch=torch.__version__, cuda="")
torch_dp = importlib.import_module("torch.nn.parallel.data_parallel")  # the name is also a function
PARALLEL_APPLY = inspect.signature(torch.nn.parallel.parallel_apply)


def _is_channels_last_only(t: torch.Tensor) -> bool:
    return t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


class StandIns:
    """CPU stand-ins for torch.nn.parallel's primitives, recording what they were asked and given."""

    def __init__(self):
        self.apply_calls: list[dict] = []  # parallel_apply's bound arguments, per call

    @staticmethod
    def scatter(x, device_ids, dim=0):
        return x.chunk(len(device_ids), dim)

    def scatter_kwargs(self, inputs, kwargs, device_ids, dim=0):
        chunks = inputs[0].chunk(len(device_ids), dim)
        return tuple((c,) for c in chunks), tuple({} for _ in chunks)

    @staticmethod
    def replicate(network, devices, detach=False):
        """Replica j shares the network's parameters through autograd (gradients flow back to them, as through
        Broadcast); replica 0 keeps their layout, replicas 1.. get contiguous copies (broadcast_coalesced's
        flatten/unflatten)."""
        replicas = []
        for j in range(len(devices)):
            copies = {m: m._replicate_for_data_parallel() for m in network.modules()}
            for m, c in copies.items():
                c._former_parameters = {}
                for key, child in m._modules.items():
                    c._modules[key] = None if child is None else copies[child]
                for key, p in m._parameters.items():
                    t = None if p is None else (p.view_as(p) if j == 0 else p.contiguous())
                    if detach and t is not None:
                        t = t.detach()
                    setattr(c, key, t)
                    c._former_parameters[key] = t
            replicas.append(copies[network])
        return replicas

    def parallel_apply(self, modules, inputs, kwargs_tup=None, devices=None):
        self.apply_calls.append(
            PARALLEL_APPLY.bind(modules, inputs, kwargs_tup, devices).arguments | {"modules": list(modules)}
        )
        kwargs_tup = kwargs_tup or [{}] * len(modules)
        return [
            m(*(i if isinstance(i, (list, tuple)) else (i,)), **kw) for m, i, kw in zip(modules, inputs, kwargs_tup)
        ]

    @staticmethod
    def gather(outputs, target_device, dim=0):
        return torch.cat([o.unsqueeze(0) if o.dim() == 0 else o for o in outputs], dim)


@pytest.fixture
def stand_ins(monkeypatch):
    s = StandIns()
    for name in ("scatter", "replicate", "parallel_apply", "gather"):
        monkeypatch.setattr(dp_criterion, name, getattr(s, name))
    monkeypatch.setattr(torch_dp, "scatter_kwargs", s.scatter_kwargs)
    monkeypatch.setattr(torch_dp, "replicate", s.replicate)
    monkeypatch.setattr(torch_dp, "parallel_apply", s.parallel_apply)
    monkeypatch.setattr(torch_dp, "gather", s.gather)
    return s


def _train_cfg(devices: int = K):
    return dataclasses.replace(Config().train, devices=devices)


def _model(channels_last: bool) -> nn.Module:
    model = build_model("lenet", 0)
    return model.to(memory_format=torch.channels_last) if channels_last else model


def _batch(channels_last: bool, n: int = 8):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)
    return (x.contiguous(memory_format=torch.channels_last) if channels_last else x), y


def _single_step(model, x, y):
    s = Strategy(_train_cfg(devices=1), CPU)
    m, crit = s.wrap(model, nn.CrossEntropyLoss())
    opt = s.build_optimizer(m)
    loss = s.train_step(Learner(m, crit, opt), x, y)
    return loss, {n: p.grad.clone() for n, p in m.named_parameters()}, m.state_dict()


def _dp_model(model):
    """dp's wrapped model as DataParallel builds it on a CUDA host, driven on CPU: DataParallel gives up its devices
    without CUDA (data_parallel.py, `device_type is None`), so the test tells it CUDA is there and lets the module
    stay on the CPU."""
    s = dp.DataParallelStrategy(_train_cfg(), GPUS)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch_dp, "_get_available_device_type", lambda: "cuda")
        mp.setattr(torch_dp, "_check_balance", lambda device_ids: None)
        wrapped, crit = s.wrap(model, nn.CrossEntropyLoss())
    wrapped.src_device_obj = torch.device("cpu")
    return s, wrapped, crit


def _parallel_step(name, model, x, y):
    """One dp or dp_criterion step through the strategy's hooks (dp's targets stay on the CPU: no cuda:j here)."""
    if name == "dp":
        s, m, crit = _dp_model(model)
        s.place_batch = lambda model, x, y: [(model, x, y)]
    else:
        s = dp_criterion.DataParallelCriterionStrategy(_train_cfg(), GPUS)
        m, crit = s.wrap(model, nn.CrossEntropyLoss())
    opt = s.build_optimizer(m)
    loss = s.train_step(Learner(m, crit, opt), x, y)
    inner = m.module
    return loss, {n: p.grad.clone() for n, p in inner.named_parameters()}, inner.state_dict()


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("name", ["dp", "dp_criterion"])
def test_one_step_equals_single_on_stand_ins(stand_ins, name, channels_last):
    """dp's gather-then-loss and dp_criterion's per-device losses (the mean of k equal-chunk means) give single's
    loss, gradients and updated weights, with K=2 stand-in devices. Arithmetic only: NCCL reductions and cuDNN
    kernels on real GPUs can differ in the last bits (the GPU test's tolerance covers that)."""
    model = _model(channels_last)
    x, y = _batch(channels_last)
    ref_loss, ref_grads, ref_state = _single_step(copy.deepcopy(model), x, y)
    loss, grads, state = _parallel_step(name, copy.deepcopy(model), x, y)
    assert len(stand_ins.apply_calls) == (1 if name == "dp" else 2)  # dp_criterion: model, then criterion
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    for key in ref_grads:
        torch.testing.assert_close(grads[key], ref_grads[key], rtol=1e-5, atol=1e-6, msg=key)
    for key in ref_state:
        torch.testing.assert_close(state[key], ref_state[key], rtol=1e-5, atol=1e-6, msg=key)


def test_dp_criterion_gives_parallel_apply_the_replicas_devices(stand_ins):
    """Each parallel_apply call (the model's replicas, then the criterion's) names the replicas' devices, as
    nn.DataParallel does (data_parallel.py: `self.device_ids[: len(replicas)]`); without them every worker thread
    runs under device 0 and cuda:0's current stream. Intent only: which stream a kernel lands on needs a GPU."""
    x, y = _batch(False)
    _parallel_step("dp_criterion", _model(False), x, y)
    assert [c["devices"] for c in stand_ins.apply_calls] == [[0, 1], [0, 1]]
    assert all(len(c["devices"]) == len(c["modules"]) for c in stand_ins.apply_calls)


@pytest.mark.parametrize("name", ["dp", "dp_criterion"])
def test_every_replica_keeps_device_0s_memory_format(stand_ins, name):
    """With channels_last weights on device 0, the replicas that run the forward on devices 1.. carry them in the
    same layout, though replicate's broadcast hands them back contiguous: every device's convolutions see the same
    layouts (equal per-device work). Intent only: whether cuDNN then picks the same kernels, and the time saved,
    needs a GPU."""
    model = _model(True)
    assert any(_is_channels_last_only(p) for p in model.parameters())  # the check below is not vacuous
    x, y = _batch(True)
    _parallel_step(name, model, x, y)
    replicas = stand_ins.apply_calls[0]["modules"]
    assert len(replicas) == K
    formats = [[_is_channels_last_only(t) for _, t in _replica_tensors(model, r)] for r in replicas]
    want = [_is_channels_last_only(p) for p in model.parameters()]
    assert formats == [want] * K


def _replica_tensors(original: nn.Module, replica: nn.Module):
    """A replica's parameter tensors, in the original's parameters() order (replicate stores them as attributes)."""
    for m, r in zip(original.modules(), replica.modules()):
        for key, p in m._parameters.items():
            if p is not None:
                yield key, getattr(r, key)


def test_contiguous_weights_leave_the_replicas_as_replicate_made_them(stand_ins):
    """Without channels_last weights match_layout changes nothing: each replica keeps replicate's own tensors."""
    model = _model(False)
    replicas = stand_ins.replicate(model, [0, 1])
    before = [[id(t) for _, t in _replica_tensors(model, r)] for r in replicas]
    dp.match_layout(model, replicas)
    assert [[id(t) for _, t in _replica_tensors(model, r)] for r in replicas] == before
