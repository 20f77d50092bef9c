"""The models a trial trains, built by name (`build`): d2l's LeNet and CIFAR-style ResNet-18 for 1x28x28 Fashion-MNIST
(MODELS = {name: builder}), torchvision's classifiers adapted to those images (pipeline/zoo.py ADAPTATION), and a
user's own through an entry point (zoo.GROUP); and the one rule for any model's FSDP units (`blocks`)."""

from __future__ import annotations

import types

import torch
from torch import nn
from torch.nn import functional as F

from pipeline import zoo


def build_lenet(num_classes: int = 10) -> nn.Module:
    """d2l multiple-gpus.md LeNet: conv 20@3x3 -> avgpool -> conv 50@5x5 -> avgpool -> fc 128 -> fc 10
    (129,068 params)."""
    # ReLUs in place (as torchvision's models do): same function and gradients, one activation tensor less per
    # layer; two ranks sharing a host's cache and memory bandwidth slow each other down less
    return nn.Sequential(
        nn.Conv2d(1, 20, kernel_size=3),
        nn.ReLU(inplace=True),
        nn.AvgPool2d(2, 2),
        nn.Conv2d(20, 50, kernel_size=5),
        nn.ReLU(inplace=True),
        nn.AvgPool2d(2, 2),
        nn.Flatten(),
        nn.Linear(50 * 4 * 4, 128),
        nn.ReLU(inplace=True),
        nn.Linear(128, num_classes),
    )


class Residual(nn.Module):
    """d2l's residual block: two 3x3 convs with BatchNorm, optional 1x1 conv on the shortcut."""

    def __init__(self, in_ch: int, out_ch: int, use_1x1conv: bool = False, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, padding=1, stride=stride)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        self.conv3 = nn.Conv2d(in_ch, out_ch, 1, stride=stride) if use_1x1conv else None
        self.bn1, self.bn2 = nn.BatchNorm2d(out_ch), nn.BatchNorm2d(out_ch)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)), inplace=True)  # BatchNorm's backward needs its input, not its output
        y = self.bn2(self.conv2(y))
        if self.conv3 is not None:
            x = self.conv3(x)
        return F.relu(y + x, inplace=True)


def _stage(in_ch: int, out_ch: int, first: bool) -> nn.Sequential:
    return nn.Sequential(
        Residual(in_ch, out_ch, use_1x1conv=not first, stride=1 if first else 2), Residual(out_ch, out_ch)
    )


def build_resnet18(num_classes: int = 10, in_channels: int = 1) -> nn.Module:
    """d2l multiple-gpus-concise.md ResNet-18: 3x3 stride-1 stem, no max-pool, 4 stages x 2 blocks
    (11,175,818 params)."""
    return nn.Sequential(
        nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        _stage(64, 64, first=True),
        _stage(64, 128, first=False),
        _stage(128, 256, first=False),
        _stage(256, 512, first=False),
        nn.AdaptiveAvgPool2d((1, 1)),
        nn.Flatten(),
        nn.Linear(512, num_classes),
    )


MODELS = {"lenet": build_lenet, "resnet18": build_resnet18}  # d2l's (zoo.D2L)


class GrayToRGB(nn.Module):
    """torchvision's models take 3-channel images: the gray channel repeated (a view, no copy), resized first to
    `size` where it is not 28 (zoo.ADAPTATION)."""

    def __init__(self, size: int = zoo.IMAGE):
        super().__init__()
        self.size = size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.size:
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
        return x.expand(-1, 3, -1, -1)


def build(name: str) -> nn.Module:
    """A new `name` with 10 classes, taking (N, 1, 28, 28): d2l's, torchvision's (no pretrained weights, adapted as
    zoo.ADAPTATION says: Sequential(GrayToRGB, the model)) or an entry point's factory(num_classes=10)."""
    k = zoo.kind(name)
    if k == "d2l":
        return MODELS[name]()
    if k == "torchvision":
        import torchvision.models as tvm

        # GoogLeNet and Inception v3 return auxiliary logits while training unless told not to: one output, as every
        # other model (and their auxiliary heads need larger images than 28x28)
        kw: dict = {"aux_logits": False, "init_weights": True} if name in ("googlenet", "inception_v3") else {}
        size = zoo.image_size(name)
        if name.startswith("vit_"):  # a ViT takes exactly its image_size (224 by default; vit_h_14 declares 518)
            kw["image_size"] = size
        net = tvm.get_model(name, weights=None, num_classes=10, **kw)
        return nn.Sequential(GrayToRGB(size), net)
    if k == "entry point":
        return zoo.entry_points()[name].load()(num_classes=10)
    raise ValueError(zoo.refusal(name))


def build_meta(name: str) -> nn.Module:
    """`name` built on the `meta` device (no memory, no initialisation: its shapes and units); a model whose
    constructor reads tensor values (torchvision's RegNets size their stages with .tolist()) is built on the CPU and
    moved to `meta`."""
    try:
        with torch.device("meta"):
            return build(name)
    except NotImplementedError:
        return build(name).to("meta")


def build_model(name: str, seed: int, init: str = "default") -> nn.Module:
    """A freshly initialised model; the same (name, seed, init) gives the same weights on every rank and strategy.

    init="d2l": d2l's multi-GPU chapters draw conv/linear weights from N(0, 0.01) (both models); "default" keeps
    PyTorch's Kaiming-uniform init, which gets LeNet off its initial loss plateau ~150 steps sooner.
    """
    torch.manual_seed(seed)
    model = build(name)
    if init == "d2l":
        for m in model.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                nn.init.normal_(m.weight, std=0.01)
    return model


OPEN_SHARE = 0.5  # blocks(): a child holding more than this share of the model's parameters is opened


