"""A strategy's search space as the sweep runs it: its points (the product of each SpaceConfig's lists, with the
knob dimensions the strategy's catalog row accepts), Optuna's categorical choices, a point's trial configuration, and
the study name that identifies the space and everything else that changes a trial's result.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json

from pipeline import catalog
from pipeline.catalog import KNOBS
from pipeline.config import loader as configmod

SPACE_KEYS = tuple(f.name for f in dataclasses.fields(configmod.SpaceConfig))  # a trial's point: one value of each


def points(cfg, strategy: str) -> list[dict]:
    """Every point of the strategy's space, in a stable order (knob dimensions only where the catalog lists them)."""
    keys = [k for k in SPACE_KEYS if k not in KNOBS or k in catalog.knobs(strategy)]
    seen: dict = {}  # a point's values (scalars, so hashable) -> the point; a dict keeps the first-seen order
    for space in cfg.space(strategy):
        for combo in itertools.product(*(getattr(space, k) for k in keys)):
            seen.setdefault(combo, None)  # a set lookup, not a scan: a 200x200 grid is 40,000 points
    return [dict(zip(keys, combo)) for combo in seen]


def choices(cfg, strategy: str) -> dict:
    """Per parameter, every value the space takes (Optuna's categorical distributions), in first-seen order."""
    out: dict = {}
    for p in points(cfg, strategy):
        for k, v in p.items():
            out.setdefault(k, {}).setdefault(v, None)
    return {k: list(vs) for k, vs in out.items()}


def trial_config(cfg, strategy: str, point: dict):
    """cfg with the point's train settings, validated like replace_train. Only the train section is rebuilt: cfg's
    sweep.spaces (already validated, and as big as the grid) is set aside meanwhile, so a point costs the same
    whatever the size of the space it comes from."""
    bare = dataclasses.replace(cfg, sweep=dataclasses.replace(cfg.sweep, spaces={}))
    return dataclasses.replace(cfg, train=configmod.replace_train(bare, strategy=strategy, **point).train)


class PointConfigs:
    """A point's trial Config (trial_config), built and validated once however often it is asked for: by the set-up's
    feasibility check, by every claim's, and by the trial that runs it. The last `keep` points are kept (a Config
    shares every section but train with the sweep's), so a grid of any size costs bounded memory."""

    def __init__(self, cfg, strategy: str, keep: int = 1024):
        self._build = functools.lru_cache(maxsize=keep)(lambda key: trial_config(cfg, strategy, dict(key)))

    def __call__(self, point: dict):
        return self._build(tuple(sorted(point.items())))


def study_name(cfg, strategy: str) -> str:
    """Identifies the search space and everything that changes a trial's result, so spaces never mix. The hash
    stays in the name (also kept as user attribute space_hash): a rerun finds its study by name, so a name without
    it would either mix spaces or, renamed, orphan every study already in a store."""
    return f"{cfg.profile}-{strategy}-{space_hash(cfg, strategy)}"


def space_hash(cfg, strategy: str) -> str:
    t = cfg.train
    key = {
        "space": points(cfg, strategy),
        "epochs": t.epochs,
        "seed": t.seed,
        "max_steps": t.max_steps,
        "data": [cfg.data.source, cfg.data.train_limit, cfg.data.test_limit],
        "warmup": t.warmup_steps,
        "amp": t.amp_dtype,
        "pruning": cfg.sweep.pruning,
        "sampler": cfg.sweep.sampler,
        **({"emulated_max_steps": cfg.sweep.emulated_max_steps} if cfg.sweep.emulated_max_steps else {}),
    }
    if cfg.sweep.repeats != 1:  # only then: studies made before repeats existed keep their names
        key["repeats"] = cfg.sweep.repeats
    return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
