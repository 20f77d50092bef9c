"""`make pipeline-offline` leaves params.yaml as it found it: `dvc exp run -S data.source=synthetic` writes the value
into the workspace's params.yaml, and the recipe puts the file back byte for byte, after a run that succeeds and after
one that fails, so the README's next command (`make test`) and a later `make pipeline` see the project's settings.
DVC is a stand-in here that rewrites params.yaml as DVC does; the whole pipeline runs in tests/e2e."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.project import REPO

FAKE_DVC = """#!/bin/sh
# stands in for `dvc exp run -S data.source=synthetic`: the value lands in params.yaml, as DVC writes it
sed -i 's/source: fashion-mnist/source: synthetic/' params.yaml
exit {rc}
"""


@pytest.mark.skipif(not shutil.which("make"), reason="needs make")
@pytest.mark.parametrize("rc", [0, 1])
def test_the_offline_recipe_puts_params_yaml_back_as_it_was(tmp_path, rc):
    for f in ("Makefile", "params.yaml"):
        shutil.copy2(REPO / f, tmp_path / f)
    before = (tmp_path / "params.yaml").read_bytes()
    assert b"source: fashion-mnist" in before
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    (bin_dir / "dvc").write_text(FAKE_DVC.format(rc=rc))
    (bin_dir / "dvc").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    p = subprocess.run(
        ["make", "-o", "setup", "-o", ".venv/.installed", "pipeline-offline"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (p.returncode == 0) == (rc == 0), p.stdout + p.stderr
    assert (tmp_path / "params.yaml").read_bytes() == before
    if rc == 0:
        assert "params.yaml is as it was" in p.stdout


RECORDING_DVC = """#!/bin/sh
# stands in for DVC: keeps its arguments, one a line, and writes the -S value into params.yaml as DVC does
printf '%s\\n' "$@" > dvc-argv
sed -i 's/source: fashion-mnist/source: synthetic/' params.yaml
"""


def _make(tmp_path, *args):
    for f in ("Makefile", "params.yaml"):
        shutil.copy2(REPO / f, tmp_path / f)
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "dvc").write_text(RECORDING_DVC)
    (bin_dir / "dvc").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        ["make", "-o", "setup", "-o", ".venv/.installed", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.skipif(not shutil.which("make"), reason="needs make")
def test_one_stage_reruns_offline_on_the_synthetic_stand_in(tmp_path):
    """`make stage-offline STAGE=...` is `dvc exp run -S data.source=synthetic -s STAGE` (the synthetic source the
    offline pipeline ran with, so the stage is not rerun for the real data), with params.yaml put back afterwards."""
    before = (REPO / "params.yaml").read_bytes()
    p = _make(tmp_path, "stage-offline", "STAGE=sweep@ddp")
    assert p.returncode == 0, p.stdout + p.stderr
    argv = (tmp_path / "dvc-argv").read_text().splitlines()
    assert argv == ["exp", "run", "-S", "data.source=synthetic", "-s", "sweep@ddp"], argv
    assert (tmp_path / "params.yaml").read_bytes() == before
    assert "params.yaml is as it was" in p.stdout


@pytest.mark.skipif(not shutil.which("make"), reason="needs make")
def test_one_stage_offline_without_a_stage_says_how_to_name_one(tmp_path):
    p = _make(tmp_path, "stage-offline")
    assert p.returncode != 0 and not (tmp_path / "dvc-argv").exists()
    assert "make stage-offline STAGE='sweep@ddp'" in p.stderr and "make pipeline-offline" in p.stderr, p.stderr
