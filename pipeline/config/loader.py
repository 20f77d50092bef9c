"""Configuration: params.yaml -> frozen dataclasses (schema.py), the only YAML reader in the package.

Layers, later wins: dataclass defaults < experiments/<profile>.yaml < params.yaml < --set a.b=v.
Unknown keys and invalid values raise ConfigError (one paragraph naming the key and the valid values)
before any work starts; a search space may set only the sweep knobs its strategy accepts (pipeline/catalog.py).
A layer's space given as a mapping of axes applies to each group of the space the layers below resolve for its
strategy (`_each_group`); a list of groups replaces the whole space.
A null, in params.yaml or --set, is no value: the layer below's.
--set takes Hydra's override grammar as `dvc exp run -S` does (`+key=` adds, `++key=` adds or changes, `~key` removes
params.yaml's value: the profile's applies), with YAML values, which take a URL's `?a=1` unquoted where Hydra's parser
needs quotes; hydra-core (installed with DVC) is no dependency of the core install, and its composition has no
layer below params.yaml for `~` to fall back to (apply_sets).

A `train.<key>` the user sets (params.yaml, --set, `dvc exp run -S`) that is a sweep dimension (SpaceConfig's
fields) pins that dimension: every space of the resolved Config holds that one value (`pin`), so a sweep's points
(sweep/space.py) are what the user set. A profile's own train values do not pin (a profile states its points in its
spaces), nor do a command's typed options; `train` and `doctor` run no sweep and load without pins. A sweep
refuses a knob set in train that a selected strategy's catalog row does not take, a setting that applies only with
a knob or a row's design (catalog.APPLIES_WITH) where no point runs with it, a one-device strategy without a point at
devices=1 (`sweep_refusal`), and train.strategy,
which a sweep stage takes from its name (`strategy_refusal`); a trial, one strategy, checks its own (knob_refusal,
unapplied_refusal: trial/launch.py).
A Config is never mutated: `override` returns a new one.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from pathlib import Path

import yaml

from pipeline import catalog, zoo
from pipeline.config import safe_yaml
from pipeline.config.schema import (
    COMM_HOOKS,
    MODELS,
    PROFILE_NAME,
    SEED_MAX,
    SOURCES,
    SPACE_KEYS,
    SPACE_META,
    STRATEGY_NAMES,
    TIMEOUT_MAX_S,
    TRIALS_MAX,
    TRIALS_WHY,
    AnalyzeConfig,
    CollectivesConfig,
    Config,
    DataConfig,
    OverlapConfig,
    SpaceConfig,
    SweepConfig,
    TrackingConfig,
    TrainConfig,
    choice,
)
from pipeline.paths import repo_root, too_long

__all__ = [
    "COMM_HOOKS",
    "MODELS",
    "PROFILE_NAME",
    "SEED_MAX",
    "SOURCES",
    "SPACE_KEYS",
    "STRATEGY_NAMES",
    "TIMEOUT_MAX_S",
    "AnalyzeConfig",
    "CollectivesConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "OverlapConfig",
    "SpaceConfig",
    "SweepConfig",
    "TrackingConfig",
    "TrainConfig",
    "apply_sets",
    "check_sweep",
    "describe_profiles",
    "load",
    "override",
    "parse_set",
    "profile_path",
    "replace_train",
    "sweep_refusal",
]


class ConfigError(ValueError):
    """A user-facing configuration error; the message says what is wrong and how to fix it."""


# ----------------------------------------------------------------------------- building


class InvalidValue(ConfigError):
    """An invalid value of `key`, `msg` saying why; worded for the files and --set, which `load` rewords for a value
    a command's option gave (`_flag_error`)."""

    def __init__(self, key: str, msg: str):
        self.key, self.msg = key, msg
        super().__init__(
            f"Invalid configuration value for `{key}`: {msg} Fix it in params.yaml, the profile "
            f"file under experiments/, or with `--set {key}=...`."
        )


def _err(key, msg):
    raise InvalidValue(key, msg)


