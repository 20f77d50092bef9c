"""ZeRO-1: DDP with the optimizer state sharded across ranks (torch.distributed.optim.ZeroRedundancyOptimizer).

Delta from `ddp`: the optimizer. Gradients are all-reduced in DDP's buckets, as in ddp, so every rank holds every
gradient; ZeroRedundancyOptimizer gives each rank a shard of the parameters (greedily by size, largest first), keeps
the optimizer's state for that shard only, updates it, and broadcasts each updated parameter from the rank that owns
it after the step. The optimizer is the project's (base.Strategy.build_optimizer's class and settings), wrapped. SGD
without momentum keeps no state, so there it saves no memory: what it costs (the broadcasts) shows, what it saves
shows with a stateful optimizer only. The state_dict is the model's (DDP's): the loop keeps no optimizer state, so
nothing is consolidated.
"""

from __future__ import annotations

from .ddp import DDPStrategy


class ZeRO1Strategy(DDPStrategy):
    name = "zero1"
    HEAVY_MODULES = (*DDPStrategy.HEAVY_MODULES, "torch.distributed.optim")

    def build_optimizer(self, model):
        from torch.distributed.optim import ZeroRedundancyOptimizer

        plain = super().build_optimizer(model)  # the project's optimizer: its class and settings, sharded
        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=type(plain), **plain.defaults)
