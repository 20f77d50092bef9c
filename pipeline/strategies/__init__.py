"""STRATEGIES: one small module per data-parallel strategy, all behind base.Strategy, in the catalog's order.

pipeline/catalog.py holds each strategy's row (knobs, capabilities) without torch; `disagreements()` lists where a
class here says otherwise (tests/architecture/test_catalog.py keeps it empty).
"""
from .. import catalog
from pipeline.host.devices import Host
from .base import Strategy
from .ddp import DDPStrategy
from .ddp_amp import DDPAmpStrategy
from .dp import DataParallelStrategy
from .dp_criterion import DataParallelCriterionStrategy
from .fsdp import FSDPStrategy
from .scratch import ScratchStrategy

_CLASSES = {s.name: s for s in (Strategy, ScratchStrategy, DataParallelStrategy, DataParallelCriterionStrategy,
                                DDPStrategy, DDPAmpStrategy, FSDPStrategy)}
STRATEGIES: dict[str, type[Strategy]] = {name: _CLASSES[name] for name in catalog.NAMES if name in _CLASSES}


def class_facts(cls: type[Strategy]) -> dict:
    """What a class says about the capabilities a catalog row records."""
    cpu = Host(kind="cpu", n=2, name="cpu", hostname="catalog-check", torch="", cuda="")
    gpu = Host(kind="cuda", n=2, name="gpu", hostname="catalog-check", torch="", cuda="12")
    return {"multiprocess": cls.multiprocess, "one_device_only": cls.one_device_only,
            "parallel_on_cpu": cls.parallel_on_cpu, "autocast": cls.autocast is not Strategy.autocast,
            "cuda_only": cls.unavailable_reason(cpu) is not None and cls.unavailable_reason(gpu) is None}


def disagreements() -> list[str]:
    """Every way the registered classes and the catalog differ (names, order, capabilities); [] when they agree."""
    out = []
    if set(_CLASSES) != set(catalog.NAMES):
        out.append(f"classes {sorted(_CLASSES)} vs catalog rows {list(catalog.NAMES)}")
    for name, cls in STRATEGIES.items():
        row = catalog.spec(name)
        out += [f"{name}.{key}: class {got!r}, catalog {getattr(row, key)!r}"
                for key, got in class_facts(cls).items() if got != getattr(row, key)]
    return out


__all__ = ["STRATEGIES", "Strategy", "class_facts", "disagreements"]
