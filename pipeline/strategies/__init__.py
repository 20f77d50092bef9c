"""STRATEGIES: one small module per data-parallel strategy, all behind base.Strategy."""
from .base import Strategy
from .ddp import DDPStrategy
from .ddp_amp import DDPAmpStrategy
from .dp import DataParallelStrategy
from .dp_criterion import DataParallelCriterionStrategy
from .fsdp import FSDPStrategy
from .scratch import ScratchStrategy

STRATEGIES: dict[str, type[Strategy]] = {s.name: s for s in (
    Strategy, ScratchStrategy, DataParallelStrategy, DataParallelCriterionStrategy,
    DDPStrategy, DDPAmpStrategy, FSDPStrategy)}

__all__ = ["STRATEGIES", "Strategy"]
