"""DataParallelModel + DataParallelCriterion (Hang Zhang's recipe), on torch.nn.parallel primitives.

Delta from `dp`: the model's outputs stay on their devices (no gather of logits onto device 0), the loss is
computed on each device against its chunk of the targets, and only the k scalar losses are gathered and
averaged, so device 0 no longer holds every output. CPU-only hosts: unavailable, as for `dp`.

Each `parallel_apply` names the replicas' devices, as nn.DataParallel does: without them every worker thread runs
under device 0 and cuda:0's current stream, so a tensor a module creates without a device lands on cuda:0
(torch/nn/parallel/parallel_apply.py turns `None` into the current device). Replicas keep device 0's memory format
(dp.match_layout).
"""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import gather, parallel_apply, replicate, scatter

from .dp import DataParallelStrategy, match_layout


class DataParallelModel(nn.Module):
    """Like nn.DataParallel, but returns the per-device outputs instead of gathering them."""

    def __init__(self, module: nn.Module, device_ids: list[int]):
        super().__init__()
        self.module, self.device_ids = module, device_ids

    def forward(self, x):
        inputs = scatter(x, self.device_ids)
        devices = self.device_ids[: len(inputs)]
        replicas = match_layout(self.module, replicate(self.module, devices))
        return parallel_apply(replicas, [(i,) for i in inputs], devices=devices)


class DataParallelCriterion(nn.Module):
    """Applies the criterion on each device to (its output, its chunk of the target); mean of the k losses."""

    def __init__(self, criterion: nn.Module, device_ids: list[int]):
        super().__init__()
        self.criterion, self.device_ids = criterion, device_ids

    def forward(self, outputs, target):
        devices = self.device_ids[: len(outputs)]
        targets = scatter(target, devices)
        crits = (
            replicate(self.criterion, devices)
            if any(True for _ in self.criterion.parameters())
            else [self.criterion] * len(outputs)
        )
        losses = parallel_apply(crits, [(o, t) for o, t in zip(outputs, targets)], devices=devices)
        return gather(losses, self.device_ids[0], dim=0).mean()  # equal chunks: mean of means = global mean


class DataParallelCriterionStrategy(DataParallelStrategy):
    name = "dp_criterion"

    def wrap(self, model, criterion):
        ids = list(range(self.cfg.devices))
        return DataParallelModel(model, ids), DataParallelCriterion(criterion, ids)

    def place_batch(self, model, x, y):
        return [(model, x, y)]  # the criterion scatters the targets to the outputs' devices itself

    def eval_model(self, model):
        return model.module