def _flag_error(e: InvalidValue, flags: dict) -> ConfigError:
    """`e` in the words of the command's option that gave the value (flags {"train": {"batch_size": 0}}: --batch-size
    0), where one did: the last layer, so the value is the option's, not params.yaml's; `e` itself otherwise."""
    section, _, name = e.key.partition(".")
    given = (flags.get(section) or {}) if isinstance(flags.get(section), dict) else {}
    if not name or name not in given:
        return e
    flag = f"--{name.replace('_', '-')}"
    return ConfigError(f"{flag} {given[name]}: {e.msg} Give {flag} a valid value (it sets `{e.key}`). Nothing was run.")


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
            hint = ""
            if isinstance(value, str) and _YAML_EXPONENT.fullmatch(value.strip()):  # PyYAML reads YAML 1.1: 1e6 is text
                x = float(value)
                hint = f" YAML reads an exponent as a number only with a dot and a sign: write {x:.1e} or {x!r}."
            _err(key, f"expected a number, got {value!r} ({type(value).__name__}).{hint}")
        value = float(value)
        if not math.isfinite(value):
            _err(key, f"expected a finite number, got {value!r}.")
    elif typ is str:
        if value is None:
            value = ""
        if not isinstance(value, str):
            _err(key, f"expected a string, got {value!r} ({type(value).__name__}).")
        if _CONTROL.search(value):
            _err(
                key,
                f"{value!r} holds a control character (a newline, a tab, a NUL byte): a name, path or URL that "
                f"shows as something else than it is. Write it on one line, without them.",
            )
        if value != value.strip():
            _err(
                key,
                f"{value!r} is blank or has spaces around it: it would name something other than what "
                f"shows (an MLflow experiment, a folder). Remove the spaces, or leave it empty for the default.",
            )
    if meta.get("max_len") and len(value) > meta["max_len"]:
        _err(key, f"{_short(value)!r} has {len(value)} characters, at most {meta['max_len']} fit ({meta['why']}).")
    if meta.get("path") and (why := too_long(value)):
        _err(key, f"the path {_short(value)!r} {why}. Choose a shorter path.")
    if "pattern" in meta and value and not meta["pattern"].fullmatch(value):
        _err(key, f"{value!r} is not {meta.get('form') or 'a name of the form ' + meta['pattern'].pattern}.")
    if meta.get("model") and (why := zoo.refusal(value, key.partition("[")[0])):
        _err(key, why)
    if "choices" in meta and value not in meta["choices"]:
        _err(key, f"{value!r} is not one of: {', '.join(map(str, meta['choices']))}.")
    lo, hi = meta.get("lo"), meta.get("hi")
    if lo is not None and (value < lo or (meta.get("lo_open") and value == lo)):
        _err(key, f"must be {'>' if meta.get('lo_open') else '>='} {lo}, got {value!r}.")
    if hi is not None and value > hi:
        _err(key, f"must be <= {hi}, got {value!r}" + (f" ({meta['why']})." if meta.get("why") else "."))
    return value


def _short(text: str, keep: int = 60) -> str:
    """`text` with its middle elided when longer than 2 * keep characters: a message names a long value, not all."""
    return text if len(text) <= 2 * keep else f"{text[:keep]}...{text[-keep:]}"


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
        raise ConfigError(
            f"Unknown configuration key `{(prefix + '.') if prefix else ''}{unknown[0]}` in {where}. "
            f"Valid keys there: {', '.join(fields)}. Check the spelling in params.yaml, the profile "
            f"under experiments/, or your --set option."
        )
    kwargs = {}
    for name, value in mapping.items():
        key = f"{prefix}.{name}" if prefix else name
        typ = hints[name]
        if dataclasses.is_dataclass(typ):
            kwargs[name] = _build(typ, value, key)
        elif name == "spaces":
            kwargs[name] = _build_spaces(value, key)
        elif value in ([], ()) and fields[name].default == ():
            kwargs[name] = ()  # a dimension left unswept (SpaceConfig.optimizer), as to_dict writes it back
        else:
            meta = dict(fields[name].metadata)
            if name == "strategies":
                meta = choice(*STRATEGY_NAMES)
            kwargs[name] = _coerce(key, typ, value, meta)
            if name == "strategies" and (twice := [v for i, v in enumerate(kwargs[name]) if v in kwargs[name][:i]]):
                _err(key, f"it lists `{twice[0]}` more than once; each strategy runs one study, so list it once.")
    if cls is SweepConfig and (sizes := {s: _points(v) for s, v in kwargs.get("spaces", {}).items()}):
        (s, n), repeats = max(sizes.items(), key=lambda kv: kv[1]), kwargs.get("repeats", SweepConfig.repeats)
        if n * repeats > TRIALS_MAX:
            _err(
                f"{prefix}.repeats",
                f"{repeats} repeats of the {n} points of `{prefix}.spaces.{s}` make "
                f"{n * repeats} trials, at most {TRIALS_MAX} ({TRIALS_WHY}).",
            )
    return cls(**kwargs)


def _build_spaces(value, key: str) -> dict:
    """sweep.spaces: strategy (or `default`) -> a union of products; a strategy's own space may vary only the sweep
    knobs that strategy accepts (pipeline/catalog.py); `default` may hold any, each strategy using its own."""
    if not isinstance(value, dict):
        _err(key, "expected a mapping strategy -> search space.")
    for s in value:
        if s not in STRATEGY_NAMES + ("default",):
            _err(f"{key}.{s}", f"unknown strategy; valid: {', '.join(STRATEGY_NAMES)}, default.")
    out = {}
    for s, v in value.items():
        parts = v if isinstance(v, list) else [v]
        if not parts:  # else the strategy would silently run the `default` space
            _err(
                f"{key}.{s}",
                "the list is empty; give at least one mapping of lists (an empty search space runs "
                "nothing), or remove the key for the `default` space.",
            )
        out[s] = tuple(
            _build_space(part, f"{key}.{s}" + (f"[{i}]" if isinstance(v, list) else ""), s)
            for i, part in enumerate(parts)
        )
        if (size := _points(out[s])) > TRIALS_MAX:
            _err(
                f"{key}.{s}",
                f"its lists make {size} points (the product of their lengths), at most {TRIALS_MAX} ({TRIALS_WHY}).",
            )
    return out


def _points(space: tuple[SpaceConfig, ...]) -> int:
    """How many points a space holds at most (before duplicates are dropped): its lists' lengths multiplied, added
    over its products (a dimension not swept, an empty list, is one value). Counted, not listed: a product of a few
    long lists is too many points to list."""
    return sum(math.prod(max(len(getattr(p, f.name)), 1) for f in dataclasses.fields(p)) for p in space)


