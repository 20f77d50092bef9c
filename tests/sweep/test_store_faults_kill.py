"""Store faults met after a kill or a hand edit: an MLflow experiment deleted in the UI, an artifact folder that
cannot be written, an Optuna store lost mid-sweep, and MLflow runs left RUNNING by a SIGKILLed command. Each is named
before anything runs, or repaired by the next run; none leaves a run RUNNING or ends in a generic error."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline.errors import Stopped, StoreError
from pipeline.sweep import stage
from pipeline.sweep.worker import Worker
from pipeline.tracking import client

ONE_POINT = ["sweep.strategies=[single]", "sweep.spaces.single={devices: [1], batch_size: [64], lr: [0.1]}"]


def test_a_soft_deleted_experiment_is_named_with_how_to_restore_it(make_cfg):
    """An experiment deleted in the MLflow UI (soft-deleted: in its trash) stops the next command before any run
    with a StoreError naming the experiment and the `mlflow experiments restore` command, not MlflowException."""
    cfg = make_cfg()
    tr = client.Tracker(cfg)
    tr.client.delete_experiment(tr.experiment_id)
    with pytest.raises(StoreError, match=r"(?s)deleted.*mlflow experiments restore"):
        client.Tracker(cfg)


def test_an_artifact_folder_that_cannot_be_written_stops_before_the_run(make_cfg, tmp_path):
    """mlruns/artifacts replaced by a file (or made read-only) is named when the tracker opens, before any run is
    created or any trial trained, instead of an 'unexpected PermissionError' after the training."""
    cfg = make_cfg()
    client.Tracker(cfg)
    art = tmp_path / "mlruns" / "artifacts"
    if art.is_dir():
        art.rmdir()
    art.write_text("not a folder")
    with pytest.raises(StoreError, match="artifact"):
        client.Tracker(cfg)


def test_an_optuna_store_lost_mid_sweep_still_ends_the_parent_run(make_cfg, tmp_path, monkeypatch):
    """The Optuna store deleted while a trial runs: the sweep stops with Stopped, and its MLflow parent run is
    ended FAILED, not left RUNNING (the lost store cannot say whether another worker is still on the study)."""
    cfg = make_cfg(*ONE_POINT)

    def unanswered(study):
        raise RuntimeError("no such table: trials")  # what the lost store answers every later query

    def lose_the_store(*a, **k):
        (tmp_path / "mlruns" / "optuna.db").unlink()
        monkeypatch.setattr(stage.claims, "running", unanswered)
        raise RuntimeError("the store went away")

    monkeypatch.setattr(Worker, "run_one", lose_the_store)
    with pytest.raises(Stopped):
        stage.run_sweep(cfg, "single", tmp_path / "single.jsonl")
    (parent,) = client.Tracker(cfg).find_runs("tags.role = 'study' and tags.strategy = 'single'")
    assert parent.info.status == "FAILED"


_KILLED = """
import os, sys
from pipeline.config import loader
from pipeline.tracking import client
cfg = loader.load(None, sys.argv[1:])
tr = client.Tracker(cfg)
print(tr.start_run("train lenet", {"stage": "train"}), flush=True)
os._exit(9)  # as after SIGKILL: nothing ends the run
"""


def test_a_run_left_running_by_a_killed_command_is_ended_by_the_next(make_cfg, tmp_path):
    """A command killed while its MLflow run is open (train, analyze) leaves it RUNNING; the next command on this
    host that opens the store ends it KILLED with a tag saying why, and keeps the runs of live processes RUNNING."""
    cfg = make_cfg()
    tr = client.Tracker(cfg)
    live = tr.start_run("live", {"stage": "train"})
    args = ["profile=", "data.source=synthetic", f"data.dir={cfg.data.dir}"]
    out = subprocess.run(
        [sys.executable, "-c", _KILLED, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    dead = out.stdout.strip()
    assert dead, out.stderr
    assert tr.client.get_run(dead).info.status == "RUNNING"
    client.Tracker(cfg)
    run = tr.client.get_run(dead)
    assert run.info.status == "KILLED" and "died" in run.data.tags.get("parallax.ended_by", "")
    assert tr.client.get_run(live).info.status == "RUNNING"


def test_a_second_ctrl_c_during_a_trial_teardown_is_an_interruption(make_cfg, tmp_path, monkeypatch):
    """A second Ctrl-C that reaches the sweep while the elastic launcher tears a trial down arrives as torch's
    SignalException, not KeyboardInterrupt: it still ends the sweep as interrupted (exit 130), the trial's MLflow
    run KILLED and the trial enqueued again, never as a fault 'Fix the cause (free disk space ...)'."""
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException

    from pipeline.errors import Interrupted

    cfg = make_cfg(*ONE_POINT)

    def second_ctrl_c(*a, **k):
        raise SignalException("Process 1 got signal: 2", sigval=signal.SIGINT)

    monkeypatch.setattr("pipeline.trial.launch.run_trial", second_ctrl_c)  # the local runner looks it up there
    with pytest.raises(Interrupted) as e:
        stage.run_sweep(cfg, "single", tmp_path / "single.jsonl")
    assert e.value.signum == signal.SIGINT
    runs = {r.info.run_name: r.info.status for r in client.Tracker(cfg).find_runs("attributes.status != ''")}
    assert runs == {f"study single · {client.pipeline_run()}": "KILLED", "single k=1 B=64 lr=0.1": "KILLED"}


def test_a_study_parent_run_is_not_ended_for_the_worker_that_opened_it(make_cfg, tmp_path):
    """A study's parent run is shared by every worker of the study (the one that opened it may exit while others
    run): it carries no owner process, so a later command never ends it as orphaned; its trial runs do."""
    cfg = make_cfg(*ONE_POINT)
    stage.run_sweep(cfg, "single", tmp_path / "single.jsonl", max_new_trials=0)
    (parent,) = client.Tracker(cfg).find_runs("tags.role = 'study' and tags.strategy = 'single'")
    assert parent.info.status == "RUNNING" and "parallax.pid" not in parent.data.tags
