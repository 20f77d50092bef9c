"""Hostile values of what a user can name: paths, config strings, ids and lists. Each is refused before anything
runs with a message naming the value and the fix (or, for an unreadable input, skipped and named), never run
silently, hung on or answered with an "unexpected" error."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from pipeline import preflight
from pipeline.__main__ import main
from pipeline.analysis.tables import rows
from pipeline.config import loader
from pipeline.config.loader import ConfigError
from pipeline.errors import Infeasible, PathError
from pipeline.host.devices import Host


@pytest.fixture
def root(tmp_path):
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "cpu.yaml").write_text("description: the profile\ntrain: {epochs: 1}\n")
    return tmp_path


def test_a_key_written_twice_in_params_yaml_is_refused(root):
    """A second `train:` section silently replaced the first (train.lr lost); now the file is refused, naming the
    key and both lines."""
    (root / "params.yaml").write_text("train:\n  lr: 0.1\ntrain:\n  epochs: 3\n")
    with pytest.raises(ConfigError, match=r"`train` twice.*lines 1 and 3"):
        loader.load(root=root)


def test_a_key_written_twice_in_a_profile_is_refused(root):
    """The same inside a section of a profile: `lr` twice, the first value would be dropped without a word."""
    (root / "experiments" / "cpu.yaml").write_text("train:\n  lr: 0.1\n  lr: 0.3\n")
    with pytest.raises(ConfigError, match=r"`lr` twice"):
        loader.load(root=root)


@pytest.mark.parametrize(
    "key,value",
    [
        ("tracking.experiment", '"   "'),
        ("tracking.experiment", '"a\\nb"'),
        ("data.dir", '"data\\n/x"'),
        ("train.rdzv_id", '"id\\0"'),
        ("tracking.experiment", '" parallax "'),
        ("data.mirror", '"\\tx"'),
    ],
)
def test_a_blank_or_control_character_string_is_refused(root, key, value):
    """In params.yaml, quoted: a blank experiment name (an MLflow experiment no one can see in the list), a newline
    in data.dir (a folder named across two lines), a NUL byte, a tab, or spaces around a name were accepted; now each
    is refused, naming the key."""
    section, name = key.split(".")
    (root / "params.yaml").write_text(f"{section}:\n  {name}: {value}\n")
    with pytest.raises(ConfigError, match=f"`{key}`"):
        loader.load(root=root)


def test_an_ordinary_string_is_still_accepted(root):
    """The check does not refuse the names people use."""
    cfg = loader.load(root=root, overrides=["tracking.experiment=my run 1", "data.dir=data/my set"])
    assert cfg.tracking.experiment == "my run 1" and cfg.data.dir == "data/my set"


def test_data_dir_naming_a_file_is_refused_by_download(root, monkeypatch):
    """`download` with data.dir naming an existing file gave "unexpected NotADirectoryError"; now a PathError that
    names data.dir (exit status 2)."""
    (root / "afile").write_text("x")
    monkeypatch.setenv("DVC_ROOT", str(root))
    monkeypatch.chdir(root)
    assert main(["download", "--set", "data.source=synthetic", "--set", "data.dir=afile"]) == 2
    assert (root / "afile").read_text() == "x"


def test_a_fifo_among_the_sweep_tables_is_skipped_not_waited_on(tmp_path):
    """A FIFO named x.jsonl in --sweeps blocked `analyze` for good, in silence; now it is listed as unreadable."""
    d = tmp_path / "sweeps"
    d.mkdir()
    os.mkfifo(d / "single.jsonl")
    got = {}
    t = threading.Thread(target=lambda: got.update(files=rows.read_sweeps(d, ("single",))[2]), daemon=True)
    t.start()
    t.join(20)
    if t.is_alive():
        with open(d / "single.jsonl", "w"):  # release the reader
            pass
        pytest.fail("the FIFO was waited on")
    assert got["files"]["single"].startswith("unreadable") and "FIFO" in got["files"]["single"]


@pytest.mark.parametrize("special", ["/dev/null", "fifo"])
def test_an_output_file_that_is_a_special_file_is_refused(tmp_path, special):
    """`sweep --out /dev/null` or `collectives --out FIFO` ran first and then replaced the device node with a
    regular file (as root) or failed; now it is refused before anything runs."""
    path = Path(special)
    if special == "fifo":
        path = tmp_path / "fifo"
        os.mkfifo(path)
    with pytest.raises(PathError, match="not a regular file"):
        preflight.output_file(path, "--out")


def test_doctor_dump_events_naming_a_file_is_refused(tmp_path):
    """`doctor --dump-events FILE` ran and printed the file as where the events went; now refused (status 2)."""
    f = tmp_path / "afile"
    f.write_text("x")
    argv = [
        "doctor",
        "--strategies",
        "single",
        "--max-devices",
        "1",
        "--out",
        str(tmp_path / "doc"),
        "--dump-events",
        str(f),
    ]
    assert main(argv) == 2
    assert not (tmp_path / "doc").exists()


def test_doctor_refuses_a_strategy_named_twice(tmp_path):
    """`--strategies single,single` ran every check of `single` twice; now refused (status 2)."""
    argv = ["doctor", "--strategies", "single,single", "--max-devices", "1", "--out", str(tmp_path / "doc")]
    assert main(argv) == 2
    assert not (tmp_path / "doc").exists()


@pytest.mark.parametrize(
    "sets,words",
    [
        (["train.node_rank=2"], "node_rank"),
        (["train.rdzv_endpoint=127.0.0.1:99999"], "port"),
        (["train.rdzv_endpoint=127.0.0.1:0"], "port"),
        (["train.rdzv_endpoint=:29500"], "host"),
        (["train.rdzv_endpoint=nodezero"], "port"),
        (["train.rdzv_id="], "rdzv_id"),
    ],
)
def test_a_multi_node_setting_that_cannot_meet_is_refused(root, sets, words):
    """node_rank >= nnodes waited on a rendezvous that cannot complete and ended in a C++ frame dump; a port above
    65535 gave "unexpected ValueError"; an empty rdzv_id made torch pick a random id, so no two nodes could meet.
    Each is now Infeasible with the key named, before a process starts."""
    from pipeline.trial.launch import check_feasible

    base = ["train.strategy=ddp", "train.devices=2", "train.nnodes=2", "train.rdzv_endpoint=127.0.0.1:29500"]
    cfg = loader.load(root=root, overrides=[*base, *sets])
    with pytest.raises(Infeasible, match=words):
        check_feasible(cfg, Host(kind="cpu", n=2, name="cpu", hostname="h", torch="2", cuda=""))


@pytest.mark.parametrize("key,env", [("tracking.uri", "MLFLOW_TRACKING_URI"), ("sweep.storage", "OPTUNA_STORAGE")])
def test_a_store_url_in_the_environment_that_is_not_used_is_named(tmp_path, monkeypatch, capsys, key, env):
    """MLFLOW_TRACKING_URI or OPTUNA_STORAGE (which `make dashboard` reads) set to a server, and the runs went to the
    local store in silence; now a warning names the variable, the store used and the key to set."""
    monkeypatch.setattr(preflight, "_WARNED", set())
    monkeypatch.setenv(env, "postgresql://user:secret@db.example:5432/runs")
    preflight.check_store(f"sqlite:///{tmp_path / 'x.db'}", key)
    err = capsys.readouterr().err
    assert env in err and f"{key}=" in err.replace("\n", " ") and "secret" not in err
    monkeypatch.setenv(env, f"sqlite:///{tmp_path / 'x.db'}")  # the same store: nothing to say
    monkeypatch.setattr(preflight, "_WARNED", set())
    preflight.check_store(f"sqlite:///{tmp_path / 'x.db'}", key)
    assert env not in capsys.readouterr().err


def test_a_params_file_that_is_a_looping_link_is_named_as_such(tmp_path):
    """--params naming a symbolic link that loops (or leads nowhere) was called a file that "does not exist"; now
    the message says it is a link and where it points."""
    (tmp_path / "a.yaml").symlink_to(tmp_path / "b.yaml")
    (tmp_path / "b.yaml").symlink_to(tmp_path / "a.yaml")
    with pytest.raises(ConfigError, match="symbolic link"):
        loader.load(tmp_path / "a.yaml", root=tmp_path)


@pytest.mark.parametrize("which", ["manifest.json", "FashionMNIST/raw/train-images-idx3-ubyte"])
def test_a_fifo_in_data_dir_is_named_not_waited_on(synthetic_root, tmp_path, which):
    """data.dir holding a FIFO in place of manifest.json or an IDX file blocked `train` for good, in silence; now a
    DataError names the file."""
    import shutil

    from pipeline.data import store
    from pipeline.errors import DataError

    d = tmp_path / "data"
    shutil.copytree(synthetic_root, d)
    (d / which).unlink()
    os.mkfifo(d / which)
    got = {}

    def load():
        try:
            store.load(d, "synthetic", verify=True)
        except DataError as e:
            got["error"] = str(e)

    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(20)
    if t.is_alive():
        with open(d / which, "wb"):  # release the reader
            pass
        pytest.fail("the FIFO was waited on")
    assert "FIFO" in got.get("error", "")