def _build_space(mapping, prefix, strategy: str = "default"):
    space = _build(SpaceConfig, mapping, prefix)
    for name, meta in SPACE_META.items():
        for i, v in enumerate(getattr(space, name)):
            _coerce(f"{prefix}.{name}[{i}]", type(v), v, meta)
    if strategy != "default":
        accepted = catalog.knobs(strategy)
        for knob in catalog.KNOBS:
            if knob not in accepted and getattr(space, knob) != getattr(SpaceConfig, knob):
                takers = [n for n in catalog.NAMES if knob in catalog.knobs(n)]
                why = catalog.why_not(strategy, knob)
                _err(
                    f"{prefix}.{knob}",
                    f"`{strategy}` has no `{knob}` knob ({f'{why}; ' if why else ''}it accepts "
                    f"{', '.join(accepted) or 'no sweep knobs'}); `{knob}` applies to {', '.join(takers)}. Remove it "
                    f"from this space.",
                )
    return space


def knob_refusal(t: TrainConfig) -> str:
    """Why train config `t` cannot run: a knob set away from its default for a strategy whose catalog row does not
    take it, with the design's reason where the row gives one (a silent no-op would record a mode that never ran);
    "" when every knob set applies."""
    defaults = TrainConfig()
    for knob in catalog.KNOBS:
        if knob not in catalog.knobs(t.strategy) and getattr(t, knob) != getattr(defaults, knob):
            takers = ", ".join(n for n in catalog.NAMES if knob in catalog.knobs(n))
            why = catalog.why_not(t.strategy, knob)
            return (
                f"`{t.strategy}` has no `{knob}` knob{f' ({why})' if why else ''}; train.{knob}={getattr(t, knob)} "
                f"applies to {takers}. Leave it at {getattr(defaults, knob)} for `{t.strategy}`."
            )
    return ""


def unapplied(t: TrainConfig) -> dict:
    """The catalog.APPLIES_WITH settings train config `t` sets away from their defaults that its run does not run with
    (its knob is off, or its strategy's row lacks the design: ddp's amp_dtype), each with its default: what a trial
    would record and never run (`unapplied_refusal`), and what doctor's rows reset to their defaults."""
    defaults = TrainConfig()
    point = {n: getattr(t, n) for n in catalog.knobs(t.strategy)}
    return {
        k: getattr(defaults, k)
        for k in catalog.APPLIES_WITH
        if getattr(t, k) != getattr(defaults, k) and not catalog.applies(k, t.strategy, point)
    }


def unapplied_refusal(t: TrainConfig) -> str:
    """Why train config `t` cannot run: a setting of catalog.APPLIES_WITH away from its default that its run does not
    run with (`unapplied`), in the words the sweep and doctor use (catalog.applies_with), with the forms that use it;
    "" when every such setting applies."""
    for k, default in unapplied(t).items():
        need, value = catalog.APPLIES_WITH[k][1], _yaml(getattr(t, k))
        rows = catalog.designed_with(k)
        fixes = [f"turn `{need}` on (`--set train.{need}=true`)"] if need in catalog.knobs(t.strategy) else []
        fixes += [f"run {' or '.join(rows)} (`--strategy {rows[0]}`)"] if rows else []
        return (
            f"`train.{k}={value}` does not reach this `{t.strategy}` run: {catalog.applies_with(k, value)}, so the "
            f"run would record it and never run it. To use it, {', or '.join(fixes)}; else leave `{k}` at its "
            f"default, {_yaml(default)}. Nothing was run."
        )
    return ""


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in (top or {}).items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read_yaml(path: Path) -> dict:
    try:
        data = safe_yaml.load(safe_yaml.read_text(path), str(path)) or {}
    except safe_yaml.Refused as e:
        raise ConfigError(str(e)) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML ({e}). Fix the file's syntax.") from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}). Save it "
            f"as UTF-8; YAML files are read as UTF-8 whatever the locale."
        ) from None
    except OSError as e:
        raise ConfigError(f"Cannot read {path} ({e.strerror or e}). Check that it is a readable file.") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} must hold a mapping of sections (data, train, sweep, ...), not {type(data).__name__}."
        )
    return data


_YAML_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def parse_set(items) -> dict:
    """['train.lr=0.1', 'data.source=synthetic'] -> the --set layer as a nested dict, read as `apply_sets` reads
    them over no params file."""
    return apply_sets({}, items)[1]


