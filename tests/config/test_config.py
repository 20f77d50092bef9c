"""params.yaml -> frozen dataclasses; every invalid value is refused before any work, naming key and fix."""

import dataclasses

import pytest

from pipeline.config import loader
from pipeline.paths import repo_root

REPO = repo_root()


def load(*sets):
    return loader.load(REPO / "params.yaml", list(sets), root=REPO)


def test_repo_params_and_every_profile_load():
    for name, desc in loader.describe_profiles(REPO):
        cfg = load(f"profile={name}")
        assert desc, f"profile {name} has no description"
        assert cfg.profile == name
        for s in cfg.sweep.strategies:
            assert cfg.space(s)


def test_layers_profile_then_params_then_set():
    import yaml

    cfg = load()
    profile = yaml.safe_load((REPO / "experiments" / "cpu.yaml").read_text())
    assert cfg.profile == "cpu" and cfg.data.train_limit == profile["data"]["train_limit"] > 0
    assert load("data.train_limit=500").data.train_limit == 500


def test_a_null_set_is_the_key_left_out_as_params_yaml_documents(tmp_path):
    """params.yaml documents `train_limit: null  # null = the profile's`; `--set data.train_limit=null` (and DVC's
    `-S`, which writes the null into params.yaml) means the same: the key left out at that layer."""
    profile = load().data.train_limit
    assert load("data.train_limit=null").data.train_limit == profile > 0
    assert load("data.train_limit=null", "data.test_limit=~", "train.epochs=null").train.epochs == load().train.epochs
    (tmp_path / "params.yaml").write_text("profile: ''\ndata: {train_limit: 100}\n")
    assert loader.load(None, ["data.train_limit=null"], root=tmp_path).data.train_limit == 100  # the layer below's
    assert loader.override(load(), ["data.train_limit=null"]).data.train_limit == profile


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        load().train.lr = 1.0


def test_override_returns_new_config():
    cfg = load()
    new = loader.override(cfg, ["train.lr=0.05"])
    assert new.train.lr == 0.05 and cfg.train.lr != 0.05


@pytest.mark.parametrize(
    "sets,needle",
    [
        (["train.model=vgg"], "lenet, resnet18"),
        (["train.strategy=horovod"], "ddp"),
        (["train.bogus=1"], "Valid keys"),
        (["train.lr=fast"], "expected a number"),
        (["train.lr=0"], "must be > 0"),
        (["train.lr=-0.1"], "must be > 0"),
        (["train.lr=.nan"], "finite"),
        (["train.batch_size=0"], "must be >= 1"),
        (["train.batch_size=-4"], "must be >= 1"),
        (["train.batch_size=2.5"], "expected an integer"),
        (["train.epochs=0"], "must be >= 1"),
        (["train.oversubscribe=maybe"], "true or false"),
        (["data.source=mnist"], "synthetic"),
        (["profile=nope"], "Valid profiles"),
        (["sweep.spaces.ddp.lr=[]"], "empty"),
        (["sweep.spaces.ddp.devices=[0, 2]"], "must be >= 1"),
        (["sweep.spaces.tpu={devices: [1]}"], "unknown strategy"),
        (["train.lr"], "Malformed --set"),
        (["=3"], "Malformed --set"),
    ],
)
def test_invalid_values_are_refused_with_key_and_choices(sets, needle):
    with pytest.raises(loader.ConfigError) as e:
        load(*sets)
    assert needle in str(e.value)
    key = sets[0].split("=")[0]
    if not str(e.value).startswith("Malformed") and not key.startswith("profile"):
        assert key.split(".")[-1] in str(e.value)


def test_unknown_key_in_params_file(tmp_path):
    (tmp_path / "experiments").mkdir()
    (tmp_path / "params.yaml").write_text("profile: ''\ntrain:\n  lrr: 0.1\n")
    with pytest.raises(loader.ConfigError, match="train.lrr"):
        loader.load(tmp_path / "params.yaml", root=tmp_path)


def test_space_union_of_products():
    cfg = load("profile=d2l")
    from pipeline.sweep.space import points

    pts = points(cfg, "dp")
    assert [(p["devices"], p["batch_size"], p["lr"]) for p in pts] == [(1, 256, 0.1), (2, 512, 0.2)]


