"""Configuration: params.yaml -> frozen dataclasses, the only YAML reader in the package.

Layers, later wins: dataclass defaults < experiments/<profile>.yaml < params.yaml < --set a.b=v.
Unknown keys and invalid values raise ConfigError (one paragraph naming the key and the valid values)
before any work starts. A Config is never mutated: `override` returns a new one.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

MODELS = ("lenet", "resnet18")
STRATEGY_NAMES = ("single", "scratch", "dp", "dp_criterion", "ddp", "ddp_amp", "fsdp")
SOURCES = ("fashion-mnist", "synthetic")
COMM_HOOKS = ("none", "shm", "fp16", "bf16", "powersgd")
# a profile is a file name under experiments/, never a path: nothing outside experiments/ is read as one
PROFILE_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")
SEED_MAX = 2**32 - 1  # Optuna's samplers seed NumPy, which takes 32 bits; torch would take 64
TIMEOUT_MAX_S = 30 * 86400.0  # timers and PyTorch's collective timeout overflow near 1e9 s; 30 days is plenty


class ConfigError(ValueError):
    """A user-facing configuration error; the message says what is wrong and how to fix it."""


def _choice(*values):
    return {"choices": values}


def _range(lo=None, hi=None, lo_open=False):
    return {"lo": lo, "hi": hi, "lo_open": lo_open}


@dataclass(frozen=True)
class DataConfig:
    source: str = field(default="fashion-mnist", metadata=_choice(*SOURCES))
    dir: str = "data/fashion-mnist"
    mirror: str = ""  # URL or local directory holding the four .gz files (air-gapped clusters)
    train_limit: int = field(default=0, metadata=_range(0))  # 0 = all 60,000
    test_limit: int = field(default=0, metadata=_range(0))  # 0 = all 10,000


@dataclass(frozen=True)
class TrainConfig:
    model: str = field(default="lenet", metadata=_choice(*MODELS))
    strategy: str = field(default="single", metadata=_choice(*STRATEGY_NAMES))
    devices: int = field(default=1, metadata=_range(1))
    batch_size: int = field(default=256, metadata=_range(1))  # global batch, split over devices
    lr: float = field(default=0.2, metadata=_range(0, lo_open=True))
    epochs: int = field(default=1, metadata=_range(1))
    max_steps: int = field(default=0, metadata=_range(0))  # 0 = no limit
    seed: int = field(default=0, metadata=_range(0, SEED_MAX))  # NumPy's (Optuna's samplers) limit: 32 bits
    # weight init: PyTorch's default (Kaiming-uniform), or d2l's N(0, 0.01) for conv/linear weights, which leaves
    # LeNet on a loss plateau for its first ~150-200 steps (use it to reproduce the seeds exactly)
    init: str = field(default="default", metadata=_choice("default", "d2l"))
    warmup_steps: int = field(default=3, metadata=_range(0))  # excluded from throughput
    target_acc: float = field(default=0.8, metadata=_range(0, 1))
    oversubscribe: bool = False  # functional tests only: k > N allowed, run tagged and excluded from analysis
    output_device: int = field(default=0, metadata=_range(0))  # dp: where outputs are gathered
    amp_dtype: str = field(default="auto", metadata=_choice("auto", "bf16", "fp16"))
    timeout_s: float = field(default=120.0, metadata=_range(1, TIMEOUT_MAX_S))  # collective timeout: a hung rank fails the trial
    check_every: int = field(default=25, metadata=_range(1))  # steps between NaN/inf loss checks (one sync)
    pin_cores: bool = True  # CPU hosts: pin worker process r of a multi-process trial to core r
    channels_last: bool = True  # NHWC activations: faster convolutions on CPU (oneDNN) and GPU (tensor cores)
    compile: bool = False  # torch.compile the model
    # step-time breakdown (breakdown.py): every N-th steady-state step is timed by phase, outside the throughput
    # window; 0 = off
    breakdown_every: int = field(default=10, metadata=_range(0))
    # other processes' CPU use (cores, averaged over the trial) beyond which a trial is flagged as measured under
    # interference and leaves throughput and efficiency (interference.py)
    interference_threshold: float = field(default=0.25, metadata=_range(0))
    # DDP communication knobs (ddp, ddp_amp)
    bucket_cap_mb: float = field(default=25.0, metadata=_range(0, lo_open=True))
    grad_as_bucket_view: bool = False
    accum_steps: int = field(default=1, metadata=_range(1))  # optimizer steps use no_sync for accum_steps-1 micro-batches
    # none = DDP as PyTorch ships it (its own all-reduce: Gloo on CPU, NCCL on GPUs); shm = shared memory between the
    # ranks of one CPU host (strategies/shm_allreduce.py); fp16/bf16/powersgd = PyTorch's compression hooks
    comm_hook: str = field(default="none", metadata=_choice(*COMM_HOOKS))
    # multi-node (torchrun c10d rendezvous); nnodes=1 runs standalone on this host
    nnodes: int = field(default=1, metadata=_range(1))
    node_rank: int = field(default=0, metadata=_range(0))
    rdzv_endpoint: str = ""  # host:port of the rendezvous (c10d); empty = a free local port
    rdzv_id: str = "parallax"
    start_method: str = field(default="auto", metadata=_choice("auto", "fork", "spawn"))


@dataclass(frozen=True)
class SpaceConfig:
    """One strategy's search space; every trial is a point of the product of these lists."""
    model: tuple[str, ...] = ("lenet",)
    devices: tuple[int, ...] = (1, 2)
    batch_size: tuple[int, ...] = (256,)
    lr: tuple[float, ...] = (0.2,)
    bucket_cap_mb: tuple[float, ...] = (25.0,)
    grad_as_bucket_view: tuple[bool, ...] = (False,)
    accum_steps: tuple[int, ...] = (1,)
    comm_hook: tuple[str, ...] = ("none",)


