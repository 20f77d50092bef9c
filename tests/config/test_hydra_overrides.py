"""--set takes Hydra's override grammar as `dvc exp run -S` does: `+` adds, `++` adds or changes, `~` removes
params.yaml's value (the profile's applies); `key=a,b`, Hydra's sweep form, points to sweep.spaces."""

import shutil

import pytest

from pipeline.config import loader
from pipeline.paths import repo_root

REPO = repo_root()


def dvc_set(tmp_path, params, overrides):
    """The Config that `dvc exp run -S` gives: DVC's own apply_overrides on a copy of `params`, then loaded."""
    hydra = pytest.importorskip("dvc.utils.hydra")
    copy = tmp_path / "dvc-S" / "params.yaml"
    copy.parent.mkdir()
    shutil.copy(params, copy)
    hydra.apply_overrides(copy, list(overrides))
    return loader.load(copy, root=params.parent)


@pytest.mark.parametrize(
    "overrides",
    [
        ["++train.epochs=1"],
        ["+tracking.system_metrics=true"],
        ["++tracking.system_metrics=true"],  # docs/metrics.md's example
        ["+sweep.spaces.ddp.comm_hook=[none, shm]"],  # docs/usage.md's example: a list is merged over what is there
        ["++train.epochs=1", "+tracking.system_metrics=true", "++sweep.n_trials=4"],
    ],
)
def test_set_takes_hydras_prefixes_as_dvc_exp_run_S_does(tmp_path, overrides):
    params = REPO / "params.yaml"
    assert loader.load(params, overrides, root=REPO) == dvc_set(tmp_path, params, overrides)


def test_plus_on_a_key_params_yaml_sets_is_refused_as_hydra_refuses_it(tmp_path):
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "p.yaml").write_text("train: {epochs: 4}\n")
    params = tmp_path / "params.yaml"
    params.write_text("profile: p\ntrain: {epochs: 3, lr: null}\n")
    with pytest.raises(loader.ConfigError) as e:
        loader.load(params, ["+train.epochs=1"], root=tmp_path)
    said = str(e.value)
    assert "an item is already at `train.epochs` (3, from params.yaml)" in said
    assert "`train.epochs=1` to change it, or `++train.epochs=1`" in said and "\n" not in said
    with pytest.raises(loader.ConfigError, match="already at `train.epochs` .1, from an earlier --set"):
        loader.load(params, ["train.epochs=1", "+train.epochs=2"], root=tmp_path)
    assert loader.load(params, ["+train.lr=0.5"], root=tmp_path).train.lr == 0.5  # a null placeholder is no value
    assert loader.load(params, ["++train.epochs=1"], root=tmp_path).train.epochs == 1
    with pytest.raises(Exception, match="set-param"):  # DVC's -S refuses it too
        dvc_set(tmp_path, params, ["+train.epochs=1"])


def test_tilde_removes_params_yamls_value_so_the_profiles_applies(tmp_path):
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "p.yaml").write_text("train: {epochs: 4, lr: 0.3}\n")
    params = tmp_path / "params.yaml"
    params.write_text("profile: p\ntrain: {epochs: 3, lr: 0.05}\n")
    cfg = loader.load(params, ["~train.epochs", "~train.lr=0.05"], root=tmp_path)
    assert (cfg.train.epochs, cfg.train.lr) == (4, 0.3)  # the profile's
    assert loader.load(params, ["~train.epochs", "~train.lr"], root=tmp_path) == dvc_set(
        tmp_path / "experiments", params, ["~train.epochs", "~train.lr"]
    )
    assert (
        loader.load(params, ["train.epochs=9", "~train.epochs"], root=tmp_path).train.epochs == 4
    )  # an earlier --set too
    assert (
        loader.load(params, ["~data.train_limit"], root=tmp_path).data == loader.DataConfig()
    )  # unset: stays the default
    with pytest.raises(loader.ConfigError, match=r"params.yaml gives it 0.05, not 0.1\. Write `~train.lr`"):
        loader.load(params, ["~train.lr=0.1"], root=tmp_path)
    with pytest.raises(loader.ConfigError, match=r"Unknown configuration key `train.epohcs` in --set '~train.epohcs'"):
        loader.load(params, ["~train.epohcs"], root=tmp_path)  # a typo removes nothing: said, not passed over


def test_tilde_takes_a_train_pin_off_the_sweep(tmp_path):
    """A train value in params.yaml pins a sweep dimension; `~` removes it, and the profile's space applies."""
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "p.yaml").write_text("sweep: {spaces: {default: {lr: [0.1, 0.3]}}}\n")
    params = tmp_path / "params.yaml"
    params.write_text("profile: p\ntrain: {lr: 0.05}\n")
    assert loader.load(params, root=tmp_path).space("ddp")[0].lr == (0.05,)
    assert loader.load(params, ["~train.lr"], root=tmp_path).space("ddp")[0].lr == (0.1, 0.3)


@pytest.mark.parametrize(
    "item,form",
    [
        ("train.lr=0.1,0.3", "--set 'sweep.spaces.default.lr=[0.1,0.3]'"),
        ("++train.devices=1,2", "--set 'sweep.spaces.default.devices=[1,2]'"),
        ("sweep.spaces.ddp.lr=0.1,0.3", "--set 'sweep.spaces.ddp.lr=[0.1,0.3]'"),
        ("sweep.strategies=ddp,fsdp", "--set 'sweep.strategies=[ddp,fsdp]'"),
    ],
)
def test_a_comma_list_is_answered_with_the_sweep_spaces_form(item, form):
    with pytest.raises(loader.ConfigError) as e:
        loader.load(REPO / "params.yaml", [item], root=REPO)
    said = str(e.value)
    assert said.startswith(f"The --set option {item!r} is a comma list, Hydra's multirun form") and form in said
    assert "\n" not in said


def test_a_quoted_comma_is_text_and_the_packages_own_values_are_taken_as_they_are():
    assert loader.load(REPO / "params.yaml", ["slurm.partition='a,b'"], root=REPO).slurm.partition == "a,b"
    cfg = loader.load(REPO / "params.yaml", root=REPO)
    assert loader.override(cfg, ["slurm.partition=a,b"]).slurm.partition == "a,b"  # a folder or name the package holds


def test_dash_S_is_set(tmp_path):
    from pipeline.cli.parser import build_parser

    args = build_parser().parse_args(["train", "--out", str(tmp_path), "-S", "++train.epochs=1", "--set", "~train.lr"])
    assert args.overrides == ["++train.epochs=1", "~train.lr"]
