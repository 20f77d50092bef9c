"""Values that would exhaust memory or time, or run silently on something other than what was meant, are refused
before any work with a message that names the setting (or environment variable, or file) and says why: upper
bounds with their reason, empty and duplicated lists, odd environment values, names and paths too long for the
stores and file systems that take them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline import preflight
from pipeline.config import loader
from pipeline.env import env_number
from pipeline.errors import StoreError
from tests.conftest import REPO

LONG = "x" * 300  # longer than the 255 bytes a file system allows for one name


def load(*sets):
    return loader.load(REPO / "params.yaml", list(sets), root=REPO)


@pytest.mark.parametrize(
    "setting,needle",
    [
        ("sweep.repeats=1000000000", "enqueued"),
        ("overlap.items=1000000000", "memory"),
        ("overlap.chain=1000000000", "memory"),
        ("overlap.reps=1000000000", "timed"),
        ("overlap.warmup=1000000000", "timed"),
        ("collectives.reps=1000000000", "timed"),
        ("collectives.fit_sizes=40", "memory"),
        ("collectives.gap_s=1000000", "computes"),
        ("train.devices=1000000", "process"),
        ("sweep.spaces.ddp.devices=[2, 1000000]", "process"),
        ("slurm.time_limit_min=1000000000", "30 days"),
        (
            "sweep.spaces.single={lr: "
            + str([0.1 + i for i in range(400)])
            + ", batch_size: "
            + str(list(range(1, 301)))
            + "}",
            "120000 points",
        ),
    ],
)
def test_a_huge_value_is_refused_with_its_reason(setting, needle):
    with pytest.raises(loader.ConfigError) as e:
        load(setting)
    msg = " ".join(str(e.value).split())
    assert setting.split("=")[0].split(".")[-1] in msg and needle in msg, msg


def test_repeats_times_points_is_bounded():
    space = "sweep.spaces.single={lr: " + str([0.1 + i for i in range(2000)]) + "}"
    with pytest.raises(loader.ConfigError) as e:
        load(space, "sweep.repeats=100")
    msg = " ".join(str(e.value).split())
    assert "sweep.repeats" in msg and "trials, at most 100000" in msg, msg
    assert load(space, "sweep.repeats=20").sweep.repeats == 20


def test_the_bounds_leave_the_shipped_profiles_alone():
    for profile in ("cpu", "gpu", "d2l", "cpu-comm", "slurm"):
        load(f"profile={profile}")
    assert load("sweep.repeats=100").sweep.repeats == 100


def test_an_empty_space_is_refused_like_an_empty_list():
    with pytest.raises(loader.ConfigError) as e:
        load("sweep.spaces.single=[]")
    assert "sweep.spaces.single" in str(e.value) and "empty" in str(e.value), str(e.value)


def test_a_strategy_listed_twice_is_refused():
    with pytest.raises(loader.ConfigError) as e:
        load("sweep.strategies=[single, ddp, single]")
    msg = " ".join(str(e.value).split())
    assert "sweep.strategies" in msg and "`single` more than once" in msg, msg


@pytest.mark.parametrize(
    "setting,needle",
    [
        (f"tracking.experiment={LONG}", "256"),
        (f"train.rdzv_id={LONG}", "characters"),
        (f"data.dir={LONG}", "255 bytes"),
        (f"data.dir=a/{'b/' * 2100}c", "4096"),
    ],
)
def test_a_name_or_path_too_long_is_refused(setting, needle):
    with pytest.raises(loader.ConfigError) as e:
        load(setting)
    msg = " ".join(str(e.value).split())
    assert setting.split("=")[0] in msg and needle in msg and "Traceback" not in msg, msg
    assert len(msg) < 1500, msg  # the message shortens the path it names


def test_a_profile_name_too_long_is_refused(tmp_path):
    (tmp_path / "experiments").mkdir()
    with pytest.raises(loader.ConfigError) as e:
        loader.load(None, [f"profile={'p' * 300}"], root=tmp_path)
    assert "profile" in str(e.value) and "characters" in str(e.value), str(e.value)


@pytest.mark.parametrize("call", [preflight.output_dir, preflight.output_file, preflight.input_dir])
def test_an_output_path_too_long_is_refused_naming_the_option(tmp_path, call):
    args = ("the sweep tables",) if call is preflight.input_dir else ()
    with pytest.raises(Exception) as e:  # the type is checked below: the unchanged code raised OSError
        call(tmp_path / LONG / "x", "--out", *args)
    msg = " ".join(str(e.value).split())
    assert type(e.value).__name__ in ("PathError", "DataError"), repr(e.value)
    assert "--out" in msg and "255 bytes" in msg, msg


def test_a_sqlite_store_path_too_long_is_refused(tmp_path):
    with pytest.raises(StoreError) as e:
        preflight.check_store(f"sqlite:///{tmp_path / LONG}.db", "sweep.storage")
    assert "sweep.storage" in str(e.value) and "255 bytes" in str(e.value), str(e.value)


@pytest.mark.parametrize("option", ["--out", "--sweeps", "--params"])
def test_the_cli_names_a_long_path_option(tmp_path, capsys, option):
    from pipeline.cli import main

    argv = {"--out": str(tmp_path), "--sweeps": str(tmp_path)}
    argv[option] = str(tmp_path / LONG)
    try:
        code = main(["analyze", *(x for kv in argv.items() for x in kv)])
    except SystemExit as e:  # argparse's own refusal
        code = e.code
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "unexpected" not in err and option in err and "255 bytes" in err, err


# ----------------------------------------------------------------------------- environment variables


@pytest.mark.parametrize(
    "name,value",
    [
        ("PARALLAX_GRACE_S", ""),
        ("PARALLAX_GRACE_S", "abc"),
        ("PARALLAX_GRACE_S", "1e400"),
        ("PARALLAX_GRACE_S", "-5"),
        ("PARALLAX_STORE_TIMEOUT_S", ""),
        ("PARALLAX_STORE_TIMEOUT_S", "nan"),
        ("PARALLAX_PREFLIGHT_TIMEOUT_S", "abc"),
        ("PARALLAX_PREFLIGHT_TIMEOUT_S", "0"),
    ],
)
def test_an_odd_environment_value_is_refused_naming_the_variable(name, value):
    with pytest.raises(loader.ConfigError) as e:
        env_number(
            name,
            20,
            lo=0,
            hi=loader.TIMEOUT_MAX_S,
            what="a wait",
            lo_open=name.endswith("PREFLIGHT_TIMEOUT_S"),
            environ={name: value},
        )
    msg = " ".join(str(e.value).split())
    assert f"{name}={value!r}" in msg and "unset" in msg, msg


def test_a_sane_environment_value_is_read():
    assert env_number("PARALLAX_GRACE_S", 20, lo=0, hi=100, what="a wait", environ={}) == 20
    assert env_number("PARALLAX_GRACE_S", 20, lo=0, hi=100, what="a wait", environ={"PARALLAX_GRACE_S": " 8 "}) == 8


@pytest.mark.parametrize(
    "name,value",
    [("PARALLAX_GRACE_S", ""), ("PARALLAX_STORE_TIMEOUT_S", "abc"), ("PARALLAX_PREFLIGHT_TIMEOUT_S", "-1")],
)
def test_the_command_refuses_it_in_one_line(tmp_path, name, value):
    """A sweep that runs trials (its configuration loads, its strategy selected) refuses the variable in one line."""
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "cpu.yaml").write_text((REPO / "experiments" / "cpu.yaml").read_text())
    env = {**os.environ, "PYTHONPATH": str(REPO), "DVC_ROOT": str(tmp_path), name: value}
    p = subprocess.run(
        [sys.executable, "-m", "pipeline", "sweep", "--strategy", "single"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    err = " ".join(p.stderr.split())
    assert p.returncode == 2 and "unexpected" not in err and "Traceback" not in err, err
    assert f"{name}={value!r}" in err, err