@pytest.mark.parametrize("sets", [[], ["train.lr=0.1"], ["train.epochs=2", "data.train_limit=100"]])
def test_section_shapes_are_checked_with_or_without_overrides(tmp_path, sets):
    (tmp_path / "experiments").mkdir()
    (tmp_path / "params.yaml").write_text("profile: ''\ntrain: [1, 2]\n")
    with pytest.raises(loader.ConfigError, match=r"`train`.*expected a mapping"):
        loader.load(tmp_path / "params.yaml", sets, root=tmp_path)


def test_non_utf8_params_file_is_refused(tmp_path):
    (tmp_path / "experiments").mkdir()
    (tmp_path / "params.yaml").write_bytes(b"profile: ''\ntrain: {lr: 0.1}  # caf\xe9\n")
    with pytest.raises(loader.ConfigError, match="not UTF-8 text"):
        loader.load(tmp_path / "params.yaml", root=tmp_path)


@pytest.mark.parametrize(
    "sets,needle",
    [
        ([f"train.seed={2**64 + 1}"], "must be <= 4294967295"),
        (["train.timeout_s=1e300"], "must be <= 2592000"),
        (["sweep.trial_timeout_s=1e300"], "must be <= 2592000"),
    ],
)
def test_values_beyond_what_the_libraries_take_are_refused(sets, needle):
    with pytest.raises(loader.ConfigError, match=needle):
        load(*sets)


def test_a_null_in_params_yaml_leaves_the_profiles_value_and_an_override_replaces_it(tmp_path):
    """params.yaml lists keys as null so `dvc exp run -S train.epochs=3` has a key to override: null is "unset"."""
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "p.yaml").write_text("train: {epochs: 4, lr: 0.3}\ndata: {train_limit: 100}\n")
    params = tmp_path / "params.yaml"
    params.write_text("profile: p\ntrain: {epochs: null, lr: 0.05}\ndata: {train_limit: null}\n")
    cfg = loader.load(params, root=tmp_path)
    assert (cfg.train.epochs, cfg.train.lr, cfg.data.train_limit) == (4, 0.05, 100)
    params.write_text("profile: p\ntrain: {epochs: 3}\ndata: {train_limit: null}\n")  # what `-S train.epochs=3` writes
    assert loader.load(params, root=tmp_path).train.epochs == 3


def test_an_explicit_params_file_must_exist_the_default_one_may_not(tmp_path):
    """--params /typo.yaml is refused, not run on the built-in values; only the default params.yaml is optional."""
    (tmp_path / "experiments").mkdir()
    missing = tmp_path / "nonexist.yaml"
    with pytest.raises(loader.ConfigError, match=f"params file {missing} .*does not exist"):
        loader.load(missing, ["profile="], root=tmp_path)
    assert loader.load(None, ["profile=", "train.lr=0.2"], root=tmp_path).train.lr == 0.2  # no params.yaml at the root


@pytest.mark.parametrize("sets", [["train=5", "train.strategy=single"], ["train.lr=0.1", "train.lr.x=2"]])
def test_a_key_set_as_a_value_and_a_section_names_the_option_that_set_the_value(sets):
    """train_cli appends `train.strategy=single` for --strategy: the message quotes the user's own --set."""
    with pytest.raises(loader.ConfigError) as e:
        loader.parse_set(sets)
    assert str(e.value).startswith(f"Malformed --set option {sets[0]!r}")
    assert f"`{sets[1].split('=')[0]}`" in str(e.value) and sets[1] not in str(e.value)


def test_profiles_lists_the_readable_ones_and_names_the_broken_one(tmp_path, monkeypatch, capsys):
    from pipeline.cli import main

    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "ok.yaml").write_text("description: fine\n")
    (tmp_path / "experiments" / "bad.yaml").write_text("description: [unclosed\n")
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    assert main(["profiles"]) == 1  # a broken profile is a failure, but not one that hides the others
    out = capsys.readouterr().out
    assert "ok:\n  fine" in out and "bad:\n  UNREADABLE: " in out and "not valid YAML" in out


def test_outside_the_repository_profiles_and_an_unknown_profile_say_where_they_looked(tmp_path, monkeypatch, capsys):
    from pipeline.cli import main

    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["profiles"]) != 0
    assert f"no experiments/*.yaml under {tmp_path.resolve()}" in " ".join(capsys.readouterr().err.split())
    with pytest.raises(loader.ConfigError, match="run from the Parallax checkout, or set DVC_ROOT"):
        loader.profile_path("cpu", tmp_path)


