"""A study's identity covers every setting that changes a trial's result: each field of the configuration schema,
changed on its own, changes the study's name unless it is on the NEUTRAL list (with its reason) or set per point."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.config import loader, schema
from pipeline.sweep import space
from pipeline.sweep.space import Space


def _other(f: dataclasses.Field, value):
    """A different value of the field's type (validity beyond the type is not needed: the digest only reads)."""
    if "choices" in f.metadata:
        return next(c for c in f.metadata["choices"] if c != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, tuple):
        return value[:1]
    if isinstance(value, dict):  # sweep.spaces: another strategy's space
        return {"ddp": (schema.SpaceConfig(lr=(0.5,)),)}
    raise AssertionError(f"no other value for {f.name}={value!r}: teach _other the type")


def _changed(cfg, setting: str):
    section, _, name = setting.rpartition(".")
    if not section:
        f = next(f for f in dataclasses.fields(cfg) if f.name == name)
        return dataclasses.replace(cfg, **{name: _other(f, getattr(cfg, name))})
    sub = getattr(cfg, section)
    f = next(f for f in dataclasses.fields(sub) if f.name == name)
    return dataclasses.replace(cfg, **{section: dataclasses.replace(sub, **{name: _other(f, getattr(sub, name))})})


def _every_setting() -> list[str]:
    out = []
    for f in dataclasses.fields(schema.Config):
        if dataclasses.is_dataclass(f.default):
            out += [f"{f.name}.{g.name}" for g in dataclasses.fields(f.default)]
        else:
            out.append(f.name)
    return out


SETTINGS = _every_setting()
STRATEGY = "single"


def test_the_walk_covers_every_section():
    sections = {s.split(".")[0] for s in SETTINGS}
    assert sections == {f.name for f in dataclasses.fields(schema.Config)}
    assert "train.init" in SETTINGS and "slurm.partition" in SETTINGS and len(SETTINGS) > 60


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_setting_changes_the_study_unless_it_is_neutral_or_per_point(setting):
    cfg = schema.Config()
    # the point's own settings: the dimensions its space sweeps (one it leaves empty, as SpaceConfig.optimizer by
    # default, takes train's value into the point, so that train setting changes the study)
    swept = {k for s in cfg.space(STRATEGY) for k in space.SPACE_KEYS if getattr(s, k)}
    per_point = {f"train.{k}" for p in space.points(cfg, STRATEGY) for k in p if k in swept}
    changed = _changed(cfg, setting)
    if why := loader.sweep_refusal(changed):  # a knob some selected strategy cannot take: no study, nothing runs
        assert f"`{setting}=" in why, why
        return
    before, after = Space(cfg, STRATEGY).hash, Space(changed, STRATEGY).hash
    # a setting no point of STRATEGY runs with (its trials run the default: space.unapplied)
    unrun = {f"train.{k}" for k in space.unapplied(changed, STRATEGY, {})}
    if space.neutral(setting) or setting in per_point or setting in unrun:
        assert after == before, f"{setting} is neutral, the point's or not run by {STRATEGY}, yet changes the study"
    else:
        assert after != before, (
            f"{setting} changes no study: add it to the identity, or to space.NEUTRAL with the reason it cannot "
            "change a trial's result"
        )


def test_every_neutral_name_is_a_setting_or_a_section_and_says_why():
    names = set(SETTINGS) | {s.split(".")[0] for s in SETTINGS}
    assert set(space.NEUTRAL) <= names, set(space.NEUTRAL) - names
    assert all(len(why) > 15 for why in space.NEUTRAL.values())


def test_the_settings_a_hostile_user_changed_start_a_new_study():
    """The case that filed another configuration's numbers: d2l's init and channels_last off under one name."""
    cfg = schema.Config()
    changed = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, init="d2l", channels_last=False))
    assert Space(changed, STRATEGY).name != Space(cfg, STRATEGY).name


def test_the_strategy_s_own_space_changes_the_study_and_another_s_does_not():
    cfg = schema.Config()
    lr = (schema.SpaceConfig(lr=(0.5,)),)
    own = dataclasses.replace(cfg, sweep=dataclasses.replace(cfg.sweep, spaces={STRATEGY: lr}))
    other = dataclasses.replace(cfg, sweep=dataclasses.replace(cfg.sweep, spaces={"ddp": lr}))
    assert Space(own, STRATEGY).hash != Space(cfg, STRATEGY).hash
    assert Space(other, STRATEGY).hash == Space(cfg, STRATEGY).hash


