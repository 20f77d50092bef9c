"""ZeRO-1: DDP with the optimizer state sharded across ranks (torch.distributed.optim.ZeroRedundancyOptimizer).

Delta from `ddp`: the optimizer. Gradients are all-reduced in DDP's buckets, as in ddp, so every rank holds every
gradient; ZeroRedundancyOptimizer gives each rank a shard of the parameters (greedily by size, largest first), keeps
the optimizer's state for that shard only, updates it, and broadcasts each updated parameter from the rank that owns
it after the step: one broadcast per parameter tensor (ZeroRedundancyOptimizer's default,
`parameters_as_bucket_view=False`; what zero1 costs here includes that default). The optimizer is the project's
(base.Strategy.build_optimizer's class and settings, train.optimizer), wrapped. Plain SGD keeps no state, so there
it saves no memory: what it costs (the broadcasts) shows, what it saves shows with a stateful optimizer only
(sgd_momentum: one buffer per parameter; adamw: two). The partition is by tensor, greedy: LeNet's largest weight
(its first linear layer) is most of the model, so at k=2 the rank that owns it keeps most of the state: the largest
per-device peak falls by the other shard's state only, not by half of all of it; the savings of all ranks together
are the whole state. The state_dict is the model's (DDP's): the loop keeps no optimizer state, so nothing is
consolidated.
"""

from __future__ import annotations

from .ddp import DDPStrategy


class ZeRO1Strategy(DDPStrategy):
    name = "zero1"
    HEAVY_MODULES = (*DDPStrategy.HEAVY_MODULES, "torch.distributed.optim")

    def build_optimizer(self, model):
        import inspect

        from torch.distributed.optim import ZeroRedundancyOptimizer

        plain = super().build_optimizer(model)  # the project's optimizer: its class and settings, sharded
        # the settings its constructor takes: AdamW's defaults also hold decoupled_weight_decay, which only Adam's
        # constructor accepts (AdamW fixes it)
        takes = inspect.signature(type(plain)).parameters
        settings = {k: v for k, v in plain.defaults.items() if k in takes}
        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=type(plain), **settings)