def apply_sets(file: dict, items, where: str = "params.yaml", user: bool = True) -> tuple[dict, dict]:
    """The --set options in Hydra's override grammar (what `dvc exp run -S` takes), over `file`, the user's params file
    as read (`where` names it): returns (`file` less what `~` removes, the --set layer as a nested dict). In order:
      key=value, ++key=value  set key (any key of the schema, one params.yaml lacks too);
      +key=value              adds key: refused where the params file or an earlier --set already gives it a value
                              (a null is none), unless the value is a list or a mapping, as Hydra and `-S` refuse it;
      ~key, ~key=value        removes the value the params file and the earlier --set options give key (with a value:
                              only where it is that one), so the layer below applies: the profile's, else the built-in
                              default; a key they leave unset stays as it is.
    Values are YAML scalars, lists or mappings (1e-3 a number). A comma list `key=a,b`, Hydra's multirun sweep, is
    refused with the `sweep.spaces` form (`user`: the options a person typed; the package's own values are taken as
    they are). A key set as a value and then used as a section is blamed on the option that set the value, the one the
    user typed."""
    file = _copy(file)
    out: dict = {}
    by: dict = {}  # dotted key -> the option that last set it as a value
    for item in items or ():
        prefix, key, sep, raw = _split(item)
        value = _value(item, key, raw, user) if sep else None
        held, source = _held(file, out, key, where)
        if prefix == "~":
            _check_key(key, item)
            if sep and held != value:
                raise ConfigError(
                    f"Cannot remove `{key}` with --set {item!r}: "
                    + (
                        f"{source} gives it {_yaml(held)}, not {_yaml(value)}"
                        if held is not None
                        else f"neither {where} nor an earlier --set gives it a value"
                    )
                    + f". Write `~{key}` to remove whatever value it has, or give the value it holds."
                )
            _remove(file, key)
            _remove(out, key)
            continue
        if prefix == "+" and held is not None and not isinstance(value, (list, dict)):
            raise ConfigError(
                f"Cannot add `{key}` with --set {item!r}: an item is already at `{key}` ({_yaml(held)}, from "
                f"{source}), and `+` adds only a key that has no value. Write `{item[1:]}` to "
                f"change it, or `+{item}` to add or change it (Hydra's and `dvc exp run -S`'s grammar)."
            )
        _put(out, by, key, value, item)
    return file, out


_PREFIXES = ("++", "+", "~")  # Hydra's override grammar: add or override, add, delete


def _split(item: str) -> tuple[str, str, str, str]:
    """(prefix, key, "=" or "", value text) of one --set option, or a ConfigError naming the forms it takes."""
    prefix = next((p for p in _PREFIXES if item.startswith(p)), "")
    key, sep, raw = item[len(prefix) :].partition("=")
    if (not sep and prefix != "~") or not key or any(not p.isidentifier() for p in key.split(".")):
        raise ConfigError(
            f"Malformed --set option {item!r}: expected KEY=VALUE with a dotted key, for example `--set "
            f"train.lr=0.1` or `--set data.source=synthetic`; Hydra's prefixes as `dvc exp run -S` takes them: "
            f"`+KEY=VALUE` adds a key params.yaml leaves unset, `++KEY=VALUE` adds or changes one, `~KEY` removes "
            f"params.yaml's value (the profile's applies)."
        )
    return prefix, key, sep, raw


def _check_key(key: str, item: str) -> None:
    """Refuse a dotted key the schema lacks (a typo after `~` would otherwise remove nothing, silently)."""
    cls = Config
    for i, p in enumerate(key.split(".")):
        fields = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
        if p not in fields:
            where = ".".join(key.split(".")[:i])
            raise ConfigError(
                f"Unknown configuration key `{key}` in --set {item!r}. Valid keys "
                f"{f'in `{where}`' if where else 'at the top level'}: {', '.join(fields) or '(none: a value)'}. "
                f"Check the spelling."
            )
        if p == "spaces":  # strategy -> space, checked when the config is built
            return
        cls = typing.get_type_hints(cls)[p]


def _value(item: str, key: str, raw: str, user: bool):
    """The value text of `item` as YAML reads it; an unquoted comma list is Hydra's sweep form, refused for `user`."""
    try:
        value = safe_yaml.load(raw, f"The --set option {item!r}") if raw != "" else ""
    except safe_yaml.Refused as e:
        raise ConfigError(str(e)) from None
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str) and _FLOAT.fullmatch(value):  # YAML 1.1 reads 1e-3 as a string
        value = float(value)
    if user and isinstance(value, str) and "," in value and raw.lstrip()[:1] not in ("'", '"'):
        raise ConfigError(_sweep_form(item, key, raw))
    return value


def _sweep_form(item: str, key: str, raw: str) -> str:
    """Why `key=a,b` is refused, and the forms that say what the user means."""
    values = f"[{raw}]"
    *section, name = key.split(".")
    if section == ["train"] and name in SPACE_KEYS:
        form = f"sweep.spaces.default.{name}={values}"
        fix = (
            f"To sweep it, give the search space its values: `--set '{form}'` (`dvc exp run -S '++{form}'`), "
            f"leaving `train.{name}` unset (a train value pins every space to that one value); for one value, give one."
        )
    elif section[:2] == ["sweep", "spaces"]:
        fix = f"A space's values are a list: `--set '{key}={values}'`."
    else:
        fix = (
            f"For a list, write `--set '{key}={values}'`; a sweep's axes are set in `sweep.spaces`, e.g. "
            f"`--set 'sweep.spaces.default.lr=[0.1,0.3]'`."
        )
    return (
        f"The --set option {item!r} is a comma list, Hydra's multirun form (a run per value), which Parallax does not "
        f"run: a sweep's values are the lists of `sweep.spaces`. {fix} For one text that holds a comma, quote it: "
        f"`--set \"{key}='{raw}'\"`. Nothing was run."
    )