def blocks(model: nn.Module, prefix: str = "", total: int | None = None):
    """(name, block) for each of the model's FSDP units, in definition order, by one rule for any model. Each direct
    child that owns parameters is:
    - a stage (an nn.Sequential or nn.ModuleList of more than one child): each of its children that owns parameters
      is a unit (ResNet-18's residual blocks, torchvision's ResNet bottlenecks, MobileNet's and ConvNeXt's
      `features` stages, a ViT's encoder blocks);
    - else, holding more than OPEN_SHARE of the model's parameters and children of its own: opened, the same rule
      applied inside it (a torchvision model inside its adaptation, a ViT's `encoder`);
    - else one unit (a layer of LeNet, a stem, a classifier head).
    What no unit holds (a ViT's class token, the root's own parameters) belongs to the root. d2l's two models get
    the units they always had. strategies/fsdp.py shards each as one unit; the scaling and memory models price the
    same units (pipeline/scaling/memory.py)."""
    total = total if total is not None else count_params(model)
    for name, child in model.named_children():
        held = count_params(child)
        if not held:
            continue
        kids = [(n, b) for n, b in child.named_children() if count_params(b)]
        if isinstance(child, (nn.Sequential, nn.ModuleList)) and len(list(child.children())) > 1:
            yield from ((f"{prefix}{name}.{n}", b) for n, b in kids)
        elif held > OPEN_SHARE * total and kids:
            yield from blocks(child, f"{prefix}{name}.", total)
        else:
            yield prefix + name, child


def one_channel_stays_contiguous(device_type: str) -> bool:
    """Whether `apply_channels_last` leaves weights with one input channel (the first conv: [20,1,3,3] LeNet, [64,1,3,3]
    ResNet-18) contiguous on this kind of device. Such a weight is the same bytes in either layout, but its strides
    differ ([9,9,3,1] contiguous, [9,1,3,1] channels_last), and DDP's bucket view takes the weight's strides:
    - CUDA: yes. cuDNN's backward returns that weight's gradient contiguous, so under a channels_last weight DDP warns
      "Grad strides do not match bucket view strides" on every backward (seen on an H200); cuDNN picks channels_last
      kernels from the input's layout alone, so the convolution itself is unchanged (not yet run on a GPU).
    - CPU: no. oneDNN returns each gradient in its weight's layout (no warning either way), and with a contiguous
      one-channel weight beside channels_last inputs it takes a slower path: 22-27% fewer images per second (LeNet
      `single` and `ddp` k=2) on a 2-core EPYC (benchmarks/log/2026-11-26.md §3)."""
    return device_type == "cuda"


def is_channels_last_param(t: torch.Tensor, device_type: str) -> bool:
    """Whether `apply_channels_last` gives this tensor the channels_last layout on `device_type`: 4-D, and more than one
    input channel where one_channel_stays_contiguous."""
    return t.dim() == 4 and not (t.shape[1] == 1 and one_channel_stays_contiguous(device_type))


def apply_channels_last(model: nn.Module, device_type: str) -> nn.Module:
    """`model` (converted in place) with its 4-D parameters and buffers channels_last, but for what
    one_channel_stays_contiguous keeps; on CPU exactly `model.to(memory_format=channels_last)`."""
    cl = torch.channels_last
    return model._apply(lambda t: t.to(memory_format=cl) if is_channels_last_param(t, device_type) else t)


class _ChannelsLastWeightConv(torch.autograd.Function):
    """conv2d with the weight handed to the kernel in channels_last, while the parameter keeps its contiguous layout.
    The layout copy is made again in backward rather than saved: autograd keeps the parameter itself, whose storage
    FSDP frees after the forward and gathers again before the backward, so the copy adds no resident weight."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups):
        ctx.save_for_backward(x, weight)
        ctx.conv = (stride, padding, dilation, groups, None if bias is None else list(bias.shape))
        return F.conv2d(x, weight.to(memory_format=torch.channels_last), bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        stride, padding, dilation, groups, bias_sizes = ctx.conv
        needs = ctx.needs_input_grad
        gx, gw, gb = torch.ops.aten.convolution_backward(
            grad,
            x,
            weight.to(memory_format=torch.channels_last),
            bias_sizes,
            stride,
            padding,
            dilation,
            False,
            [0, 0],
            groups,
            [needs[0], needs[1], bias_sizes is not None and needs[2]],
        )
        gw = None if gw is None else gw.contiguous()  # the parameter's own layout
        return gx, gw, gb, None, None, None, None


def _conv_with_channels_last_weight(self: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    return _ChannelsLastWeightConv.apply(
        x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups
    )


def channels_last_at_use(model: nn.Module, device_type: str) -> nn.Module:
    """`model` (changed in place) whose convolutions take their weights in channels_last at each call, the parameters
    left contiguous: train.channels_last for a strategy whose parameters must stay contiguous (FSDP2 shards only
    contiguous parameters). CPU only: oneDNN picks its kernels from the input's and the weight's layout together, and
    with NHWC inputs beside a contiguous weight it takes a slower path (LeNet under FSDP: 1.42x the images/s at k=1,
    1.23x at k=2 with this, benchmarks/RESULTS.md); cuDNN picks channels_last kernels from the input's layout alone,
    so on CUDA the model is left as it is. A convolution with a string padding or a padding mode other than zeros
    keeps its own forward."""
    if device_type != "cpu":
        return model
    for m in model.modules():
        if type(m) is nn.Conv2d and m.padding_mode == "zeros" and not isinstance(m.padding, str):
            m.forward = types.MethodType(_conv_with_channels_last_weight, m)
    return model


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
