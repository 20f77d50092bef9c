"""train.channels_last converts every 4-D weight, but on CUDA leaves those with one input channel contiguous
(models.apply_channels_last): such a weight is the same bytes in either layout, and left contiguous its strides match
the gradient cuDNN's convolution backward returns, so DDP's bucket view (the weight's strides) takes that gradient
without its "Grad strides do not match bucket view strides" warning on every backward.

On CPU oneDNN's convolution backward returns each weight's gradient in the weight's own layout, so the mismatch never
shows there, and a contiguous one-channel weight would slow its convolution: CPU converts every 4-D weight.
cuDNN's backward returns a one-input-channel weight's gradient with contiguous strides ([9,9,3,1] for a [64,1,3,3]
weight, whatever the weight's). The DDP check below applies the CUDA rule to CPU tensors and reproduces cuDNN with a
gradient hook on those weights (it runs before the gradient is accumulated and reaches DDP's reducer); what cuDNN
itself returns needs a GPU.

FSDP2 shards only contiguous parameters: under train.channels_last its convolutions take their weights in channels_last
at each call instead (models.channels_last_at_use, CPU only), with the same result and gradients, and autograd keeps
the parameter itself for the backward, not the copy. pytest tests/strategies/test_channels_last.py -q"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from pipeline.config.loader import Config
from pipeline.host.devices import Host
from pipeline.models import apply_channels_last, build_model, channels_last_at_use, is_channels_last_param
from pipeline.strategies import STRATEGIES
from pipeline.strategies.base import Learner
from tests.strategies import world

CPU = Host(kind="cpu", n=2, name="cpu", hostname="test", torch=torch.__version__, cuda="")
STRIDE_WARNING = "Grad strides do not match bucket view strides"


def _is_channels_last_only(t: torch.Tensor) -> bool:
    """The layout dp's match_layout keeps on every replica (dp.py)."""
    return t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


@pytest.mark.parametrize("name", ["lenet", "resnet18"])
def test_on_cuda_every_4d_weight_but_the_one_input_channel_ones_is_channels_last(name):
    """The first conv's weight keeps the plain model's strides, every other 4-D weight has channels_last's; dp's
    match_layout, which copies device 0's channels_last-only weights to channels_last on every replica, finds the
    first conv's contiguous, as the loop left it."""
    plain = build_model(name, 0)
    model = apply_channels_last(build_model(name, 0), "cuda")
    weights = {n: p for n, p in model.named_parameters() if p.dim() == 4}
    first = next(iter(weights))
    assert weights[first].shape[1] == 1 and not is_channels_last_param(weights[first], "cuda")
    for n, p in weights.items():
        layout = torch.channels_last if n != first else torch.contiguous_format
        assert is_channels_last_param(p, "cuda") == (n != first), n
        assert p.stride() == torch.empty_like(plain.get_parameter(n), memory_format=layout).stride(), n
        assert torch.equal(p, plain.get_parameter(n)), n
    assert not _is_channels_last_only(weights[first])
    assert all(is_channels_last_param(p, "cuda") for p in weights.values() if _is_channels_last_only(p))


@pytest.mark.parametrize("name", ["lenet", "resnet18"])
def test_on_cpu_the_trial_converts_every_4d_weight(name):
    """On CPU the trial's model is exactly `model.to(memory_format=channels_last)`: the first conv's weight too."""
    from pipeline.trial.loop import build

    t = dataclasses.replace(Config().train, strategy="single", model=name, channels_last=True)
    strategy = STRATEGIES["single"](t, CPU)
    strategy.device = torch.device("cpu")  # what setup() sets, without its process-wide thread settings
    model = build(t, strategy).model
    reference = build_model(name, t.seed, t.init).to(memory_format=torch.channels_last)
    for n, p in model.named_parameters():
        assert p.stride() == reference.get_parameter(n).stride(), n
    first = next(p for p in model.parameters() if p.dim() == 4)
    assert first.shape[1] == 1 and first.stride() == (9, 1, 3, 1)


