"""What a user sets is what every trial runs: a `train.<key>` that is a sweep dimension, set in params.yaml, with
--set (or `dvc exp run -S`), pins that dimension in every trial of the selected strategies, or the sweep is refused
with a message naming the key; the study is a new one whenever the points change."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline import catalog, zoo
from pipeline.cli import main
from pipeline.config import loader, schema
from pipeline.paths import repo_root
from pipeline.sweep import space
from pipeline.sweep.space import Space

REPO = repo_root()
MISSING = "(none: not a dimension of its points)"


def load(*sets, params=REPO / "params.yaml", root=REPO):
    return loader.load(params, list(sets), root=root)


def _other(key: str):
    """A valid value of train.<key> other than its default (from the schema: no list written by hand)."""
    f = next(f for f in dataclasses.fields(schema.TrainConfig) if f.name == key)
    if "choices" in f.metadata:
        return next(v for v in f.metadata["choices"] if v != f.default)
    if key == "model":  # any name the zoo builds: d2l's other one
        return next(v for v in zoo.D2L if v != f.default)
    if isinstance(f.default, bool):
        return not f.default
    if isinstance(f.default, int):
        return f.default + 1
    return f.default * 2


def _yaml(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


# every train key a user may set that is also a sweep dimension: SpaceConfig's fields (the catalog's knobs among them)
SPACE = [f.name for f in dataclasses.fields(schema.SpaceConfig)]
DIMENSIONS = [k for k in SPACE if k in {f.name for f in dataclasses.fields(schema.TrainConfig)}]
# every strategy of the catalog selected (params.yaml's null), and each one alone
SELECTIONS = [[], *([f"sweep.strategies=[{n}]"] for n in catalog.NAMES)]


def test_the_walk_covers_every_dimension_and_knob():
    assert DIMENSIONS == SPACE and set(catalog.KNOBS) <= set(DIMENSIONS)
    assert {"model", "devices", "batch_size", "lr", "optimizer"} <= set(DIMENSIONS)


@pytest.mark.parametrize("selection", SELECTIONS, ids=["all"] + list(catalog.NAMES))
@pytest.mark.parametrize("key", DIMENSIONS)
def test_a_train_setting_reaches_every_trial_of_the_selected_strategies_or_is_refused(key, selection):
    value = _other(key)
    base = load(*selection)
    try:
        cfg = load(f"train.{key}={_yaml(value)}", *selection)
        pts = {s: space.points(cfg, s) for s in cfg.sweep.strategies}
    except loader.ConfigError as e:
        assert f"`train.{key}=" in str(e) and "sweep.s" in str(e), str(e)  # names the key and the form to use
        return
    for s, ps in pts.items():
        got = {p.get(key, MISSING) for p in ps}
        assert got == {value}, f"{s}: train.{key}={value} set, its trials run {got} (silently replaced)"
        configs = Space(cfg, s).config
        assert {getattr(configs(p).train, key) for p in ps} == {value}, s
        assert Space(cfg, s).name != Space(base, s).name, f"{s}: the points changed, the study did not"


def test_lr_and_batch_size_set_give_only_those_points_and_a_study_of_their_own():
    base = load()
    cfg = load("train.lr=0.2", "train.batch_size=32")
    for s in cfg.sweep.strategies:
        pts = space.points(cfg, s)
        assert {(p["lr"], p["batch_size"]) for p in pts} == {(0.2, 32)}, s
        assert Space(cfg, s).choices["lr"] == [0.2] and Space(cfg, s).choices["batch_size"] == [32], s
        assert Space(cfg, s).name != Space(base, s).name, s


def test_a_knob_a_selected_strategy_cannot_take_is_refused_naming_it_and_the_space_form():
    with pytest.raises(loader.ConfigError) as e:
        space.points(load("train.comm_hook=fp16", "sweep.strategies=[ddp, single]"), "ddp")
    msg = str(e.value)
    assert "`train.comm_hook=fp16`" in msg and "`single`" in msg and "sweep.spaces.ddp.comm_hook" in msg, msg
    assert "sweep.strategies=[ddp]" in msg, msg
    cfg = load("train.comm_hook=fp16", "sweep.strategies=[ddp]")
    assert {p["comm_hook"] for p in space.points(cfg, "ddp")} == {"fp16"}
    assert space.points(cfg, "single")  # unselected: its table lists its points, without the knob it lacks


def test_the_sweep_command_refuses_it_in_every_stage_before_any_work(tmp_path, monkeypatch, capsys):
    """DVC runs every sweep@ stage, selected or not: each refuses, exit 2, before a store or the data is opened."""
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "cpu.yaml").write_text((REPO / "experiments" / "cpu.yaml").read_text())
    (tmp_path / "params.yaml").write_text("profile: cpu\nsweep: {strategies: [ddp, single]}\ntrain: {comm_hook: shm}\n")
    monkeypatch.chdir(tmp_path)
    for strategy in ("ddp", "single", "fsdp"):
        assert main(["sweep", "--strategy", strategy]) == 2, strategy
        err = " ".join(capsys.readouterr().err.split())
        assert "`train.comm_hook=shm`" in err and "`single`" in err and "sweep.spaces.ddp.comm_hook" in err, err
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "results").exists()


def test_params_yaml_pins_as_set_does_and_a_profile_s_train_values_do_not(tmp_path):
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "p.yaml").write_text(
        "train: {lr: 0.5, batch_size: 64}\nsweep: {spaces: {default: {devices: [1], batch_size: [128], lr: [0.1]}}}\n"
    )
    (tmp_path / "params.yaml").write_text("profile: p\ntrain: {lr: 0.2, batch_size: null}\n")
    cfg = load(params=tmp_path / "params.yaml", root=tmp_path)
    assert {(p["lr"], p["batch_size"]) for p in space.points(cfg, "ddp")} == {(0.2, 128)}  # the profile's B stays
    cfg = load("train.batch_size=32", params=tmp_path / "params.yaml", root=tmp_path)
    assert {(p["lr"], p["batch_size"]) for p in space.points(cfg, "ddp")} == {(0.2, 32)}


def test_a_setting_and_a_space_of_the_user_that_disagree_are_refused_naming_both():
    with pytest.raises(loader.ConfigError) as e:
        load("train.lr=0.2", "sweep.spaces.ddp.lr=[0.1, 0.3]")
    msg = str(e.value)
    assert "`train.lr=0.2`" in msg and "`sweep.spaces.ddp.lr`" in msg and "--set" in msg, msg
    cfg = load("train.lr=0.2", "sweep.spaces.ddp.lr=[0.2]")  # the same one value: nothing to choose between
    assert {p["lr"] for p in space.points(cfg, "ddp")} == {0.2}
    cfg = load("train.lr=0.2", "sweep.spaces.ddp={devices: [1, 2], batch_size: [64]}")  # the space leaves lr out
    assert {(p["lr"], p["batch_size"]) for p in space.points(cfg, "ddp")} == {(0.2, 64)}


def test_a_setting_left_at_null_pins_nothing():
    cfg = load("train.lr=null", "train.comm_hook=null")
    assert cfg.sweep.spaces == load().sweep.spaces
    assert Space(cfg, "ddp").name == Space(load(), "ddp").name


def test_override_pins_as_set_does_and_the_trial_config_keeps_it():
    cfg = loader.override(load("sweep.strategies=[ddp]"), ["train.accum_steps=2"])
    pts = space.points(cfg, "ddp")
    assert {p["accum_steps"] for p in pts} == {2}
    assert space.trial_config(cfg, "ddp", pts[0]).train.accum_steps == 2


def test_a_command_that_runs_no_sweep_is_not_refused_for_a_space_it_never_reads(tmp_path):
    """`python -m pipeline train --set train.lr=0.2` beside a params.yaml that sweeps lr for ddp: one run, no sweep."""
    (tmp_path / "params.yaml").write_text("profile: ''\nsweep: {spaces: {ddp: {lr: [0.1, 0.3]}}}\n")
    with pytest.raises(loader.ConfigError, match="the two disagree"):
        loader.load(None, ["train.lr=0.2"], root=tmp_path)
    assert loader.load(None, ["train.lr=0.2"], root=tmp_path, sweeps=False).train.lr == 0.2


@pytest.fixture
def sweep_cli(tmp_path, monkeypatch, capsys):
    """`python -m pipeline sweep --strategy S --set ...` in a store under tmp_path (the cpu profile): its exit status
    and its stderr; a sweep it would run is recorded, not run."""
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "cpu.yaml").write_text((REPO / "experiments" / "cpu.yaml").read_text())
    (tmp_path / "params.yaml").write_text("profile: cpu\n")
    monkeypatch.chdir(tmp_path)
    ran = []
    monkeypatch.setattr("pipeline.sweep.stage.run_sweep", lambda cfg, strategy, *a, **k: ran.append(strategy))

    def sweep(strategy, *sets):
        rc = main(["sweep", "--strategy", strategy, *(a for s in sets for a in ("--set", s))])
        return rc, " ".join(capsys.readouterr().err.split()), ran

    return sweep


@pytest.mark.parametrize("value", ["single", "ddp"])
def test_train_strategy_set_for_a_sweep_is_refused_its_default_too(sweep_cli, value):
    """Each sweep stage runs its own strategy: `-S train.strategy=single -s 'sweep@ddp'` would record single and
    measure ddp. The profiles and the train command, which takes train.strategy, are not refused."""
    rc, err, ran = sweep_cli("ddp", f"train.strategy={value}")
    assert rc == 2 and not ran, (rc, ran, err)
    assert f"`train.strategy={value}`" in err and "sweep@<strategy>" in err and "sweep.strategies=[" in err, err
    for profile in sorted(p.stem for p in (REPO / "experiments").glob("*.yaml")):
        loader.check_sweep(loader.load(None, [f"profile={profile}"], root=REPO, stage=True))
    assert loader.load(None, [f"train.strategy={value}"], root=REPO, sweeps=False).train.strategy == value


@pytest.mark.parametrize(
    "setting,refused,accepted",
    [
        ("train.amp_dtype=fp16", ["sweep.strategies=[ddp]"], ["sweep.strategies=[ddp, ddp_amp]"]),
        ("train.amp_dtype=bf16", ["sweep.strategies=[single]"], ["sweep.strategies=[single]", "train.autocast=true"]),
        ("train.amp_init_scale=1024", ["sweep.strategies=[ddp]"], ["sweep.strategies=[ddp_amp]"]),
        ("train.output_device=1", ["sweep.strategies=[ddp, ddp_amp]"], ["sweep.strategies=[dp, ddp]"]),
        (
            "train.compile_mode=reduce-overhead",
            ["sweep.strategies=[ddp]"],
            ["sweep.strategies=[ddp]", "sweep.spaces.ddp.compile=[false, true]"],
        ),
    ],
)
def test_a_setting_no_point_runs_with_is_refused_up_front_and_one_some_point_runs_with_is_not(
    sweep_cli, setting, refused, accepted
):
    """amp_dtype and amp_init_scale apply where autocast runs, output_device where dp gathers, compile_mode with
    compile on (catalog.APPLIES_WITH): set where no point of the selected strategies runs with it, the sweep exits 2
    naming the key before any study; at its default it passes, and with a point that runs it those points carry it,
    the others the default."""
    key, _, value = setting.partition("=")
    rc, err, ran = sweep_cli("ddp", setting, *refused)
    assert rc == 2 and not ran, (rc, ran, err)
    assert f"`{key}={value}" in err and "applies with" in err, err
    default = getattr(schema.TrainConfig(), key.split(".")[1])
    assert not loader.sweep_refusal(load(f"{key}={_yaml(default)}", *refused))
    cfg = load(setting, *accepted)
    name = key.split(".")[1]
    assert not loader.sweep_refusal(cfg) and getattr(cfg.train, name) != default
    # the points that run with it carry it; the others (ddp beside dp or ddp_amp) run and record the default
    got = {
        (s, catalog.applies(name, s, p), getattr(space.trial_config(cfg, s, p).train, name))
        for s in cfg.sweep.strategies
        for p in space.points(cfg, s)
    }
    assert {v for _, runs, v in got if runs} == {getattr(cfg.train, name)}, got
    assert {v for _, runs, v in got if not runs} <= {default}, got


def test_a_one_device_strategy_given_only_more_devices_is_refused_a_host_limit_is_skipped(sweep_cli):
    """`train.devices=2` (or a space of devices [2]) for `single`, which runs on one device, is a configuration's
    conflict, refused before anything runs, naming the key and the strategy, never reported as this host's limit; a
    space that keeps a one-device point runs it, its other points skipped."""
    for sets in (["train.devices=2"], ["train.devices=2", "sweep.strategies=[single]"]):
        rc, err, ran = sweep_cli("single", *sets)
        assert rc == 2 and not ran, (rc, ran, err)
        assert "`train.devices=2`" in err and "`single` runs on exactly one device" in err, err
        assert "sweep.spaces.scratch.devices=[2]" in err and "skipped" not in err, err  # the first parallel row
    rc, err, ran = sweep_cli("single", "sweep.spaces.single.devices=[2, 4]", "sweep.strategies=[single]")
    assert rc == 2 and "`sweep.spaces.single.devices` gives `single` only 2, 4 device(s)" in err, err
    rc, err, ran = sweep_cli("single", "sweep.spaces.single.devices=[1, 2]", "sweep.strategies=[single]")
    assert rc == 0 and ran == ["single"], err
    assert sweep_cli("ddp", "train.devices=2", "sweep.strategies=[ddp]")[0] == 0
