"""train.optimizer: every strategy steps with the configured optimizer (d2l's plain SGD, SGD with momentum, AdamW),
one step of each at k=2 equals single's with the same optimizer, and the memory its state takes is what the CPU
probe measures: ZeRO-1 and FSDP save a share of AdamW's state against DDP, of the size the model says."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.testing._internal.distributed.fake_pg import FakeStore

from pipeline.config.loader import Config
from pipeline.doctor import equivalence
from pipeline.host.devices import Host, probe
from pipeline.measure.memory import CpuMemProbe
from pipeline.models import build_model
from pipeline.strategies import STRATEGIES, Strategy
from pipeline.strategies.scratch import ManualAdamW, ManualSGD, Replicas

TWO = probe().n >= 2
CPU = Host(kind="cpu", n=2, name="cpu", hostname="test", torch=torch.__version__, cuda="")
STATEFUL = ("sgd_momentum", "adamw")
_RUNS: dict = {}  # (strategy, k, optimizer) -> (final state, metrics): the size test reuses the parity trials


def one_step(make_cfg, tmp_path, strategy, k, optimizer):
    """equivalence.one_step with train.optimizer, run once per (strategy, k, optimizer) in this module."""
    key = (strategy, k, optimizer)
    if key not in _RUNS:
        out = tmp_path / f"{strategy}-{k}-{optimizer}"
        _RUNS[key] = equivalence.one_step(make_cfg(), out, strategy, k, extra=(f"train.optimizer={optimizer}",))
    return _RUNS[key]


def train_cfg(optimizer: str):
    return dataclasses.replace(Config().train, optimizer=optimizer, lr=0.1)


def test_the_default_is_d2ls_plain_sgd():
    """No optimizer state unless asked: the seeds' recipe stays the default."""
    assert Config().train.optimizer == "sgd"
    opt = Strategy(Config().train, CPU).build_optimizer(build_model("lenet", 0))
    assert type(opt) is torch.optim.SGD and opt.defaults["momentum"] == 0


@pytest.mark.parametrize(
    "optimizer,cls,settings",
    [
        ("sgd", torch.optim.SGD, {"momentum": 0}),
        ("sgd_momentum", torch.optim.SGD, {"momentum": 0.9}),
        ("adamw", torch.optim.AdamW, {"betas": (0.9, 0.999), "weight_decay": 0.01}),
    ],
)
def test_each_optimizer_is_built_with_its_settings_and_the_configured_lr(optimizer, cls, settings):
    opt = Strategy(train_cfg(optimizer), CPU).build_optimizer(build_model("lenet", 0))
    assert type(opt) is cls and opt.defaults["lr"] == 0.1
    assert {k: opt.defaults[k] for k in settings} == settings


@pytest.mark.parametrize("optimizer", ["sgd", *STATEFUL])
def test_zero1_wraps_the_configured_optimizer(optimizer):
    """ZeroRedundancyOptimizer takes the class and every setting its constructor accepts (AdamW's defaults hold
    one, decoupled_weight_decay, that AdamW's constructor does not)."""
    model = build_model("lenet", 0)
    plain = Strategy(train_cfg(optimizer), CPU).build_optimizer(model)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        opt = STRATEGIES["zero1"](train_cfg(optimizer), CPU).build_optimizer(model)
    finally:
        dist.destroy_process_group()
    assert isinstance(opt, ZeroRedundancyOptimizer) and type(opt.optim) is type(plain)
    assert opt.optim.defaults == plain.defaults


@pytest.mark.parametrize("optimizer", STATEFUL)
def test_scratch_writes_the_update_by_hand_and_matches_torchs(optimizer):
    """scratch's hand-written momentum and AdamW (d2l's way) give torch.optim's update over three steps, on every
    replica, and keep one copy of the state per replica from the start."""
    torch.manual_seed(0)
    ref, copy_ = build_model("lenet", 0), build_model("lenet", 0)
    replicas = Replicas(copy_, [torch.device("cpu")] * 2)
    torch_opt = Strategy(train_cfg(optimizer), CPU).build_optimizer(ref)
    mine = STRATEGIES["scratch"](train_cfg(optimizer), CPU).build_optimizer(replicas)
    assert isinstance(mine, ManualAdamW if optimizer == "adamw" else ManualSGD)
    per_param = 2 if optimizer == "adamw" else 1
    params = sum(p.numel() for p in ref.parameters())
    assert sum(t.numel() for t in mine.state_tensors()) == 2 * per_param * params  # two replicas
    for _ in range(3):
        grads = [torch.randn_like(p) for p in ref.parameters()]
        for model in (ref, *replicas.replicas):
            for p, g in zip(model.parameters(), grads):
                p.grad = g.clone()
        torch_opt.step()
        mine.step()
    for r in replicas.replicas:
        for a, b in zip(ref.parameters(), r.parameters()):
            torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-6)