def _put(out: dict, by: dict, key: str, value, item: str) -> None:
    node = out
    parts = key.split(".")
    for i, p in enumerate(parts[:-1]):
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            section = ".".join(parts[: i + 1])
            raise ConfigError(
                f"Malformed --set option {by.get(section, item)!r}: it sets `{section}` to a "
                f"value, but this command also sets `{key}` inside it (with another --set), "
                f"and `{section}` cannot be both a value and a section. "
                f"Keep one of the two; a section's keys are set one by one, e.g. "
                f"`--set train.lr=0.1`."
            )
    node[parts[-1]] = value
    by[key] = item


def _held(file: dict, sets: dict, key: str, where: str) -> tuple:
    """(value, where it is from) that the --set options so far, else the params file, give dotted `key`; (None, "")
    for none, or a null."""
    for layer, source in ((sets, "an earlier --set"), (file, where)):
        node: typing.Any = layer
        for p in key.split("."):
            node = node.get(p) if isinstance(node, dict) else None
        if node is not None:
            return node, source
    return None, ""


def _remove(layer: dict, key: str) -> None:
    *section, name = key.split(".")
    node: typing.Any = layer
    for p in section:
        node = node.get(p) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(name, None)


def _copy(layer: dict) -> dict:
    return {k: _copy(v) if isinstance(v, dict) else v for k, v in layer.items()}


def load(
    params: str | Path | None = None,
    overrides=(),
    root: Path | None = None,
    flags: dict | None = None,
    sweeps: bool = True,
    stage: bool = False,
    notes: list | None = None,
) -> Config:
    """Read params.yaml (and the profile it names) and apply `--set` overrides, then `flags` (a command's typed
    options as sections, {"train": {"strategy": "ddp"}}), validated once with the rest, with the user's train settings
    pinned in the spaces (`pin`; `sweeps=False`: a command that runs no sweep, whose spaces nothing reads). Without
    `params`, the repository's params.yaml is optional (none: the profile's and built-in values); a `params` file
    named explicitly (--params) must exist, or a typo would run silently on other values than the user chose.
    `stage`: a sweep stage's command, whose trials run the stage's strategy: a train.strategy a user layer sets, its
    default too, is refused (strategy_refusal). `notes`, where given, gets a line for each space whose groups a later
    layer's axes change one by one (`_each_group`)."""
    root = Path(root) if root else repo_root()
    path = Path(params) if params else root / "params.yaml"
    if params and not path.exists() and path.is_symlink():
        raise ConfigError(
            f"The params file {path} (--params) is a symbolic link that leads nowhere (to "
            f"{path.readlink()}, which is missing or loops back). Point --params at the file itself. "
            f"Nothing was run."
        )
    if params and not path.exists():
        raise ConfigError(
            f"The params file {path} (--params) does not exist. Check the path, or leave --params out "
            f"to read params.yaml at the repository root. Nothing was run."
        )
    raw, sets = apply_sets(_read_yaml(path) if path.exists() else {}, overrides, path.name)
    sets = _sections_unset(sets)
    profile = sets.get("profile", raw.get("profile", "cpu"))
    layers = []
    if profile:
        prof = _read_yaml(profile_path(profile, root))
        prof.pop("description", None)
        layers.append((prof, f"experiments/{profile}.yaml"))
    users = [(_drop_unset(raw), str(path)), (sets, "--set")]  # what pins the sweep (a command's options do not)
    layers += [*users, (flags or {}, "the command's options")]
    layered: dict = {}
    origins: dict = {}  # strategy (or `default`) -> the layer its space comes from
    for layer, where in layers:  # each layer's sections must be mappings, whatever the later layers hold
        _check_shapes(Config, layer, "", where)
        layered = _merge(layered, _each_group(layered, layer, where, origins, notes))
    layered["profile"] = profile
    try:
        cfg = _build(Config, layered, "")
    except InvalidValue as e:
        raise _flag_error(e, flags or {}) from None
    if stage and any((layer.get("train") or {}).get("strategy") is not None for layer, _ in users):  # default too
        raise ConfigError(strategy_refusal(cfg.train.strategy))
    return pin(cfg, users) if sweeps else cfg


def _each_group(below: dict, layer: dict, where: str, origins: dict, notes: list | None = None) -> dict:
    """`layer` with each space it gives as a mapping of axes (`sweep.spaces.S.lr: [0.1]`, as `--set` and `dvc exp run
    -S` write one axis) applied to each group of the space the layers `below` resolve for S (Config.space: S's own,
    else `default`'s, less the knobs S does not take): every product keeps its other axes. A list of groups is the
    whole space and replaces it. `origins` tracks which layer gave each space; `notes` gets a line for each space
    whose groups the axes change."""
    spaces = (layer.get("sweep") or {}).get("spaces") if isinstance(layer.get("sweep"), dict) else None
    if not isinstance(spaces, dict):
        return layer
    lower = (below.get("sweep") or {}).get("spaces") or {}
    lower = lower if isinstance(lower, dict) else {}
    out = dict(spaces)
    for s, axes in spaces.items():
        if not isinstance(axes, dict):
            origins[s] = where
            continue
        base, of = lower.get(s), s
        if base is None and s != "default" and lower.get("default") is not None:
            base, of = _own_knobs(lower["default"], s), "default"
        if isinstance(base, list) and all(isinstance(g, dict) for g in base):
            out[s] = [_merge(g, axes) for g in base]
        elif isinstance(base, dict):
            out[s] = _merge(base, axes)
        if notes is not None and base is not None and (isinstance(base, list) or of != s) and out[s] != base:
            keys = ", ".join(f"`sweep.spaces.{s}.{k}`" for k in axes)
            inherited = f", which `{s}` runs without a space of its own" if of != s else ""
            groups = len(base) if isinstance(base, list) else 1
            notes.append(
                f"{keys} ({where}) applies to each of the {groups} group(s) of the `{of}` space "
                f"({origins.get(of, 'the profile')}){inherited}; each keeps its other axes. To replace the whole "
                f"space, give it as a list of groups: `--set 'sweep.spaces.{s}=[{{...}}, ...]'`."
            )
        origins.setdefault(s, origins.get(of, where))
    return {**layer, "sweep": {**layer["sweep"], "spaces": out}}