def test_a_strategys_catalog_revision_changes_its_study_and_no_other(monkeypatch):
    """A change to a strategy's code that changes what its trials measure raises its catalog revision: its study is
    a new one (an old store's trials are not filed beside the new), every other strategy's stays as it was, and the
    first revision adds nothing to the identity (studies made before revisions existed keep their names)."""
    from pipeline import catalog

    cfg = schema.Config()
    before = {n: Space(cfg, n).hash for n in catalog.NAMES}
    assert "revision" not in Space(cfg, "single").identity and Space(cfg, "fsdp").identity["revision"] == 2
    bumped = dataclasses.replace(catalog.SPECS["single"], revision=2)
    monkeypatch.setitem(catalog.SPECS, "single", bumped)
    after = {n: Space(cfg, n).hash for n in catalog.NAMES}
    assert after["single"] != before["single"]
    assert {n: h for n, h in after.items() if n != "single"} == {n: h for n, h in before.items() if n != "single"}


def test_params_yaml_lists_every_train_and_sweep_key_so_dvc_exp_run_can_set_it():
    """DVC refuses `-S train.init=d2l` unless params.yaml has the key: every train key and every scalar sweep key is
    listed (null: the profile's value), so each setting that changes a study can be set the plain way."""
    import yaml

    from pipeline import paths

    listed = yaml.safe_load((paths.repo_root() / "params.yaml").read_text())
    for section, cls in (("train", schema.TrainConfig), ("sweep", schema.SweepConfig)):
        missing = {f.name for f in dataclasses.fields(cls) if f.name != "spaces"} - set(listed[section] or {})
        assert not missing, f"params.yaml's {section} lacks {sorted(missing)}: list each (null = the profile's)"


def test_the_study_s_changed_settings_name_what_sets_it_apart():
    cfg = schema.Config()
    changed = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, init="d2l", channels_last=False))
    assert Space(cfg, STRATEGY).changed_settings() == {}
    assert Space(changed, STRATEGY).changed_settings() == {"train.init": "d2l", "train.channels_last": False}


class StopAtFirstEpoch:
    """A user's listener that stops every trial at its first epoch's end (as a pruner does)."""

    def __init__(self, cfg):
        pass

    def epoch(self, trial, record):
        return True


class RecordsEnds:
    """A user's listener that only records each trial's end."""

    def __init__(self, cfg):
        pass

    def ended(self, trial, outcome):
        pass


def _listening(cfg, *entries):
    return dataclasses.replace(cfg, tracking=dataclasses.replace(cfg.tracking, listeners=entries))


def test_a_listener_that_can_stop_trials_is_part_of_the_study_and_a_recording_one_is_not():
    """A point a stopping listener cut short is the study's with it, so the study without it still measures that
    point; a store that only records changes no trial, so it shares the study (and its finished trials)."""
    cfg = schema.Config()
    stopper, recorder = f"{__name__}:StopAtFirstEpoch", f"{__name__}:RecordsEnds"
    assert Space(_listening(cfg, stopper), STRATEGY).name != Space(cfg, STRATEGY).name
    assert Space(_listening(cfg, recorder), STRATEGY).name == Space(cfg, STRATEGY).name
    assert Space(_listening(cfg, recorder, stopper), STRATEGY).name == Space(_listening(cfg, stopper), STRATEGY).name
    assert Space(_listening(cfg, recorder, stopper), STRATEGY).changed_settings() == {"tracking.listeners": [stopper]}


# ---------------------------------------------------------------- what ran: the code, the data, torch


def _prepared(root, labels: bytes = b"l" * 16, n_train: int = 60000, n_test: int = 10000):
    """A data folder's manifest.json as the download stage writes it (the identity reads the manifest, not the
    files: load(verify=True) refuses files that differ from it before any study is opened)."""
    import hashlib
    import json

    sizes = {
        "train-images-idx3-ubyte": 16 + 784 * n_train,
        "train-labels-idx1-ubyte": 8 + n_train,
        "t10k-images-idx3-ubyte": 16 + 784 * n_test,
        "t10k-labels-idx1-ubyte": 8 + n_test,
    }
    files = {n: {"md5": hashlib.md5(n.encode() + labels).hexdigest(), "bytes": b} for n, b in sizes.items()}
    root.mkdir(parents=True, exist_ok=True)
    (root / "manifest.json").write_text(json.dumps({"source": "fashion-mnist", "files": files, "mirror": ""}))
    return root


def _data(cfg, **kw):
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **kw))