@dataclass(frozen=True)
class SweepConfig:
    strategies: tuple[str, ...] = STRATEGY_NAMES
    storage: str = ""  # Optuna RDB URL; empty = sqlite file mlruns/optuna.db at the repository root
    sampler: str = field(default="grid", metadata=_choice("grid", "tpe"))
    n_trials: int = field(default=0, metadata=_range(0))  # 0 = the whole grid
    pruning: bool = False
    trial_timeout_s: float = field(default=900.0, metadata=_range(1, TIMEOUT_MAX_S))
    # a trial whose autocast type this host only emulates (bf16 on a CPU without AVX-512-BF16/AMX) runs at most this
    # many optimizer steps, labelled "bounded" (emulated.py); 0 = no bound
    emulated_max_steps: int = field(default=0, metadata=_range(0))
    # strategy -> a mapping (one product of lists) or a list of mappings (a union of products, for paired
    # settings such as d2l's "k=1 at B=256, k=2 at B=512"); strategies not listed use `default`
    spaces: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TrackingConfig:
    uri: str = ""  # empty = sqlite:///<repo>/mlruns/mlflow.db
    experiment: str = ""  # empty = "parallax-<profile>"


@dataclass(frozen=True)
class AnalyzeConfig:
    target_acc: float = field(default=0.8, metadata=_range(0, 1))


@dataclass(frozen=True)
class OverlapConfig:
    size: int = field(default=512, metadata=_range(16))  # square matrices
    chain: int = field(default=20, metadata=_range(1))  # products per chain
    items: int = field(default=20, metadata=_range(1))  # results computed and communicated
    reps: int = field(default=7, metadata=_range(1))
    warmup: int = field(default=2, metadata=_range(0))


@dataclass(frozen=True)
class Config:
    profile: str = field(default="cpu", metadata={"pattern": PROFILE_NAME})  # "" = no profile
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    sweep: SweepConfig = SweepConfig()
    tracking: TrackingConfig = TrackingConfig()
    analyze: AnalyzeConfig = AnalyzeConfig()
    overlap: OverlapConfig = OverlapConfig()

    def space(self, strategy: str) -> tuple[SpaceConfig, ...]:
        """The strategy's search space: a union of products (one SpaceConfig per product)."""
        spaces = self.sweep.spaces
        return spaces.get(strategy) or spaces.get("default") or (SpaceConfig(),)

    def to_dict(self) -> dict:
        return _plain(dataclasses.asdict(self))


# ----------------------------------------------------------------------------- building

def repo_root() -> Path:
    """The repository root: $DVC_ROOT under DVC (also `dvc exp run --temp`), else the nearest dir with dvc.yaml."""
    if os.environ.get("DVC_ROOT"):
        return Path(os.environ["DVC_ROOT"]).resolve()
    here = Path.cwd().resolve()
    for d in (here, *here.parents):
        if (d / "dvc.yaml").exists() or (d / "params.yaml").exists():
            return d
    return here


