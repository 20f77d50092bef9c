"""Every benchmark's numeric flag refuses, before anything runs, a value that measures nothing or prints nan: 0 or
negative rounds, images, batches and steps; nan, inf, 0 or negative seconds and tolerances (exit 2, the flag named)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from pipeline.cli import types
from tests.conftest import REPO


@pytest.mark.parametrize("text", ["0", "-2", "nan", "1.5", ""])
def test_a_count_is_a_whole_number_from_one(text):
    with pytest.raises(argparse.ArgumentTypeError, match="rounds"):
        types.count("rounds")(text)
    assert types.count("rounds")("3") == 3


def test_a_count_with_a_ceiling_names_it():
    with pytest.raises(argparse.ArgumentTypeError, match="from 1 to 1,024"):
        types.count("devices", hi=1024)("99999999")
    with pytest.raises(argparse.ArgumentTypeError, match="device counts"):
        types.counts("device counts", hi=1024)("1,0")
    with pytest.raises(argparse.ArgumentTypeError, match="no device counts"):
        types.counts("device counts")(",")
    assert types.counts("device counts")("1, 2") == [1, 2]


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e400", "0", "-1", "x"])
def test_seconds_are_finite_and_above_zero(text):
    with pytest.raises(argparse.ArgumentTypeError, match="seconds per trial"):
        types.positive("seconds per trial")(text)
    assert types.positive("seconds per trial")("2.5") == 2.5


@pytest.mark.parametrize(
    "script, flags",
    [
        ("benchmarks.gpu.gpu_epoch", ["--rounds", "0"]),
        ("benchmarks.gpu.gpu_epoch", ["--images", "nan"]),
        ("benchmarks.gpu.gpu_epoch", ["--batch", "-5"]),
        ("benchmarks.gpu.gpu_first_run", ["--dry-run", "--trial-s", "nan"]),
        ("benchmarks.gpu.gpu_first_run", ["--dry-run", "--budget-s", "inf"]),
        ("benchmarks.speed.fsdp_layout", ["--rounds", "0"]),
        ("benchmarks.speed.mfu", ["--batch", "0"]),
        ("benchmarks.scaling.model_check", ["--tolerance", "nan"]),
        ("benchmarks.memory.model_check", ["--ks", "0,2"]),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_each_benchmark_refuses_a_meaningless_flag(script, flags, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        p = subprocess.run(
            [sys.executable, "-m", script, *flags], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{script} {' '.join(flags)} ran instead of refusing the flag")
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    assert f"argument {flags[-2]}" in p.stderr and "Nothing was run" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and not p.stdout.strip(), p.stdout + p.stderr
