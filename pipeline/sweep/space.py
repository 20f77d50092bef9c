"""A strategy's search space as the sweep runs it, built once per sweep (Space): its points (the product of each
SpaceConfig's lists, with the knob dimensions the strategy's catalog row accepts), Optuna's categorical choices (only
the dimensions that vary are Optuna parameters), a point's trial configuration, and the study name that identifies
the space and everything else that changes a trial's result (identity: every setting but the NEUTRAL ones, named with
their reasons, and the code, data, torch and model sources the trials run on).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json

from pipeline import catalog, zoo
from pipeline.catalog import KNOBS
from pipeline.config import loader
from pipeline.data.files import whole
from pipeline.sweep import provenance
from pipeline.trial.lifecycle import stopping_listeners

SPACE_KEYS = loader.SPACE_KEYS  # a trial's point: one value of each


def points(cfg, strategy: str) -> list[dict]:
    """Every point of the strategy's space, in a stable order (knob dimensions only where the catalog lists them):
    the one place a sweep's points come from. A train setting the user set is already pinned in cfg's spaces
    (loader.pin); a configuration a sweep cannot honour is refused here too, whoever asks (loader.sweep_refusal)."""
    loader.check_sweep(cfg)
    keys = [k for k in SPACE_KEYS if k not in KNOBS or k in catalog.knobs(strategy)]
    defaults = type(cfg.train)()
    seen: dict = {}  # a point's values (scalars, so hashable) -> the point; a dict keeps the first-seen order
    for space in cfg.space(strategy):
        # a dimension the space leaves empty is not swept: the train section's value (train.optimizer)
        dims = (getattr(space, k) or (getattr(cfg.train, k),) for k in keys)
        for combo in itertools.product(*dims):
            point = dict(zip(keys, combo))
            # a setting that does not apply at the point (compile_mode where compile is off) is its default there:
            # the point runs and records what it runs, and is the point that sets the default
            for k in catalog.APPLIES_WITH.keys() & point.keys():
                if not catalog.applies(k, strategy, point):
                    point[k] = getattr(defaults, k)
            seen.setdefault(tuple(point.values()), None)  # a set lookup, not a scan: a 200x200 grid is 40,000 points
    return [dict(zip(keys, combo)) for combo in seen]


def constants(space: dict) -> dict:
    """The dimensions of `space` (choices) that take one value, with that value. They are not Optuna parameters: a
    parameter of one value is listed at 0.00 in optuna-dashboard's importances and tells nothing; the study shows
    them once instead (study_view.name_study)."""
    return {k: vals[0] for k, vals in space.items() if len(vals) == 1}


def trial_config(cfg, strategy: str, point: dict):
    """cfg with the point's train settings, validated like replace_train, and the settings that do not reach its
    trial at their defaults (`unapplied`). Only the train section is rebuilt: cfg's sweep.spaces (already validated,
    and as big as the grid) is set aside meanwhile, so a point costs the same whatever the size of the space it comes
    from."""
    bare = dataclasses.replace(cfg, sweep=dataclasses.replace(cfg.sweep, spaces={}))
    train = {**unapplied(cfg, strategy, point), **point}
    return dataclasses.replace(cfg, train=loader.replace_train(bare, strategy=strategy, **train).train)


def unapplied(cfg, strategy: str, point: dict) -> dict:
    """The train settings of catalog.APPLIES_WITH that a trial of `strategy` at `point` does not run with (ddp's
    train.amp_dtype: it has no autocast), each at its default. A sweep of several strategies takes such a setting
    for those it applies to (loader.sweep_refusal); the others' trials run and record the default, and their studies'
    names do not change with it (`identity`)."""
    defaults = type(cfg.train)()
    out = {}
    for k, (_, need) in catalog.APPLIES_WITH.items():
        on = point.get(need, getattr(cfg.train, need, False))
        if k not in point and not catalog.applies(k, strategy, {need: on}):
            out[k] = getattr(defaults, k)
    return out


class Space:
    """One strategy's search space, built once per sweep (stage.run_sweep) from the resolved configuration, which is
    read here and nowhere after for what the space holds:

    points      every point, in a stable order (points())
    choices     per dimension, every value it takes, in first-seen order (Optuna's categorical distributions)
    constants   the dimensions of one value, which are not Optuna parameters (constants())
    identity    what the study's trials depend on (identity()), and `name`, the study name its digest gives
    facts       the code, data and torch the trials run on (provenance.FACTS), as the study and its table record them

    and a point's trial Config (config: built and validated once however often it is asked for, by the set-up's
    feasibility check, by every claim's and by the trial that runs it; the last `keep` are kept, a Config sharing
    every section but train with the sweep's, so a grid of any size costs bounded memory)."""

    def __init__(self, cfg, strategy: str, keep: int = 1024):
        self.cfg, self.strategy = cfg, strategy
        self.points = points(cfg, strategy)
        self.choices = _choices(self.points)
        self.constants = constants(self.choices)
        data = provenance.data_content(cfg)
        self.identity = identity(cfg, strategy, self.points, data)
        self.hash = hashlib.sha1(json.dumps(self.identity, sort_keys=True, default=str).encode()).hexdigest()[:10]
        # identifies the study by everything that changes a trial's result, so that a number is never filed under
        # another configuration: a rerun finds its study by name, a changed setting finds none and starts a new one
        self.name = f"{cfg.profile}-{strategy}-{self.hash}"
        self.facts = provenance.facts(data)
        self._config = functools.lru_cache(maxsize=keep)(lambda key: trial_config(cfg, strategy, dict(key)))

    def config(self, point: dict):
        """The point's trial Config (trial_config), built once."""
        return self._config(tuple(sorted(point.items())))

    def suggest(self, trial) -> dict:
        """A claimed trial's whole point: the dimensions that vary suggested to Optuna as categoricals (its
        parameters, which its enqueued point fixes), the constant ones taken from the space. records.table.point_of
        reads the whole point of a stored trial back."""
        fixed = self.constants
        return {k: fixed[k] if k in fixed else trial.suggest_categorical(k, v) for k, v in self.choices.items()}

    def defaulted(self) -> dict:
        """The catalog.APPLIES_WITH settings cfg sets away from their defaults that some of this strategy's points do
        not run with (`unapplied`): name -> (the value set, the default those points run and record, how many points
        of how many). The sweep says so before its first trial, so that a row recording the default is no surprise."""
        defaults, out = type(self.cfg.train)(), {}
        for k in catalog.APPLIES_WITH:
            set_to, default = getattr(self.cfg.train, k), getattr(defaults, k)
            if set_to == default:
                continue
            n = sum(1 for p in self.points if k in unapplied(self.cfg, self.strategy, p))
            if n:
                out[k] = (set_to, default, n, len(self.points))
        return out

    def changed_settings(self) -> dict:
        """The identity's settings whose values differ from the schema's defaults, and the listeners that can stop a
        trial: what sets this study apart, shown on its MLflow parent run."""
        default = Space(type(self.cfg)(), self.strategy).identity["settings"]
        own = self.identity
        changed = {k: v for k, v in own["settings"].items() if default.get(k) != v}
        return {**changed, **({"tracking.listeners": own["stopping_listeners"]} if "stopping_listeners" in own else {})}


def _choices(pts: list[dict]) -> dict:
    out: dict = {}
    for p in pts:
        for k, v in p.items():
            out.setdefault(k, {}).setdefault(v, None)
    return {k: list(vs) for k, vs in out.items()}


# The settings that cannot change a trial's result, each with the reason: where results are stored, how processes
# find each other, when a trial may start or is given up, which stage reads a section. A section's name stands for
# all its fields. Every other setting of the resolved configuration is part of a study's identity, so a setting
# added to the schema changes the study (a rerun starts a new one) until it is named here with its reason
# (tests/sweep/test_identity.py changes every field and checks both sides).
NEUTRAL = {
    "profile": "the study name's prefix; the profile's settings are resolved into the others",
    "data.mirror": "where the four files are downloaded from; the files are verified by their checksums",
    "train.strategy": "the study's strategy stands in for it (a sweep refuses it set: loader.strategy_refusal)",
    "train.node_rank": "which node this is; every node of a trial runs the same configuration",
    "train.rdzv_endpoint": "where the nodes of a trial meet",
    "train.rdzv_id": "the name the nodes of a trial meet under",
    "train.local_addr": "the address a node advertises to the others",
    "sweep.strategies": "which strategies run trials; each strategy has its own study",
    "sweep.spaces": "the strategy's own points stand in for it (other strategies' spaces do not change this one)",
    "sweep.storage": "the store the study lives in",
    "sweep.n_trials": "the budget: a study whose budget grows runs the new part (stage.prepare_study)",
    "sweep.trial_timeout_s": "when a running trial is given up; a trial that completes measured the same",
    "sweep.quiet_wait_s": "how long to wait for a quiet host before a trial; each trial records its own load",
    "sweep.remeasure_interfered": "how often a flagged trial is enqueued again; each copy is a trial of its own",
    "tracking.uri": "the MLflow store runs are logged to",
    "tracking.experiment": "the MLflow experiment runs are logged under",
    "tracking.listeners": "stores told of each trial in the sweep's process; one that can stop a trial is in the "
    "identity by name (identity: stopping_listeners)",
    "analyze": "read by the analysis stage only, after the trials",
    "overlap": "read by the overlap stage only",
    "slurm.account": "the account a job is charged to",
    "slurm.poll_s": "how often a job's state is read",
    "slurm.rdzv_port": "where a job's nodes meet",
    "slurm.time_limit_min": "when a running job is given up; a trial that completes measured the same",
}


def _settings(cfg) -> dict:
    """Every setting of the resolved configuration as {"section.field" (or "field"): value}."""
    out: dict = {}
    for section, value in cfg.to_dict().items():
        if isinstance(value, dict) and section != "profile":
            out.update({f"{section}.{k}": v for k, v in value.items()})
        else:
            out[section] = value
    return out


def neutral(setting: str) -> bool:
    return setting in NEUTRAL or setting.split(".", 1)[0] in NEUTRAL


def identity(cfg, strategy: str, pts: list[dict], data: dict | None) -> dict:
    """What a study's trials depend on: the strategy (and its catalog revision), its points `pts`, every setting not
    NEUTRAL (a train setting a point sets is the point's; one no point runs with, at its default), the listeners that
    can stop a trial (a point one of them stopped is measured by the study without it, never filed as its result),
    and what ran beside the settings (provenance): the trial's code, the torch release, the release of each model's
    source beyond d2l (torchvision, a user's package) and the data's content `data` (provenance.data_content) in
    place of the folder's spelling."""
    per_point = {f"train.{k}" for p in pts for k in p}
    key = {k: v for k, v in _settings(cfg).items() if not neutral(k) and k not in per_point}
    # a setting no point runs with is its default in every trial (unapplied): the default in the name too
    never = [unapplied(cfg, strategy, p) for p in pts] or [unapplied(cfg, strategy, {})]
    key.update({f"train.{k}": v for k, v in never[0].items() if all(k in n for n in never)})
    # the data's content stands for its folder; a folder with no prepared data yet is named by its resolved path
    del key["data.dir"]
    for limit, n in (("data.train_limit", "train"), ("data.test_limit", "test")):
        key[limit] = whole(key[limit], data and data[n])  # 0 and the set's size load the same samples
    # none adds anything when absent or at its first value: earlier studies keep their names
    revision = catalog.SPECS[strategy].revision
    stoppers = stopping_listeners(cfg)
    models = sorted({p.get("model", cfg.train.model) for p in pts} - set(zoo.D2L))
    return {
        "strategy": strategy,
        "points": pts,
        "settings": key,
        "code_digest": provenance.code_digest(),
        "torch_version": provenance.torch_version(),
        "data": data["digest"] if data else str(provenance.data_root(cfg)),
        **({"revision": revision} if revision > 1 else {}),
        **({"stopping_listeners": stoppers} if stoppers else {}),
        **({"model_sources": {m: zoo.source(m) for m in models}} if models else {}),
    }