def _own_knobs(space, strategy: str):
    """The `default` space (a mapping, or a list of them) as `strategy`'s own: the knobs it does not take left out
    (points() reads none of them for it; its own space may not hold them)."""
    if isinstance(space, list):
        return [_own_knobs(g, strategy) for g in space]
    if not isinstance(space, dict):
        return space
    return {k: v for k, v in space.items() if k not in catalog.KNOBS or k in catalog.knobs(strategy)}


def _drop_unset(layer: dict) -> dict:
    """params.yaml's `key: null` means "unset here: the profile's value" (a placeholder, so that `dvc exp run -S
    train.epochs=3` has a key to override; DVC refuses to add a key params.yaml lacks)."""
    return {k: _drop_unset(v) if isinstance(v, dict) else v for k, v in layer.items() if v is not None}


def _sections_unset(sets: dict) -> dict:
    """--set's nulls inside a section, as params.yaml's: `--set data.train_limit=null` is the key left out (params.yaml
    documents null). A top-level null keeps its meaning (`--set profile=null`: no profile)."""
    return {k: _drop_unset(v) if isinstance(v, dict) else v for k, v in sets.items()}


# ----------------------------------------------------------------------------- a train setting pins the sweep


def pin(cfg: Config, users) -> Config:
    """cfg with every `train.<key>` that a user layer sets (params.yaml, --set: `users`, as (layer, where)) and that
    is a sweep dimension pinned in every space: each product's list for it is that one value
    (a knob only in the spaces whose strategy takes it, and in `default`, where each strategy keeps its own knobs).
    A user layer that also lists the dimension in a space (`sweep.spaces.S.KEY`) must list that one value there, or
    the two are refused together: neither silently wins."""
    pinned = [k for k in SPACE_KEYS if any(k in (layer.get("train") or {}) for layer, _ in users)]
    if not pinned:
        return cfg
    values = {k: getattr(cfg.train, k) for k in pinned}
    for s, k, where in _space_keys(users):
        lists = [getattr(p, k) for p in cfg.sweep.spaces.get(s, ())]
        if k in values and any(vs not in ((), (values[k],)) for vs in lists):
            swept = ", ".join(sorted({_yaml(v) for vs in lists for v in vs}))
            raise ConfigError(
                f"`train.{k}={_yaml(values[k])}` pins the sweep's `{k}` to that one value in every space, and "
                f"`sweep.spaces.{s}.{k}` ({where}) sweeps [{swept}]: the two disagree. Keep one: leave `train.{k}` "
                f"unset to sweep the space's values, or remove `sweep.spaces.{s}.{k}` (or make it "
                f"[{_yaml(values[k])}]). Nothing was run."
            )
    spaces = dict(cfg.sweep.spaces)
    spaces.setdefault("default", (SpaceConfig(),))  # the strategies without a space of their own
    out = {
        s: tuple(
            dataclasses.replace(p, **{k: (v,) for k, v in values.items() if _has_dimension(s, k)}) for p in products
        )
        for s, products in spaces.items()
    }
    return dataclasses.replace(cfg, sweep=dataclasses.replace(cfg.sweep, spaces=out))


def _has_dimension(space: str, key: str) -> bool:
    """Whether the space named `space` (a strategy, or `default`) holds dimension `key` (loader's _build_space)."""
    return space == "default" or key not in catalog.KNOBS or key in catalog.knobs(space)


def _space_keys(users):
    """(strategy, key, where) for each dimension a user layer lists in a space of sweep.spaces."""
    for layer, where in users:
        spaces = (layer.get("sweep") or {}).get("spaces") or {}
        for s, v in spaces.items() if isinstance(spaces, dict) else ():
            for part in v if isinstance(v, list) else [v]:
                yield from ((s, k, where) for k in (part if isinstance(part, dict) else ()))


def strategy_refusal(value) -> str:
    """Why a sweep refuses train.strategy set to `value`: each sweep stage's trials run the stage's own strategy."""
    return (
        f"`train.strategy={value}` is set for a sweep, whose trials never take it: each sweep stage runs its own "
        f"strategy (`sweep@<strategy>` in dvc.yaml, `python -m pipeline sweep --strategy <strategy>`), and "
        f"`sweep.strategies` selects the stages that run trials. Leave `train.strategy` unset and choose the "
        f"strategies with `sweep.strategies`, e.g. `--set 'sweep.strategies=[{value}]'` (`dvc exp run -S "
        f"'sweep.strategies=[{value}]'`); `train.strategy` is the strategy of one run, `python -m pipeline train`. "
        f"Nothing was run."
    )