def _worker(model_name: str) -> list[str]:
    import os

    import torch.distributed as dist

    t = dataclasses.replace(Config().train, strategy="ddp", devices=2, model=model_name, channels_last=True)
    strategy = STRATEGIES["ddp"](t, CPU)
    strategy.setup(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    try:
        model = apply_channels_last(build_model(model_name, t.seed, t.init), "cuda")  # the CUDA rule, on CPU tensors
        model, criterion = strategy.wrap(model, torch.nn.CrossEntropyLoss())
        optimizer = strategy.build_optimizer(model)
        for p in model.module.parameters():
            if p.dim() == 4 and p.shape[1] == 1:  # as cuDNN's convolution backward returns it (module docstring)
                p.register_hook(lambda grad: grad.clone(memory_format=torch.contiguous_format))
        g = torch.Generator().manual_seed(strategy.rank)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                x = torch.randn(2, 1, 28, 28, generator=g).contiguous(memory_format=torch.channels_last)
                strategy.train_step(Learner(model, criterion, optimizer), x, torch.randint(0, 10, (2,), generator=g))
        return [str(w.message) for w in caught]
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("model_name", ["lenet", "resnet18"])
def test_ddp_with_channels_last_warns_nothing_about_grad_strides(model_name):
    """Fresh ranks (the warning may be issued once per process) of a Gloo world of 2 on CPU."""
    res = world.launch(_worker, model_name)
    for rank, messages in res.items():
        assert not [m for m in messages if STRIDE_WARNING in m], (rank, messages)


# (in, out, kernel, stride, padding, bias): LeNet's two convolutions, ResNet-18's first, a strided 3x3, a 1x1 shortcut
CONVS = [
    (1, 20, 3, 1, 0, True),
    (20, 50, 5, 1, 0, True),
    (1, 64, 3, 1, 1, True),
    (8, 16, 3, 2, 1, True),
    (8, 16, 1, 2, 0, False),
]


def _two_convs(spec):
    """The same convolution twice: one left as it is, one converted with channels_last_at_use."""
    cin, cout, k, stride, pad, bias = spec
    plain = torch.nn.Conv2d(cin, cout, k, stride=stride, padding=pad, bias=bias)
    at_use = torch.nn.Conv2d(cin, cout, k, stride=stride, padding=pad, bias=bias)
    at_use.load_state_dict(plain.state_dict())
    channels_last_at_use(at_use, "cpu")
    return plain, at_use


@pytest.mark.parametrize("spec", CONVS)
def test_a_convolution_with_its_weight_channels_last_at_use_computes_the_same_and_keeps_its_layout(spec):
    """Output and the input's, weight's and bias's gradients equal the plain convolution's (fp32 rounding: the kernels
    differ); the parameter and its gradient stay contiguous, the layout FSDP2 shards."""
    plain, at_use = _two_convs(spec)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, spec[0], 12, 12, generator=g).contiguous(memory_format=torch.channels_last)
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    outs = [m(v) for m, v in zip((plain, at_use), xs)]
    up = torch.randn(outs[0].shape, generator=g)
    for o in outs:
        (o * up).sum().backward()
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xs[1].grad, xs[0].grad, rtol=1e-5, atol=1e-5)
    for n, p in plain.named_parameters():
        q = at_use.get_parameter(n)
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5)
        assert q.is_contiguous() and q.grad.is_contiguous(), n
    assert "forward" in vars(at_use) and "forward" not in vars(plain)  # the instance's own forward, the class's kept


def test_the_kernel_gets_a_channels_last_weight_and_autograd_keeps_the_parameter_not_the_copy(monkeypatch):
    """What F.conv2d receives is channels_last (for a one-channel weight too: its strides, not only its bytes); what
    autograd saves for the backward is the parameter's own storage, so FSDP freeing it after the forward frees every
    copy of the weight until the backward gathers it again."""
    from torch.nn import functional

    _, conv = _two_convs(CONVS[0])
    conv2d, seen = functional.conv2d, []

    def recording(x, w, *a):
        seen.append(w.stride())
        return conv2d(x, w, *a)

    monkeypatch.setattr(functional, "conv2d", recording)
    saved = []
    x = torch.randn(2, 1, 28, 28).contiguous(memory_format=torch.channels_last)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = conv(x)
    assert seen == [(9, 1, 3, 1)] and conv.weight.stride() == (9, 9, 3, 1)
    weights = [t for t in saved if t.shape == conv.weight.shape]
    assert weights and all(t.data_ptr() == conv.weight.data_ptr() for t in weights)
    out.sum().backward()
    assert conv.weight.grad is not None and conv.weight.grad.is_contiguous()


def test_on_cuda_the_convolutions_keep_their_own_forward():
    """cuDNN picks its kernels from the input's layout alone (models.channels_last_at_use)."""
    model = build_model("lenet", 0)
    before = [m.forward for m in model.modules()]
    assert channels_last_at_use(model, "cuda") is model
    assert [m.forward for m in model.modules()] == before


def _fsdp_worker(channels_last: bool) -> dict:
    import os

    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.nn import functional

    from pipeline.trial.loop import build

    t = dataclasses.replace(Config().train, strategy="fsdp", devices=2, model="lenet", channels_last=channels_last)
    strategy = STRATEGIES["fsdp"](t, CPU)
    strategy.setup(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    try:
        conv2d, seen = functional.conv2d, []

        def recording(x, w, *a):
            seen.append(w.is_contiguous(memory_format=torch.channels_last) and w.stride()[1] == 1)
            return conv2d(x, w, *a)

        functional.conv2d = recording
        learner = build(t, strategy)
        g = torch.Generator().manual_seed(strategy.rank)
        x = torch.randn(4, 1, 28, 28, generator=g)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        loss = strategy.train_step(learner, x, torch.randint(0, 10, (4,), generator=g))
        shards = {n: p.to_local() if isinstance(p, DTensor) else p for n, p in learner.model.named_parameters()}
        return {
            "seen": seen,
            "contiguous": all(v.is_contiguous() for v in shards.values()),
            "finite": bool(torch.isfinite(loss).all()),
        }
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("channels_last", [True, False])
def test_fsdps_trial_model_on_cpu_shards_contiguous_parameters_and_its_convolutions_take_the_setting(channels_last):
    """The trial's own build (loop.build) under FSDP2, 2 Gloo ranks: the shards stay contiguous, and each convolution
    of the step gets a channels_last weight exactly when train.channels_last is on."""
    res = world.launch(_fsdp_worker, channels_last)
    for rank, r in res.items():
        assert r["contiguous"] and r["finite"], (rank, r)
        assert len(r["seen"]) == 2 and all(v == channels_last for v in r["seen"]), (rank, r)