@pytest.mark.parametrize(
    "file,old,new",
    [
        # LeNet widened: the trials compute another model
        ("models.py", "nn.Linear(50 * 4 * 4, 128)", "nn.Linear(50 * 4 * 4, 512)"),
        # DDP's settling steps: a CUDA graph is captured at another step, and its trials measure another window
        ("config/settle.py", "DDP_RUNTIME_STATS_ITERATIONS = 10", "DDP_RUNTIME_STATS_ITERATIONS = 20"),
    ],
)
def test_a_changed_trial_source_starts_a_new_study(tmp_path, monkeypatch, file, old, new):
    """An edit to the code a trial runs: the rerun measures again instead of finding the old study complete."""
    import shutil

    from pipeline.sweep import provenance

    cfg = schema.Config()
    before = Space(cfg, STRATEGY).name
    copy = tmp_path / "pipeline"
    shutil.copytree(provenance.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert provenance.sources_digest(copy) == provenance.code_digest()  # the copy digests as the package does
    source = copy / file
    edited = source.read_text().replace(old, new)
    assert edited != source.read_text()
    source.write_text(edited)
    monkeypatch.setattr(provenance, "code_digest", lambda: provenance.sources_digest(copy))
    assert Space(cfg, STRATEGY).name != before


def test_another_torch_starts_a_new_study(monkeypatch):
    from pipeline.sweep import provenance

    cfg = schema.Config()
    before = Space(cfg, STRATEGY).name
    monkeypatch.setattr(provenance, "torch_version", lambda: "9.9.9")
    assert Space(cfg, STRATEGY).name != before


def test_a_model_beyond_d2l_names_the_release_that_builds_it(make_cfg, monkeypatch):
    """A torchvision model's study holds torchvision's version (another release: another study); a d2l model's holds
    no model source, so the studies of d2l's models keep their names."""
    from pipeline import zoo

    assert "model_sources" not in Space(make_cfg(), STRATEGY).identity
    cfg = make_cfg("train.model=mobilenet_v3_small")  # pinned in every space (loader.pin)
    own = Space(cfg, STRATEGY)
    assert own.identity["model_sources"] == {"mobilenet_v3_small": zoo.source("mobilenet_v3_small")}
    assert own.identity["model_sources"]["mobilenet_v3_small"].startswith("torchvision ")
    monkeypatch.setattr(zoo, "source", lambda name: "torchvision 99.0")
    assert Space(cfg, STRATEGY).name != own.name


def test_changed_data_content_starts_a_new_study(tmp_path):
    """Every label changed and the manifest's checksums recomputed (a re-download from another mirror) under the same
    data.dir: another study."""
    cfg = _data(schema.Config(), dir=str(tmp_path / "fm"))
    _prepared(tmp_path / "fm")
    before = Space(cfg, STRATEGY).name
    _prepared(tmp_path / "fm", labels=b"relabelled")
    assert Space(cfg, STRATEGY).name != before


def test_one_data_folder_however_spelled_is_one_study(tmp_path, monkeypatch):
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))  # the project data.dir is relative to
    _prepared(tmp_path / "data" / "x")
    spellings = ["data/x", "./data/x", "data/x/", str(tmp_path / "data" / "x")]
    names = {Space(_data(schema.Config(), dir=d), STRATEGY).name for d in spellings}
    assert len(names) == 1, names
    # and a folder with no prepared data yet is named by its resolved path, however spelled
    names = {Space(_data(schema.Config(), dir=d.replace("x", "y")), STRATEGY).name for d in spellings}
    assert len(names) == 1, names


def test_limits_that_load_the_same_samples_are_one_study(tmp_path):
    cfg = _data(schema.Config(), dir=str(_prepared(tmp_path / "fm")))
    whole = {Space(_data(cfg, train_limit=n), STRATEGY).name for n in (0, 60000, 70000)}
    assert len(whole) == 1, whole
    assert Space(_data(cfg, train_limit=59999), STRATEGY).name not in whole
    tests = {Space(_data(cfg, test_limit=n), STRATEGY).name for n in (0, 10000)}
    assert len(tests) == 1, tests