def _plain(x):
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def _err(key, msg):
    raise ConfigError(f"Invalid configuration value for `{key}`: {msg} Fix it in params.yaml, the profile "
                      f"file under experiments/, or with `--set {key}=...`.")


def _coerce(key: str, typ, value, meta: dict):
    origin = typing.get_origin(typ)
    if origin is tuple:
        (elem, _) = typing.get_args(typ)
        if not isinstance(value, (list, tuple)):
            value = [value]
        if not value:
            _err(key, "the list is empty; give at least one value (an empty search space runs nothing).")
        return tuple(_coerce(f"{key}[{i}]", elem, v, meta) for i, v in enumerate(value))
    if typ is bool:
        if isinstance(value, bool):
            return value
        _err(key, f"expected true or false, got {value!r}.")
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _err(key, f"expected an integer, got {value!r} ({type(value).__name__}).")
    elif typ is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _err(key, f"expected a number, got {value!r} ({type(value).__name__}).")
        value = float(value)
        if not math.isfinite(value):
            _err(key, f"expected a finite number, got {value!r}.")
    elif typ is str:
        if value is None:
            value = ""
        if not isinstance(value, str):
            _err(key, f"expected a string, got {value!r} ({type(value).__name__}).")
    if "pattern" in meta and value and not meta["pattern"].fullmatch(value):
        _err(key, f"{value!r} is not a name of the form {meta['pattern'].pattern}.")
    if "choices" in meta and value not in meta["choices"]:
        _err(key, f"{value!r} is not one of: {', '.join(map(str, meta['choices']))}.")
    lo, hi = meta.get("lo"), meta.get("hi")
    if lo is not None and (value < lo or (meta.get("lo_open") and value == lo)):
        _err(key, f"must be {'>' if meta.get('lo_open') else '>='} {lo}, got {value!r}.")
    if hi is not None and value > hi:
        _err(key, f"must be <= {hi}, got {value!r}.")
    return value


_SPACE_META = {"model": _choice(*MODELS), "devices": _range(1), "batch_size": _range(1),
               "lr": _range(0, lo_open=True), "bucket_cap_mb": _range(0, lo_open=True),
               "accum_steps": _range(1), "comm_hook": _choice(*COMM_HOOKS)}


def _build(cls, mapping, prefix: str):
    if mapping is None:
        mapping = {}
    if not isinstance(mapping, dict):
        _err(prefix, f"expected a mapping of keys, got {mapping!r}.")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(mapping) - set(fields))
    if unknown:
        where = f"section `{prefix}`" if prefix else "the top level"
        raise ConfigError(f"Unknown configuration key `{(prefix + '.') if prefix else ''}{unknown[0]}` in {where}. "
                          f"Valid keys there: {', '.join(fields)}. Check the spelling in params.yaml, the profile "
                          f"under experiments/, or your --set option.")
    kwargs = {}
    for name, value in mapping.items():
        key = f"{prefix}.{name}" if prefix else name
        typ = hints[name]
        if dataclasses.is_dataclass(typ):
            kwargs[name] = _build(typ, value, key)
        elif name == "spaces":
            if not isinstance(value, dict):
                _err(key, "expected a mapping strategy -> search space.")
            for s in value:
                if s not in STRATEGY_NAMES + ("default",):
                    _err(f"{key}.{s}", f"unknown strategy; valid: {', '.join(STRATEGY_NAMES)}, default.")
            kwargs[name] = {s: tuple(_build_space(part, f"{key}.{s}" + (f"[{i}]" if isinstance(v, list) else ""))
                                     for i, part in enumerate(v if isinstance(v, list) else [v]))
                            for s, v in value.items()}
        else:
            meta = dict(fields[name].metadata)
            if name == "strategies":
                meta = _choice(*STRATEGY_NAMES)
            kwargs[name] = _coerce(key, typ, value, meta)
    return cls(**kwargs)


def _build_space(mapping, prefix):
    space = _build(SpaceConfig, mapping, prefix)
    for name, meta in _SPACE_META.items():
        for i, v in enumerate(getattr(space, name)):
            _coerce(f"{prefix}.{name}[{i}]", type(v), v, meta)
    return space


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in (top or {}).items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML ({e}). Fix the file's syntax.") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}). Save it "
                          f"as UTF-8; YAML files are read as UTF-8 whatever the locale.") from None
    except OSError as e:
        raise ConfigError(f"Cannot read {path} ({e.strerror or e}). Check that it is a readable file.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of sections (data, train, sweep, ...), not {type(data).__name__}.")
    return data


