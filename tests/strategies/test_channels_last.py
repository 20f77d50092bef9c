"""train.channels_last converts every 4-D weight, but on CUDA leaves those with one input channel contiguous
(models.apply_channels_last): such a weight is the same bytes in either layout, and left contiguous its strides match
the gradient cuDNN's convolution backward returns, so DDP's bucket view (the weight's strides) takes that gradient
without its "Grad strides do not match bucket view strides" warning on every backward.

On CPU oneDNN's convolution backward returns each weight's gradient in the weight's own layout, so the mismatch never
shows there, and a contiguous one-channel weight would slow its convolution: CPU converts every 4-D weight.
cuDNN's backward returns a one-input-channel weight's gradient with contiguous strides ([9,9,3,1] for a [64,1,3,3]
weight, whatever the weight's). The DDP check below applies the CUDA rule to CPU tensors and reproduces cuDNN with a
gradient hook on those weights (it runs before the gradient is accumulated and reaches DDP's reducer); what cuDNN
itself returns needs a GPU. pytest tests/strategies/test_channels_last.py -q"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from pipeline.config.loader import Config
from pipeline.host.devices import Host
from pipeline.models import apply_channels_last, build_model, is_channels_last_param
from pipeline.strategies import STRATEGIES
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
    model, _, _ = build(t, strategy)
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
                strategy.train_step(model, criterion, optimizer, x, torch.randint(0, 10, (2,), generator=g))
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
