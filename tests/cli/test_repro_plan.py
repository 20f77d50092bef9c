"""Before DVC starts, the plan is the stages it runs: those `dvc status` lists as changed and every stage downstream of
one of them, in DVC's order; an unchanged stage is left out. On a scratch DVC project of five cheap stages (`cp`,
`cat`, `echo`), against the real `dvc status --json` and the stages a real `dvc repro` then runs.

    .venv/bin/python -m pytest tests/cli/test_repro_plan.py -q
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli import repro_plan

pytest.importorskip("dvc.repo")
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(not (BIN / "dvc").exists(), reason="needs dvc beside the interpreter")

DVC_YAML = """\
stages:
  prepare:
    cmd: cp in.txt prepared.txt
    deps: [in.txt]
    outs: [prepared.txt]
  train:
    foreach: [a, b]
    do:
      cmd: cp prepared.txt trained-${item}.txt
      deps: [prepared.txt]
      outs: ["trained-${item}.txt"]
  report:
    cmd: cat trained-a.txt trained-b.txt > report.txt
    deps: [trained-a.txt, trained-b.txt]
    outs: [report.txt]
  other:
    cmd: echo ${lr} > other.txt
    params: [lr]
    outs: [other.txt]
"""


def _dvc(root: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("DVC_ROOT", "DVC_STAGE", "PARALLAX_STAGE_PLAN")}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", DVC_NO_ANALYTICS="1")
    p = subprocess.run(["dvc", *args], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"dvc {' '.join(args)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout


@pytest.fixture(scope="module")
def ran_once(tmp_path_factory):
    """The scratch project, every stage run once: nothing changed."""
    root = tmp_path_factory.mktemp("ran-once")
    (root / "dvc.yaml").write_text(DVC_YAML)
    (root / "params.yaml").write_text("lr: 0.1\n")
    (root / "in.txt").write_text("one\n")
    _dvc(root, "init", "--no-scm", "-q")
    _dvc(root, "repro", "-q")
    return root


@pytest.fixture
def project(ran_once, tmp_path):
    """A test's own copy of the project that ran once (modification times kept: DVC sees nothing changed)."""
    return Path(shutil.copytree(ran_once, tmp_path / "project"))


def _status(root: Path) -> set[str]:
    return set(json.loads(_dvc(root, "status", "--json")))


@pytest.mark.slow  # two `dvc status` and a `dvc repro`, 2 to 4 s each on a busy 2-core host
def test_an_unchanged_stage_is_left_out_and_every_stage_after_a_changed_one_is_in(project):
    assert repro_plan.plan(project, [], []) == ([], 5)

    (project / "params.yaml").write_text("lr: 0.2\n")
    assert _status(project) == {"other"}
    assert repro_plan.plan(project, [], []) == (["other"], 5)

    (project / "params.yaml").write_text("lr: 0.1\n")
    (project / "in.txt").write_text("two\n")
    assert _status(project) == {"prepare"}  # DVC's status: the stages after it are not changed yet
    planned, looked_at = repro_plan.plan(project, [], [])
    assert set(planned) == {"prepare", "train@a", "train@b", "report"} and looked_at == 5  # `other` left out
    ran = re.findall(r"Running stage '([^']+)'", _dvc(project, "repro"))
    assert planned == ran  # the stages the real `dvc repro` ran, in its order


def test_set_params_count_as_dvc_exp_run_puts_them_and_params_yaml_is_kept(project, monkeypatch, capsys):
    before = (project / "params.yaml").read_bytes()
    assert repro_plan.plan(project, ["lr=0.5"], []) == (["other"], 5)
    assert repro_plan.plan(project, ["params.yaml:lr=0.1"], []) == ([], 5)  # the value it ran with: unchanged
    assert (project / "params.yaml").read_bytes() == before

    (project / "in.txt").write_text("two\n")
    assert repro_plan.plan(project, [], ["train@a"], single_item=True) == ([], 1)  # -s: its input is unchanged yet
    assert repro_plan.plan(project, [], ["report"]) == (["prepare", "train@a", "train@b", "report"], 4)

    monkeypatch.chdir(project)  # the entry points run it in the repository's root
    monkeypatch.delenv("DVC_ROOT", raising=False)
    assert repro_plan.main(["-S", "lr=0.5", "-s", "prepare"]) == 0
    out, err = capsys.readouterr()
    assert out == "prepare\n" and err == "[pipeline] 1 of 1 stage(s) to run\n"
    assert (project / "params.yaml").read_bytes() == before


def test_where_dvc_cannot_say_there_is_no_plan(project, monkeypatch, capsys):
    monkeypatch.chdir(project)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    assert repro_plan.main(["-S", "lr=["]) == 1  # an invalid value: DVC's own error, no plan
    out, err = capsys.readouterr()
    assert out == "" and "no plan of the stages to run" in err and "counts every later stage" in err
    assert (project / "params.yaml").read_text() == "lr: 0.1\n"