_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def parse_set(items) -> dict:
    """['train.lr=0.1', 'data.source=synthetic'] -> nested dict; values parsed as YAML scalars/lists."""
    out: dict = {}
    for item in items or ():
        key, sep, raw = item.partition("=")
        if not sep or not key or any(not p.isidentifier() for p in key.split(".")):
            raise ConfigError(f"Malformed --set option {item!r}: expected KEY=VALUE with a dotted key, "
                              f"for example `--set train.lr=0.1` or `--set data.source=synthetic`.")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        if isinstance(value, str) and _FLOAT.fullmatch(value):  # YAML 1.1 reads 1e-3 as a string
            value = float(value)
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"Malformed --set option {item!r}: `{p}` is set both as a value and a section.")
        node[parts[-1]] = value
    return out


def load(params: str | Path | None = None, overrides=(), root: Path | None = None) -> Config:
    """Read params.yaml (and the profile it names) and apply `--set` overrides."""
    root = Path(root) if root else repo_root()
    path = Path(params) if params else root / "params.yaml"
    raw = _read_yaml(path) if path.exists() else {}
    sets = parse_set(overrides)
    profile = sets.get("profile", raw.get("profile", "cpu"))
    layers = []
    if profile:
        prof = _read_yaml(profile_path(profile, root))
        prof.pop("description", None)
        layers.append((prof, f"experiments/{profile}.yaml"))
    layers += [(raw, str(path)), (sets, "--set")]
    layered: dict = {}
    for layer, where in layers:  # each layer's sections must be mappings, whatever the later layers hold
        _check_shapes(Config, layer, "", where)
        layered = _merge(layered, layer)
    layered["profile"] = profile
    return _build(Config, layered, "")


def profile_path(profile, root: Path) -> Path:
    """experiments/<profile>.yaml for a profile name of the fixed alphabet that names an existing file."""
    known = sorted(p.stem for p in (root / "experiments").glob("*.yaml") if PROFILE_NAME.fullmatch(p.stem))
    fix = (f"Valid profiles: {', '.join(known) or '(none found)'}. Select one with `dvc exp run -S profile=NAME` "
           f"or `--set profile=NAME`.")
    if not isinstance(profile, str) or not PROFILE_NAME.fullmatch(profile):
        raise ConfigError(f"Invalid profile {profile!r}: a profile is the name of a file under experiments/, made of "
                          f"lower-case letters, digits, `_` and `-` (no path, no dots). {fix}")
    pfile = root / "experiments" / f"{profile}.yaml"
    if not pfile.is_file():
        raise ConfigError(f"Unknown profile `{profile}`: no file experiments/{profile}.yaml. {fix}")
    return pfile


def _check_shapes(cls, layer: dict, prefix: str, where: str) -> None:
    hints = typing.get_type_hints(cls)
    for name, value in layer.items():
        typ = hints.get(name)
        key = f"{prefix}.{name}" if prefix else name
        if typ is not None and dataclasses.is_dataclass(typ) and value is not None:
            if not isinstance(value, dict):
                raise ConfigError(f"Invalid configuration value for `{key}` in {where}: expected a mapping of keys "
                                  f"(a section), got {value!r}. Write it as `{key}: {{...}}` or leave it out; a "
                                  f"section of another shape is never dropped silently, with or without --set.")
            _check_shapes(typ, value, key, where)


def override(cfg: Config, items) -> Config:
    """A new Config with dotted overrides applied (validated like the file)."""
    return _build(Config, _merge(cfg.to_dict(), parse_set(items)), "")


def replace_train(cfg: Config, **changes) -> Config:
    """A new Config whose train section has `changes` (validated)."""
    return _build(Config, _merge(cfg.to_dict(), {"train": changes}), "")


def describe_profiles(root: Path | None = None) -> list[tuple[str, str]]:
    root = Path(root) if root else repo_root()
    out = []
    for p in sorted((root / "experiments").glob("*.yaml")):
        if PROFILE_NAME.fullmatch(p.stem):
                out.append((p.stem, (_read_yaml(p).get("description") or "").strip()))
    return out