def sweep_refusal(cfg: Config) -> str:
    """Why cfg cannot be swept: train.strategy away from its default (each stage runs its own strategy: a user who
    sets it at all is refused at load, `load`); a knob the train section sets away from its default (a pin, or a
    profile's value) that a selected strategy's catalog row does not take, so that strategy's trials could never
    receive it; a setting that applies only with a knob or a row's design (catalog.APPLIES_WITH) away from its
    default where no point of the selected strategies runs with it (`_unapplied`); a selected one-device strategy
    (single) whose points all set more devices (`_one_device`: configured, not this host's limit). The message names
    the key, the strategies and the forms that work; "" when every setting reaches a trial."""
    defaults = TrainConfig()
    if cfg.train.strategy != defaults.strategy:
        return strategy_refusal(cfg.train.strategy)
    for k in catalog.KNOBS:
        if (v := getattr(cfg.train, k)) == getattr(defaults, k):
            continue  # a strategy without the knob runs its default already
        lacking = [s for s in cfg.sweep.strategies if k not in catalog.knobs(s)]
        if not lacking:
            continue
        takers = [s for s in cfg.sweep.strategies if k in catalog.knobs(s)]
        why = catalog.why_not(lacking[0], k)
        if takers:
            form = f"sweep.spaces.{takers[0]}.{k}"
            instead = (
                f"To set it for the strategies that take it only, leave `train.{k}` unset and give it to their "
                f"spaces, e.g. `{form}: [{_yaml(v)}]` (`--set '{form}=[{_yaml(v)}]'`, `dvc exp run -S "
                f"'+{form}=[{_yaml(v)}]'`); or select only those: `sweep.strategies=[{', '.join(takers)}]`."
            )
        else:
            every = [n for n in catalog.NAMES if k in catalog.knobs(n)]
            instead = f"Select a strategy that takes it ({', '.join(every)}) in sweep.strategies, or leave it unset."
        return (
            f"`train.{k}={_yaml(v)}` is set for every selected strategy's trials, but "
            f"{', '.join(f'`{s}`' for s in lacking)} {'has' if len(lacking) == 1 else 'have'} no `{k}` knob"
            f"{f' ({lacking[0]}: {why})' if why else ''}: {'its' if len(lacking) == 1 else 'their'} trials would "
            f"never run with it. {instead} "
            f"Nothing was run."
        )
    return _one_device(cfg) or _unapplied(cfg)


def _one_device(cfg: Config) -> str:
    """Why a selected strategy that runs on one device only (catalog: one_device_only) has no point at devices=1: a
    configured conflict, not this host's limit, so none of its points would run on any host."""
    for s in cfg.sweep.strategies:
        if not catalog.is_one_device_only(s):
            continue
        counts = sorted({k for product in cfg.space(s) for k in _dimension(cfg, s, product, "devices")})
        if 1 in counts:
            continue
        parallel = [n for n in cfg.sweep.strategies if not catalog.is_one_device_only(n)]
        others = f"sweep.strategies=[{', '.join(parallel)}]" if parallel else "a parallel strategy in sweep.strategies"
        if counts == [cfg.train.devices]:  # train.devices pins every space (pin)
            taker = parallel[0] if parallel else next(n for n in catalog.NAMES if not catalog.is_one_device_only(n))
            form = f"sweep.spaces.{taker}.devices=[{cfg.train.devices}]"
            return (
                f"`train.devices={cfg.train.devices}` is set for every selected strategy's trials, but `{s}` runs on "
                f"exactly one device: none of its points would run, on any host. To run the parallel strategies at "
                f"{cfg.train.devices} devices, leave `train.devices` unset and give it to their spaces, e.g. "
                f"`--set '{form}'` (`dvc exp run -S '+{form}'`); or select only those: `{others}`. Nothing was run."
            )
        name = s if s in cfg.sweep.spaces else "default"
        return (
            f"`sweep.spaces.{name}.devices` gives `{s}` only {', '.join(map(str, counts))} device(s), but `{s}` runs "
            f"on exactly one device: none of its points would run, on any host. Give its space devices [1] "
            f"(`--set 'sweep.spaces.{s}.devices=[1]'`), or leave `{s}` out of sweep.strategies (`{others}`). "
            f"Nothing was run."
        )
    return ""


def _unapplied(cfg: Config) -> str:
    """Why a setting of catalog.APPLIES_WITH set away from its default (in train, or in a space's list) reaches no
    trial of the selected strategies: no point holds both a value of it other than the default and what it applies
    with on (its knob, or the row's flag). A space that varies the knob over [false, true] has points that run it."""
    defaults = TrainConfig()
    for k, (_, need) in catalog.APPLIES_WITH.items():
        default, away, used = getattr(defaults, k), [], False
        for s in cfg.sweep.strategies:
            for product in cfg.space(s):
                here = [v for v in _dimension(cfg, s, product, k) if v != default]
                on = _dimension(cfg, s, product, need) if need in catalog.KNOBS else (False,)
                away += here
                used = used or bool(here and any(catalog.applies(k, s, {need: v}) for v in on))
        if not away or used:
            continue
        in_train = getattr(cfg.train, k) != default
        value = getattr(cfg.train, k) if in_train else away[0]
        rows = catalog.designed_with(k)
        takers = [s for s in cfg.sweep.strategies if need in catalog.knobs(s)]
        form = f"sweep.spaces.{takers[0]}.{need}=[false, true]" if takers else ""
        fixes = [f"turn `{need}` on in some of their points (`--set train.{need}=true`, or `--set '{form}'`)"]
        fixes = fixes if takers else []
        fixes += [f"select {' or '.join(rows)} in `sweep.strategies`"] if rows else []
        return (
            f"`{'train.' if in_train else 'sweep.spaces.*.'}{k}={_yaml(value)}` is set for the sweep, but no point of "
            f"the selected strategies ({', '.join(cfg.sweep.strategies)}) runs with it: "
            f"{catalog.applies_with(k, _yaml(value))}, so their trials would record it and never run it. To use it, "
            f"{', or '.join(fixes)}; else leave `{k}` at its default, {_yaml(default)}. Nothing was run."
        )
    return ""


