"""`make pipeline-offline` leaves params.yaml as it found it: `dvc exp run -S data.source=synthetic` writes the value
into the workspace's params.yaml, and the recipe puts the file back byte for byte, after a run that succeeds and after
one that fails, so the README's next command (`make test`) and a later `make pipeline` see the project's settings.
Each entry point (`make pipeline` too) first asks which stages DVC runs, with the arguments it gives DVC, and hands
the answer to the stages. DVC and that question are stand-ins here (DVC rewrites params.yaml as DVC does); the whole
pipeline runs in tests/e2e, the question on a real DVC project in tests/cli/test_repro_plan.py."""

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
# stands in for DVC: keeps its arguments, one a line, and the plan its stages get; writes the -S value into params.yaml
# as DVC does
printf '%s\\n' "$@" > dvc-argv
printf '%s' "${PARALLAX_STAGE_PLAN-unset}" > dvc-plan
sed -i 's/source: fashion-mnist/source: synthetic/' params.yaml
"""
# stands in for the venv's python running `-m pipeline.cli.repro_plan ARGS`: keeps its arguments, prints a plan
PLANNING_PYTHON = """#!/bin/sh
printf '%s\\n' "$@" > plan-argv
{body}
"""


def _make(tmp_path, *args, planner: str | None = None):
    for f in ("Makefile", "params.yaml"):
        shutil.copy2(REPO / f, tmp_path / f)
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "dvc").write_text(RECORDING_DVC)
    (bin_dir / "dvc").chmod(0o755)
    if planner is not None:  # the Makefile's $(BIN)/python
        (tmp_path / ".venv" / "bin").mkdir(parents=True, exist_ok=True)
        (tmp_path / ".venv" / "bin" / "python").write_text(PLANNING_PYTHON.format(body=planner))
        (tmp_path / ".venv" / "bin" / "python").chmod(0o755)
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


@pytest.mark.skipif(not shutil.which("make"), reason="needs make")
@pytest.mark.parametrize(
    "target, dvc_args",
    [
        (["pipeline"], ["repro"]),
        (["pipeline-offline"], ["exp", "run", "-S", "data.source=synthetic"]),
        (["stage-offline", "STAGE=sweep@ddp"], ["exp", "run", "-S", "data.source=synthetic", "-s", "sweep@ddp"]),
    ],
)
def test_each_entry_point_plans_with_dvcs_arguments_and_hands_the_plan_to_the_stages(tmp_path, target, dvc_args):
    """The entry point asks pipeline/cli/repro_plan.py which stages DVC runs, with the arguments it then gives DVC,
    and DVC (so each stage it runs) gets the answer in $PARALLAX_STAGE_PLAN."""
    p = _make(tmp_path, *target, planner="echo 'sweep@ddp,analyze'")
    assert p.returncode == 0, p.stdout + p.stderr
    dvc_argv = (tmp_path / "dvc-argv").read_text().splitlines()
    assert dvc_argv == dvc_args, dvc_argv
    plan_argv = (tmp_path / "plan-argv").read_text().splitlines()
    assert plan_argv == ["-m", "pipeline.cli.repro_plan", *dvc_args[2 if dvc_args[0] == "exp" else 1 :]], plan_argv
    assert (tmp_path / "dvc-plan").read_text() == "sweep@ddp,analyze"


@pytest.mark.skipif(not shutil.which("make"), reason="needs make")
def test_where_no_plan_comes_the_pipeline_runs_without_one(tmp_path):
    p = _make(tmp_path, "pipeline-offline", planner="echo 'half a plan'; exit 1")
    assert p.returncode == 0, p.stdout + p.stderr
    assert (tmp_path / "dvc-argv").exists() and (tmp_path / "dvc-plan").read_text() == "unset"