def test_the_code_data_and_torch_are_recorded_on_the_study_its_parent_run_and_its_rows(tmp_path):
    """One name each (code_digest, data_digest, torch_version) on the study's attributes, its MLflow parent run's
    tags, and every row of its sweep table (which `dvc exp show` and the report read)."""
    import optuna

    from pipeline.records.table import trial_row
    from pipeline.sweep import provenance, study_parent, study_view

    cfg = _data(schema.Config(), dir=str(_prepared(tmp_path / "fm")))
    want = {
        "code_digest": provenance.code_digest(),
        "data_digest": space.provenance.data_content(cfg)["digest"],
        "torch_version": provenance.torch_version(),
    }
    strategy_space = Space(cfg, STRATEGY)
    study = optuna.create_study(study_name=strategy_space.name)
    study_view.name_study(study, STRATEGY, cfg.profile, strategy_space.hash, facts=strategy_space.facts)
    assert {k: study.user_attrs[k] for k in want} == want
    row = trial_row(study, STRATEGY, point={"devices": 1, "batch_size": 8}, reason="skipped")
    assert {k: row[k] for k in want} == want
    import pandas as pd

    from pipeline.analysis.tables.summary import provenance as in_summary  # summary.json's per-strategy entries

    assert in_summary(pd.DataFrame([row]), STRATEGY) == want

    class Tracker:
        tags: dict = {}

        def start_run(self, name, tags, owned=True):
            Tracker.tags = tags
            return "parent"

        def log_params(self, run_id, params):
            pass

    host = type("Host", (), {"kind": "cpu", "hostname": "h"})
    study_parent.start(study, strategy_space, host, Tracker(), "sqlite:///optuna.db", 1)
    assert {k: Tracker.tags[k] for k in want} == want


def test_a_setting_only_another_strategy_runs_renames_its_study_only():
    """train.amp_dtype=fp16 in a sweep of every strategy: ddp_amp's study is a new one, ddp's (no autocast) keeps its
    name, and ddp's trials run and record the default, never a setting they do not run with."""
    cfg = schema.Config()
    fp16 = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, amp_dtype="fp16", amp_init_scale=1024.0))
    assert not loader.sweep_refusal(fp16)
    assert Space(fp16, "ddp_amp").name != Space(cfg, "ddp_amp").name
    assert Space(fp16, "ddp").name == Space(cfg, "ddp").name
    ddp = Space(fp16, "ddp")
    t = ddp.config(ddp.points[0]).train
    assert (t.amp_dtype, t.amp_init_scale) == (cfg.train.amp_dtype, cfg.train.amp_init_scale)
    amp = Space(fp16, "ddp_amp")
    assert amp.config(amp.points[0]).train.amp_dtype == "fp16"
    single = dataclasses.replace(
        fp16, sweep=dataclasses.replace(fp16.sweep, spaces={"single": (schema.SpaceConfig(autocast=(False, True)),)})
    )
    on = Space(single, "single")
    assert {p["autocast"]: on.config(p).train.amp_dtype for p in on.points} == {False: "auto", True: "fp16"}
    assert on.name != Space(cfg, "single").name


def test_the_sweep_says_which_trials_run_without_a_setting_that_does_not_apply_to_them(capsys):
    """train.amp_dtype=fp16 with ddp (no autocast) and single (autocast off and on): before the first trial the sweep
    says what the setting applies with and which trials run and record the default instead; a strategy that runs
    it everywhere, or a setting left at its default, says nothing."""
    import optuna

    from pipeline.sweep import stage

    cfg = schema.Config()
    fp16 = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, amp_dtype="fp16"))
    single = dataclasses.replace(
        fp16, sweep=dataclasses.replace(fp16.sweep, spaces={"single": (schema.SpaceConfig(autocast=(False, True)),)})
    )
    ddp, amp, half = Space(fp16, "ddp"), Space(fp16, "ddp_amp"), Space(single, "single")
    assert ddp.defaulted() == {"amp_dtype": ("fp16", "auto", len(ddp.points), len(ddp.points))}
    assert amp.defaulted() == {} and Space(cfg, "ddp").defaulted() == {}
    assert half.defaulted() == {"amp_dtype": ("fp16", "auto", len(half.points) // 2, len(half.points))}

    def announced(space) -> str:
        host = type("Host", (), {"kind": "cpu", "n": 2})
        study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
        sweep = type("Sweep", (), {"study": study, "strategy": space.strategy, "host": host, "total": 0})
        sweep.skipped, sweep.cfg, sweep.space = [], space.cfg, space
        stage._announce(sweep, [])
        return " ".join(capsys.readouterr().err.split())

    said = announced(ddp)
    assert "train.amp_dtype=fp16 is autocast's type and applies with" in said, said
    assert "its trials run without it and record the default train.amp_dtype=auto" in said, said
    assert f"{len(half.points) // 2} of its {len(half.points)} points' trials run without it" in announced(half)
    assert "amp_dtype" not in announced(amp)