def test_the_cpu_probe_counts_the_state_a_first_step_makes():
    """A torch optimizer makes its state inside the probe step, after the peak of the forward and backward; the
    probe adds it, since every later step holds it at that peak: AdamW's probe is plain SGD's plus two buffers per
    parameter (and one 4-byte step counter per parameter tensor), to the byte."""
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))

    def peak(optimizer):
        model = build_model("lenet", 0)
        opt = Strategy(train_cfg(optimizer), CPU).build_optimizer(model)
        with CpuMemProbe([torch.device("cpu")], model, opt) as p:
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return p.peak

    model = build_model("lenet", 0)
    params, tensors = sum(p.numel() for p in model.parameters()), len(list(model.parameters()))
    assert peak("adamw") - peak("sgd") == 2 * 4 * params + 4 * tensors
    assert peak("sgd_momentum") - peak("sgd") == 4 * params


@pytest.mark.skipif(not TWO, reason="needs 2 devices")
@pytest.mark.parametrize("strategy", ["ddp", "zero1", "fsdp", "scratch"])
@pytest.mark.parametrize("optimizer", STATEFUL)
def test_one_step_at_k2_matches_single_with_the_same_optimizer(make_cfg, tmp_path, strategy, optimizer):
    """Momentum: to float tolerance, as plain SGD. AdamW's first step is lr * g / (|g| + eps) per weight, blind to
    the gradient's size: where single's gradient is itself at rounding level (a sum that cancels), the split batch's
    other summation order moves it, and AdamW turns that into a share of lr (LeNet here: 7 of 129,068 weights for
    ddp, zero1 and scratch alike, 27 for fsdp's reduce-scatter, by at most 1.5% of lr). So AdamW's check allows
    1 weight in 1,000 beyond float tolerance; a real fault (an unreduced gradient, another update rule) moves most
    of them."""
    init = equivalence.initial_state()
    ref, _ = one_step(make_cfg, tmp_path, "single", 1, optimizer)
    got, metrics = one_step(make_cfg, tmp_path, strategy, 2, optimizer)
    assert metrics["steps"] == 1 and metrics["devices"] == 2 and metrics["optimizer"] == optimizer
    if optimizer != "adamw":
        verdict = equivalence.check(ref, got, metrics, init=init, device_kind=probe().kind)
        assert verdict.ok, verdict.detail
        return
    assert not equivalence.compare(init, ref, tol=(0.9 * equivalence.LR, 0)).ok  # the step moved the weights
    atol, rtol = equivalence.FP32_TOL["cpu"]
    off = sum(int((~torch.isclose(ref[n], got[n], atol=atol, rtol=rtol)).sum()) for n in ref)
    assert off <= sum(v.numel() for v in ref.values()) / 1_000, off


def _zero1_owned(model) -> list[set[int]]:
    """Which parameter tensors (by index) each of 2 ranks keeps optimizer state for: ZeroRedundancyOptimizer's own
    partition, read in a fake world (the collectives move nothing)."""
    index = {id(p): i for i, p in enumerate(model.parameters())}
    owned = []
    for rank in range(2):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=2)
        try:
            opt = STRATEGIES["zero1"](train_cfg("adamw"), CPU).build_optimizer(model)
            owned.append({index[id(p)] for g in opt.optim.param_groups for p in g["params"]})
        finally:
            dist.destroy_process_group()
    return owned


@pytest.mark.skipif(not TWO or probe().kind != "cpu", reason="the CPU probe's figures, on 2 CPU devices")
def test_zero1_and_fsdp_save_adamws_state_against_ddp_by_the_models_size(make_cfg, tmp_path):
    """With AdamW at k=2 on LeNet, in real CPU trials: ZeRO-1's ranks together save AdamW's whole state against
    DDP's (each rank half on average), each rank exactly the state of the parameters the other rank owns; FSDP,
    which shards parameters, gradients and state, saves at least half of the state on every device.

    Tolerance: AdamW's state is two float32 buffers per parameter plus one float32 step counter per parameter
    tensor; MemTracker counts tensor storages to the byte and ZeRO-1's step differs from DDP's by its optimizer
    only (the broadcasts of the updated parameters write into the parameters), so the savings are expected to the
    byte; 1 KiB allows for a small tensor of bookkeeping, far below the 0.2 MiB the smaller rank saves."""
    model = build_model("lenet", 0)
    sizes = [p.numel() for p in model.parameters()]
    state = sum(2 * 4 * n + 4 for n in sizes)
    ddp = one_step(make_cfg, tmp_path, "ddp", 2, "adamw")[1]["peak_mem_bytes"]
    zero1 = one_step(make_cfg, tmp_path, "zero1", 2, "adamw")[1]["peak_mem_bytes"]
    fsdp = one_step(make_cfg, tmp_path, "fsdp", 2, "adamw")[1]["peak_mem_bytes"]
    assert len(ddp) == len(zero1) == len(fsdp) == 2 and ddp[0] == ddp[1]
    saved = [d - z for d, z in zip(ddp, zero1)]
    owned = _zero1_owned(model)
    for rank, mine in enumerate(owned):
        others = sum(2 * 4 * n + 4 for i, n in enumerate(sizes) if i not in mine)
        assert saved[rank] == pytest.approx(others, abs=1024), (rank, saved, others)
    assert sum(saved) / 2 == pytest.approx(state / 2, abs=1024)  # at k=2: half of AdamW's state per device
    assert max(zero1) < max(ddp)  # the report's figure (the largest per-device peak) shows a saving too
    assert all(d - f >= state / 2 for d, f in zip(ddp, fsdp)), (ddp, fsdp, state)
