"""A stage run by DVC says its place in the run and the rest's ETA from this host's last run of each stage: among the
stages DVC runs where the entry point planned them ($PARALLAX_STAGE_PLAN), else among every stage of the pipeline,
saying so. It keeps its own wall time when it succeeds; outside DVC, or when it fails, it says and keeps nothing.

    .venv/bin/python -m pytest tests/cli/test_stage_progress.py -q
"""

from __future__ import annotations

import json
import socket

import pytest
import yaml

from pipeline import lifeline
from pipeline.cli import commands, stage_progress

from ..conftest import REPO

DVC_YAML = {
    "stages": {
        "download": {"cmd": "python -m pipeline download"},
        "sweep": {"foreach": ["single", "ddp"], "do": {"cmd": "python -m pipeline sweep --strategy ${item}"}},
        "analyze": {"cmd": "python -m pipeline analyze"},
        "profiles": {"cmd": "python -m pipeline profiles"},
    }
}
NAMES = ["download", "sweep@single", "sweep@ddp", "analyze", "profiles"]


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A checkout with DVC_YAML, run as DVC runs a stage there (its own store root)."""
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(DVC_YAML, sort_keys=False))
    (tmp_path / "params.yaml").write_text("sweep: {strategies: [ddp]}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.delenv("DVC_STAGE", raising=False)
    monkeypatch.delenv(stage_progress.PLAN_ENV, raising=False)
    monkeypatch.setattr(lifeline, "runner", lambda: None)  # no DVC process to watch over the test
    return tmp_path


def _times(root, **stages):
    path = root / "runs" / "stage_times.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({socket.gethostname(): stages, "another-host": {"analyze": 9999}}))
    return path


def test_the_stage_list_expands_foreach_and_matrix_as_dvc_names_them():
    assert stage_progress.stage_names(DVC_YAML, {}) == NAMES
    from_params = {"stages": {"sweep": {"foreach": "${sweep.strategies}", "do": {"cmd": "x"}}, "end": {"cmd": "y"}}}
    assert stage_progress.stage_names(from_params, {"sweep": {"strategies": ["zero1", "fsdp"]}}) == [
        "sweep@zero1",
        "sweep@fsdp",
        "end",
    ]
    assert stage_progress.stage_names(from_params, {}) is None  # unresolvable here: no position rather than a wrong one
    matrix = {"stages": {"t": {"matrix": {"s": ["a", "b"], "k": [1, 2]}, "cmd": "x"}}}
    assert stage_progress.stage_names(matrix, {}) == ["t@a-1", "t@a-2", "t@b-1", "t@b-2"]


def test_the_project_order_is_the_one_dvc_plans():
    """Reading dvc.yaml gives the order `dvc repro` runs this project's stages in (DVC's own plan, about a second
    slower to ask for in every stage)."""
    dvc_repo = pytest.importorskip("dvc.repo")
    from dvc.repo.reproduce import plan_repro

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    with dvc_repo.Repo(str(REPO)) as repo:
        planned = [s.addressing for s in plan_repro(repo.index.graph)]
    assert stage_progress.stage_names(yaml.safe_load((REPO / "dvc.yaml").read_text()), params) == planned


def test_without_a_plan_a_stage_counts_every_later_stage_and_says_so(project, monkeypatch, capsys):
    _times(project, download=5, **{"sweep@single": 100, "sweep@ddp": 400, "analyze": 50, "profiles": 10})
    monkeypatch.setenv("DVC_STAGE", "sweep@ddp")
    stage_progress.begin("sweep")
    err = capsys.readouterr().err
    assert err == (
        "[pipeline] stage 3/5: sweep@ddp (ETA for the rest of the pipeline: about 8 min, from this host's last run "
        "of each stage; it counts every later stage, those DVC skips as unchanged too)\n"
    )


def test_with_a_plan_a_stage_counts_only_the_planned_stages(project, monkeypatch, capsys):
    """The plan names sweep@single and analyze: the position is among those two, and the ETA is their 150 s, not the
    560 s of every stage from sweep@single on (sweep@ddp's 400 s among them, unchanged and skipped)."""
    _times(project, download=5, **{"sweep@single": 100, "sweep@ddp": 400, "analyze": 50, "profiles": 10})
    monkeypatch.setenv(stage_progress.PLAN_ENV, "sweep@single,analyze")
    monkeypatch.setenv("DVC_STAGE", "sweep@single")
    stage_progress.begin("sweep")
    monkeypatch.setenv("DVC_STAGE", "analyze")
    stage_progress.begin("analyze")
    assert capsys.readouterr().err.splitlines() == [
        "[pipeline] stage 1/2 of this run (DVC skips the other 3 of 5 stages): sweep@single (ETA for the rest of "
        "this run: about 2 min, from this host's last run of each of its stages)",
        "[pipeline] stage 2/2 of this run (DVC skips the other 3 of 5 stages): analyze (ETA for the rest of this "
        "run: about 50 s, from this host's last run of each of its stages)",
    ]


def test_with_a_plan_only_the_planned_stages_need_a_recorded_time(project, monkeypatch, capsys):
    _times(project, **{"sweep@ddp": 400})  # nothing recorded for download, sweep@single and analyze
    monkeypatch.setenv(stage_progress.PLAN_ENV, "sweep@ddp")
    monkeypatch.setenv("DVC_STAGE", "sweep@ddp")
    stage_progress.begin("sweep")
    assert "stage 1/1 of this run" in (err := capsys.readouterr().err) and "about 7 min" in err, err
    monkeypatch.setenv(stage_progress.PLAN_ENV, "sweep@ddp,analyze")
    stage_progress.begin("sweep")
    assert "stage 1/2 of this run" in (err := capsys.readouterr().err) and stage_progress.UNKNOWN_ETA in err, err


@pytest.mark.parametrize("plan", ["sweep@ddp,analyze", ""])
def test_a_stage_the_plan_leaves_out_counts_every_later_stage(project, monkeypatch, capsys, plan):
    """DVC runs a stage its plan did not name (the plan is another run's, or DVC found a change after it was made):
    the line falls back to the whole pipeline rather than a position the plan cannot give."""
    _times(project, download=5, **{"sweep@single": 100, "sweep@ddp": 400, "analyze": 50, "profiles": 10})
    monkeypatch.setenv(stage_progress.PLAN_ENV, plan)
    monkeypatch.setenv("DVC_STAGE", "sweep@single")
    stage_progress.begin("sweep")
    err = capsys.readouterr().err
    assert err.startswith("[pipeline] stage 2/5: sweep@single (ETA for the rest of the pipeline: about 9 min"), err
    assert "it counts every later stage" in err


def test_without_a_recorded_time_for_a_later_stage_the_eta_is_not_known(project, monkeypatch, capsys):
    _times(project, download=5, **{"sweep@single": 100, "sweep@ddp": 400, "profiles": 10})  # analyze: never ran here
    monkeypatch.setenv("DVC_STAGE", "sweep@single")
    stage_progress.begin("sweep")
    err = capsys.readouterr().err
    assert err == "[pipeline] stage 2/5: sweep@single (ETA: not known until each stage has run once on this host)\n"
    assert not any(ch.isdigit() for ch in err.split("(", 1)[1])  # no number invented


def test_outside_dvc_or_in_a_helper_nothing_is_said_or_kept(project, monkeypatch, capsys):
    assert stage_progress.begin("sweep") is stage_progress.OFF  # DVC_STAGE unset: a stand-alone command
    assert commands.main(["profiles"]) == 2  # no experiments/ here: the command fails, and says only that
    monkeypatch.setenv("DVC_STAGE", "sweep@ddp")
    assert stage_progress.begin("train") is stage_progress.OFF  # a process the stage started, not the stage
    assert "[pipeline]" not in capsys.readouterr().err
    assert not (project / "runs").exists()


def test_a_stage_keeps_its_wall_time_only_when_it_succeeds(project, monkeypatch, capsys):
    monkeypatch.setenv("DVC_STAGE", "profiles")
    assert commands.main(["profiles"]) == 2  # no experiments/*.yaml: the stage fails
    assert "stage 5/5: profiles" in capsys.readouterr().err
    assert not (project / "runs" / "stage_times.json").exists()

    (project / "experiments").mkdir()
    (project / "experiments" / "tiny.yaml").write_text("description: small\n")
    path = _times(project, download=5)
    ticks = iter([100.0, 107.5])  # the stage's clock: its start, its end
    begin = stage_progress.begin
    monkeypatch.setattr(stage_progress, "begin", lambda command: begin(command, clock=lambda: next(ticks)))
    assert commands.main(["profiles"]) == 0
    kept = json.loads(path.read_text())
    assert set(kept[socket.gethostname()]) == {"download", "profiles"} and kept["another-host"] == {"analyze": 9999}
    assert kept[socket.gethostname()]["profiles"] == 7.5  # the stage's own start to end, as its clock read them
    assert [p.name for p in path.parent.iterdir()] == ["stage_times.json"]  # the temporary file renamed over it


def test_durations_read_as_a_person_says_them():
    assert stage_progress.duration(0.2) == "about 1 s"
    assert stage_progress.duration(45) == "about 45 s"
    assert stage_progress.duration(12 * 60) == "about 12 min"
    assert stage_progress.duration(3 * 3600) == "about 3.0 h"