def test_every_profile_gives_a_new_catalog_row_a_space():
    """A strategy no profile names (a new catalog row) is swept in each profile's `default` space, and the default
    sweep selects it (sweep.strategies: null = every catalog strategy): adding a row needs no profile edit."""
    for name, _ in loader.describe_profiles(REPO):
        cfg = load(f"profile={name}")
        assert cfg.space("new_row") == cfg.sweep.spaces["default"], name
        assert max(s.devices[-1] for s in cfg.space("new_row")) >= 2, name  # it scales, as the others do
    assert set(load().sweep.strategies) == set(loader.STRATEGY_NAMES)


@pytest.mark.parametrize("written, fix", [("1e6", "1.0e+06 or 1000000.0"), ("25e-4", "2.5e-03 or 0.0025")])
def test_a_yaml_exponent_read_as_text_is_refused_with_the_spelling_that_works(tmp_path, written, fix):
    """PyYAML reads YAML 1.1, where 1e6 (no dot, no sign) is a string: the refusal says how to write the number."""
    (tmp_path / "params.yaml").write_text(f"profile: ''\ntrain: {{interference_threshold: {written}}}\n")
    with pytest.raises(loader.ConfigError, match=f"got '{written}' \\(str\\).*write {fix.replace('+', '[+]')}"):
        loader.load(tmp_path / "params.yaml", [], root=tmp_path)
    fixed = fix.split(" or ")[0]
    (tmp_path / "params.yaml").write_text(f"profile: ''\ntrain: {{interference_threshold: {fixed}}}\n")
    assert loader.load(tmp_path / "params.yaml", [], root=tmp_path).train.interference_threshold == float(written)


def _groups(cfg, strategy):
    return [(p.devices, p.batch_size, p.lr, p.optimizer) for p in cfg.space(strategy)]


def test_one_axis_of_a_space_of_groups_applies_to_each_group(tmp_path):
    """`--set 'sweep.spaces.ddp.lr=[0.1]'` over the cpu profile's four ddp groups (B=128, AdamW) sets lr in each of
    them, every group keeping its other axes; `dvc exp run -S` (the axis written into params.yaml) does the same."""
    profile = _groups(load(), "ddp")
    assert len(profile) == 4
    want = [(d, b, (0.1,), o) for d, b, _, o in profile]
    notes: list = []
    by_set = loader.load(REPO / "params.yaml", ["sweep.spaces.ddp.lr=[0.1]"], root=REPO, notes=notes)
    assert _groups(by_set, "ddp") == want
    assert len(notes) == 1 and "each of the 4 group(s) of the `ddp` space (experiments/cpu.yaml)" in notes[0]
    params = tmp_path / "params.yaml"
    params.write_text((REPO / "params.yaml").read_text() + "\n")
    params.write_text(
        params.read_text().replace(
            "  emulated_max_steps: null\n", "  emulated_max_steps: null\n  spaces:\n    ddp: {lr: [0.1]}\n"
        )
    )
    assert _groups(loader.load(params, root=REPO), "ddp") == want
    assert _groups(load("sweep.spaces.default.lr=[0.1,0.3]"), "dp") == [
        (d, b, (0.1, 0.3), o) for d, b, _, o in _groups(load(), "dp")
    ]


def test_an_axis_of_a_strategy_without_a_space_applies_to_the_default_groups_and_a_list_replaces():
    """A strategy without a space of its own runs `default`'s groups: one axis set for it keeps them; a list of
    groups is the whole space and replaces the profile's."""
    default = _groups(load(), "dp")
    assert len(default) == 2
    assert _groups(load("sweep.spaces.dp.batch_size=[64]"), "dp") == [(d, (64,), lr, o) for d, _, lr, o in default]
    whole = load("sweep.spaces.ddp=[{devices: [1], batch_size: [64], lr: [0.1]}]")
    assert _groups(whole, "ddp") == [((1,), (64,), (0.1,), ())]
    assert _groups(loader.override(load(), ["sweep.spaces.ddp.lr=[0.1]"]), "ddp") == [
        (d, b, (0.1,), o) for d, b, _, o in _groups(load(), "ddp")
    ]
