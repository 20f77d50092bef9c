"""STRATEGIES: one small module per data-parallel strategy, all behind base.Strategy, in the catalog's order.

pipeline/catalog.py holds each strategy's row (knobs, capabilities) without torch; the class of row `NAME` is the
Strategy subclass named NAME in pipeline/strategies/NAME.py (the reference row's is base.Strategy itself), found
here, so a new strategy is its module and its row. `disagreements()` lists where a class here says otherwise than
its row, or a row has no class (tests/architecture/test_catalog.py keeps it empty).
"""

import importlib

from pipeline.host.devices import Host

from .. import catalog
from .base import Strategy


def _class_of(name: str) -> type[Strategy] | None:
    """The class of catalog row `name`: the Strategy subclass named `name` in the module named `name`; None if
    there is none."""
    if name == catalog.REFERENCE:
        return Strategy
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise  # the module exists and fails to import: that is its error, not a missing class
        return None
    return next(
        (c for c in vars(module).values() if isinstance(c, type) and issubclass(c, Strategy) and c.name == name), None
    )


_CLASSES = {name: cls for name in catalog.NAMES if (cls := _class_of(name)) is not None}
STRATEGIES: dict[str, type[Strategy]] = dict(_CLASSES)


def class_facts(cls: type[Strategy]) -> dict:
    """What a class says about the capabilities a catalog row records."""
    cpu = Host(kind="cpu", n=2, name="cpu", hostname="catalog-check", torch="", cuda="")
    gpu = Host(kind="cuda", n=2, name="gpu", hostname="catalog-check", torch="", cuda="12")
    return {
        "multiprocess": cls.multiprocess,
        "one_device_only": cls.one_device_only,
        "parallel_on_cpu": cls.parallel_on_cpu,
        "autocast": cls.always_autocast,
        "cuda_only": cls.unavailable_reason(cpu) is not None and cls.unavailable_reason(gpu) is None,
    }


def disagreements() -> list[str]:
    """Every way the registered classes and the catalog differ (rows without a class, capabilities); [] when they
    agree."""
    out = [
        f"catalog row {name!r} has no class: pipeline/strategies/{name}.py defines no Strategy named {name!r}"
        for name in catalog.NAMES
        if name not in _CLASSES
    ]
    for name, cls in STRATEGIES.items():
        row = catalog.spec(name)
        out += [
            f"{name}.{key}: class {got!r}, catalog {getattr(row, key)!r}"
            for key, got in class_facts(cls).items()
            if got != getattr(row, key)
        ]
    return out


__all__ = ["STRATEGIES", "Strategy", "class_facts", "disagreements"]