def _dimension(cfg: Config, strategy: str, product: SpaceConfig, key: str) -> tuple:
    """The values `key` takes in the points of `product` of `strategy`'s space, as sweep/space.points makes them: a
    dimension the space leaves empty, or a setting that is no dimension of its points, has the train section's."""
    if key in SPACE_KEYS and (key not in catalog.KNOBS or key in catalog.knobs(strategy)):
        return getattr(product, key) or (getattr(cfg.train, key),)
    return (getattr(cfg.train, key),)


def check_sweep(cfg: Config) -> None:
    """Raise ConfigError where cfg cannot be swept (sweep_refusal)."""
    if why := sweep_refusal(cfg):
        raise ConfigError(why)


def _yaml(v) -> str:
    """A value as YAML writes it (true, not True)."""
    return str(v).lower() if isinstance(v, bool) else str(v)


def profile_path(profile, root: Path) -> Path:
    """experiments/<profile>.yaml for a profile name of the fixed alphabet that names an existing file."""
    known = sorted(p.stem for p in (root / "experiments").glob("*.yaml") if PROFILE_NAME.fullmatch(p.stem))
    fix = (
        f"Valid profiles: {', '.join(known) or '(none found)'}. Select one with `dvc exp run -S profile=NAME` "
        f"or `--set profile=NAME`."
    )
    if not known:  # usually a command run outside the repository: say where the profiles were looked for
        fix += (
            f" No experiments/*.yaml under {root}, taken as the repository root (the nearest directory with "
            f"dvc.yaml or params.yaml, else the current one): run from the Parallax checkout, or set DVC_ROOT."
        )
    if isinstance(profile, str) and len(profile) > 100:  # a file name, an MLflow experiment's and a study's
        raise ConfigError(
            f"Invalid profile {_short(profile)!r}: it has {len(profile)} characters, at most 100 fit "
            f"(it names experiments/<profile>.yaml, its MLflow experiment and its studies). {fix}"
        )
    if not isinstance(profile, str) or not PROFILE_NAME.fullmatch(profile):
        raise ConfigError(
            f"Invalid profile {profile!r}: a profile is the name of a file under experiments/, made of "
            f"lower-case letters, digits, `_` and `-` (no path, no dots). {fix}"
        )
    pfile = root / "experiments" / f"{profile}.yaml"
    if not pfile.exists():  # one that is not a regular file is refused, with its kind, when it is read
        raise ConfigError(f"Unknown profile `{profile}`: no file experiments/{profile}.yaml. {fix}")
    return pfile


def _check_shapes(cls, layer: dict, prefix: str, where: str) -> None:
    hints = typing.get_type_hints(cls)
    for name, value in layer.items():
        typ = hints.get(name)
        key = f"{prefix}.{name}" if prefix else name
        if typ is not None and dataclasses.is_dataclass(typ) and value is not None:
            if not isinstance(value, dict):
                raise ConfigError(
                    f"Invalid configuration value for `{key}` in {where}: expected a mapping of keys "
                    f"(a section), got {value!r}. Write it as `{key}: {{...}}` or leave it out; a "
                    f"section of another shape is never dropped silently, with or without --set."
                )
            _check_shapes(typ, value, key, where)


def override(cfg: Config, items) -> Config:
    """A new Config with dotted overrides applied (validated like the file; a train setting pins, as --set's)."""
    sets = _sections_unset(apply_sets({}, items, user=False)[1])
    base = cfg.to_dict()
    return pin(_build(Config, _merge(base, _each_group(base, sets, "--set", {})), ""), [(sets, "--set")])


def replace_train(cfg: Config, **changes) -> Config:
    """A new Config whose train section has `changes` (validated)."""
    return _build(Config, _merge(cfg.to_dict(), {"train": changes}), "")


def describe_profiles(root: Path | None = None) -> list[tuple[str, str]]:
    """(name, description) of each profile; one that cannot be read is listed with its error, not fatal to the list."""
    root = Path(root) if root else repo_root()
    out = []
    for p in sorted((root / "experiments").glob("*.yaml")):
        if PROFILE_NAME.fullmatch(p.stem):
            try:
                out.append((p.stem, (_read_yaml(p).get("description") or "").strip()))
            except (ConfigError, AttributeError) as e:  # bad YAML; a file that is not a mapping
                out.append((p.stem, f"UNREADABLE: {e}"))
    return out
