"""d2l "multiple GPUs from scratch": k parameter copies, the batch split k ways, a hand-written all-reduce.

Delta from `single`: `wrap` makes one replica per device; a step splits the batch over them (`place_batch`),
runs forward/backward on each replica, then `reduce_gradients` sums the gradients into device 0 and copies the sum
back *in place* (`.to()` onto the same device returns the same tensor, so rebinding instead of copying would
silently alias the replicas); the update (hand-written SGD, momentum or AdamW: train.optimizer) is applied on every
replica, each with its own copy of the optimizer state. On a CPU host the k replicas run one after
another in one process: the devices are not parallel, and the results say so (parallel_devices = False).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from pipeline.host.devices import device_for
from pipeline.measure.comm_probes import NoComm

from .base import MOMENTUM, Strategy


def allreduce(tensors: list[torch.Tensor]) -> None:
    """Sum into tensors[0], then copy the sum back into every other tensor, in place."""
    for t in tensors[1:]:
        tensors[0].add_(t.to(tensors[0].device))
    for t in tensors[1:]:
        t.copy_(tensors[0].to(t.device))


class Replicas(nn.Module):
    """k copies of a model, one per device; forward (used for evaluation) runs replica 0."""

    def __init__(self, model: nn.Module, devices: list[torch.device]):
        super().__init__()
        self.replicas = nn.ModuleList([model.to(devices[0])] + [copy.deepcopy(model).to(d) for d in devices[1:]])
        self.devices = devices

    def forward(self, x):
        return self.replicas[0](x)


class ManualSGD:
    """d2l's `sgd`, applied to every replica (the summed gradient is already the global-batch mean); with momentum,
    d2l's `sgd_momentum` (one velocity per parameter, PyTorch's convention: v = momentum * v + g, p -= lr * v). Like
    d2l's `init_momentum_states`, the state is made before training, so each replica holds its own copy throughout."""

    def __init__(self, replicas: Replicas, lr: float, momentum: float = 0.0):
        self.params = [list(r.parameters()) for r in replicas.replicas]
        self.lr, self.momentum = lr, momentum
        self.states = [[torch.zeros_like(p) for p in params] for params in self.params] if momentum else []

    @torch.no_grad()
    def step(self):
        if not self.momentum:
            for params in self.params:
                for p in params:
                    p.sub_(p.grad, alpha=self.lr)
            return
        for params, states in zip(self.params, self.states):
            for p, v in zip(params, states):
                v.mul_(self.momentum).add_(p.grad)
                p.sub_(v, alpha=self.lr)

    def state_tensors(self) -> list[torch.Tensor]:
        """Every replica's optimizer state, for the memory probe (it is no torch Optimizer)."""
        return [v for states in self.states for v in states]

    def zero_grad(self, set_to_none=True):
        for params in self.params:
            for p in params:
                p.grad = None


class ManualAdamW(ManualSGD):
    """d2l's `adam` with decoupled weight decay (AdamW), in PyTorch's order of operations (torch.optim.AdamW, one
    tensor at a time) so one step matches single's: two moments per parameter per replica, made before training."""

    def __init__(self, replicas: Replicas, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay=0.01):
        super().__init__(replicas, lr)
        self.betas, self.eps, self.weight_decay, self.t = betas, eps, weight_decay, 0
        self.states = [[(torch.zeros_like(p), torch.zeros_like(p)) for p in params] for params in self.params]

    @torch.no_grad()
    def step(self):
        (b1, b2), self.t = self.betas, self.t + 1
        step_size, root2 = self.lr / (1 - b1**self.t), (1 - b2**self.t) ** 0.5
        for params, states in zip(self.params, self.states):
            for p, (m, v) in zip(params, states):
                p.mul_(1 - self.lr * self.weight_decay)
                m.lerp_(p.grad, 1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                p.addcdiv_(m, (v.sqrt() / root2).add_(self.eps), value=-step_size)

    def state_tensors(self) -> list[torch.Tensor]:
        return [t for states in self.states for pair in states for t in pair]


class ScratchStrategy(Strategy):
    one_device_only = False
    name = "scratch"
    parallel_on_cpu = False

    def check_devices(self) -> None:
        pass

    @property
    def devices(self):
        return [device_for(self.host, i) for i in range(self.cfg.devices)]

    def wrap(self, model, criterion):
        # d2l's loss: summed per replica, divided by the global batch, so the summed gradients are the global-batch
        # mean (a function, not a module that would be called k times per step)
        n = self.cfg.batch_size
        return Replicas(model, self.devices), lambda out, target: F.cross_entropy(out, target, reduction="sum") / n

    def build_optimizer(self, model):
        # hand-written, as d2l writes them: the update is part of what "from scratch" means
        name, lr = self.cfg.optimizer, self.cfg.lr
        if name == "adamw":
            return ManualAdamW(model, lr)
        return ManualSGD(model, lr, MOMENTUM if name == "sgd_momentum" else 0.0)

    def place_batch(self, model, x, y):
        # one chunk per replica, moved to its device when its turn comes (a generator: one graph alive at a time)
        k = len(model.devices)
        for replica, dev, xs, ys in zip(model.replicas, model.devices, x.chunk(k), y.chunk(k)):
            yield replica, xs.to(dev), ys.to(dev)

    @torch.no_grad()
    def reduce_gradients(self, model):
        for grads in zip(*(r.parameters() for r in model.replicas)):
            allreduce([p.grad for p in grads])

    def comm_probe(self, model):
        return NoComm(
            "the hand-written all-reduce (reduce_gradients), synchronised wall clock: it runs after every "
            "replica's backward, so nothing overlaps it and all of it is exposed",
            whole=("reduce_gradients",),
        )

    def eval_model(self, model):
        return model.replicas[0]

    def state_dict(self, model):
        return super().state_dict(model.replicas[0])
