"""SLURM trials against fake programs (no cluster): `scontrol` and `scancel` are scripts on PATH that log their
calls and answer as told, and the job is submitted through a fake executor, so the login node's side of slurm.py
(Runner: wait, epochs, outcome) and the sweep's handling of it run as they would against a real controller.

- a controller that stays unreachable beyond slurm.UNREACHABLE_S: the job is cancelled and the trial is the
  cluster's failure, enqueued again and the sweep stopped, never a lost point;
- an earlier trial's progress.jsonl in a reused trial folder is never replayed as the new trial's epoch;
- `sbatch` that cannot submit: the cluster's fault, said as such, not a full disk's or a store's.

    .venv/bin/python -m pytest tests/sweep/test_slurm_fakes.py
"""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from optuna.trial import TrialState

from pipeline.cli import main
from pipeline.config import loader
from pipeline.errors import TrialFailed
from pipeline.sweep import slurm
from pipeline.sweep.stage import load_study

from . import test_faults
from .test_faults import _runs

repo = test_faults.repo  # the fixture

UNREACHABLE = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"


def _programs(tmp_path, monkeypatch, answers: list[str]) -> Path:
    """Fake scontrol and scancel on PATH; each call is a line of calls.log. scontrol's answers are taken in turn
    (the last one repeats): `!text` fails with exit 1 and text on stderr, anything else is printed."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    (tmp_path / "answers.json").write_text(json.dumps(answers))
    scontrol = f"""#!/usr/bin/env python3
import json, sys
log, answers = {str(log)!r}, json.load(open({str(tmp_path / "answers.json")!r}))
with open(log, "a") as f:
    f.write("scontrol " + " ".join(sys.argv[1:]) + "\\n")
n = sum(1 for line in open(log) if line.startswith("scontrol show job"))
answer = answers[min(n, len(answers)) - 1]
if answer.startswith("!"):
    print(answer[1:], file=sys.stderr)
    sys.exit(1)
print(answer)
"""
    scancel = f"""#!/bin/sh
echo "scancel $*" >> {str(log)!r}
"""
    for name, text in (("scontrol", scontrol), ("scancel", scancel)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod((bin_dir / name).stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    return log


class _Job:
    """What Runner reads of a submitit job: its id, its tasks' result files and results."""

    def __init__(self, folder: Path, result=None):
        self.job_id, self._sub_jobs, self._result = "4242", [], result
        pickle = folder / "4242_result.pkl"
        if result is not None:
            folder.mkdir(parents=True, exist_ok=True)
            pickle.write_bytes(b"")
        self.paths = SimpleNamespace(result_pickle=pickle, stderr=folder / "4242.err")

    def result(self):
        return self._result


def _executor(monkeypatch, result=None):
    def executor(self, folder, nodes, label):
        return SimpleNamespace(submit=lambda fn, *args: _Job(Path(folder), result))

    monkeypatch.setattr(slurm.Runner, "executor", executor)


def _scfg(**kw):
    return SimpleNamespace(
        **{"partition": "main", "devices_per_node": 2, "device": "cpu", "poll_s": 0.1, "time_limit_min": 10, **kw}
    )


def _tcfg():
    return SimpleNamespace(train=SimpleNamespace(devices=1))


@pytest.mark.timeout(120)
def _trial(out_dir: Path, on_epoch=lambda record: False):
    """What SLURM's runner reads of a lifecycle.Trial."""
    how = SimpleNamespace(timeout_s=None)
    return SimpleNamespace(
        cfg=_tcfg(), out_dir=out_dir, epoch_ended=on_epoch, label="trial 1/2", how=how, note=lambda attrs: None
    )


def test_an_unreachable_controller_cancels_the_job_and_fails_as_the_clusters_fault(tmp_path, monkeypatch):
    """Proves: `scontrol show job` failing for longer than slurm.UNREACHABLE_S ends the wait with kind
    `slurm_unreachable` (the cluster's fault, which the sweep enqueues again), says that scontrol failed and how, and
    sends scancel for the job (it may still run)."""
    log = _programs(tmp_path, monkeypatch, ["!" + UNREACHABLE])
    _executor(monkeypatch)
    monkeypatch.setattr(slurm, "UNREACHABLE_S", 1.0, raising=False)
    monkeypatch.setattr(slurm, "with_train", lambda tcfg, **kw: tcfg)
    with pytest.raises(TrialFailed) as e:
        slurm.Runner(_scfg())(_trial(tmp_path / "trial"))
    assert e.value.kind == "slurm_unreachable", (e.value.kind, str(e.value))
    assert "scontrol" in str(e.value) and "Unable to contact slurm controller" in str(e.value), str(e.value)
    calls = log.read_text().splitlines()
    assert calls.count("scancel 4242") == 1, calls


@pytest.mark.timeout(120)
def test_a_stale_progress_file_in_a_reused_trial_folder_is_never_replayed(tmp_path, monkeypatch):
    """Proves: an earlier trial's node0/progress.jsonl (and its copied record) in the folder a new trial reuses never
    reaches the new trial's on_epoch while its job is queued and then fails; the job's own failure is what the
    trial reports."""
    _programs(
        tmp_path, monkeypatch, ["JobId=4242 JobState=PENDING Reason=Priority"] * 3 + ["JobId=4242 JobState=FAILED"]
    )
    _executor(monkeypatch, result={"node": 0, "failed": ("rank 0 failed: boom", "error")})
    monkeypatch.setattr(slurm, "with_train", lambda tcfg, **kw: tcfg)
    out = tmp_path / "trial"
    (out / "node0").mkdir(parents=True)
    stale = {
        "epoch": 1,
        "epochs": 1,
        "step": 1,
        "epoch_s": 1.0,
        "test_acc": 0.999,
        "train_loss": 0.001,
        "throughput_img_s": 1.0,
    }
    (out / "node0" / "progress.jsonl").write_text(json.dumps(stale) + "\n")
    (out / "metrics.json").write_text("{}")
    seen = []
    with pytest.raises(TrialFailed, match="boom"):
        slurm.Runner(_scfg())(_trial(out, on_epoch=lambda r: seen.append(r) and False))
    assert seen == [], seen
    assert not (out / "metrics.json").exists()


SLURM_PROFILE = """
data: {train_limit: 512, test_limit: 256}
train: {epochs: 1, warmup_steps: 1}
slurm: {partition: main, devices_per_node: 2, device: cpu, poll_s: 0.1}
sweep:
  spaces:
    single: {devices: [1], batch_size: [64], lr: [0.1, 0.2]}
"""


@pytest.mark.timeout(300)
def test_a_sweep_whose_controller_stays_unreachable_stops_and_keeps_the_point(
    repo, tmp_path, monkeypatch, capfd, synthetic_root
):
    """Proves, through the sweep: the trial whose controller stayed unreachable is failed with the reason and its
    point enqueued again (not failed for good), the sweep exits 1 with one paragraph, its job was cancelled, and no
    run stays RUNNING."""
    repo()
    (tmp_path / "experiments" / "f.yaml").write_text(SLURM_PROFILE)
    cfg = loader.load(tmp_path / "params.yaml", [])  # as the sweep reads it: the same study name
    log = _programs(tmp_path, monkeypatch, ["!" + UNREACHABLE])
    _executor(monkeypatch)
    monkeypatch.setattr(slurm, "UNREACHABLE_S", 1.0, raising=False)
    code = main(["sweep", "--strategy", "single"])
    flat = " ".join(capfd.readouterr().err.split())
    assert code == 1, flat[-3000:]
    assert "The sweep stopped in trial #0" in flat and "scontrol" in flat, flat[-3000:]
    assert "Traceback (most recent" not in flat, flat[-3000:]
    assert "scancel 4242" in log.read_text().splitlines()
    study = load_study(cfg, "single")
    (failed,) = study.get_trials(states=(TrialState.FAIL,))
    assert "failure_kind" not in failed.user_attrs and "enqueued again" in failed.user_attrs["reason"], (
        failed.user_attrs
    )
    assert len(study.get_trials(states=(TrialState.WAITING,))) == 2
    assert not [r for r in _runs(tmp_path) if r.info.status == "RUNNING"]


def test_a_job_sbatch_cannot_submit_fails_as_the_clusters_fault(tmp_path, monkeypatch, capfd, repo):
    """Proves, through the sweep: `sbatch` failing (present, but no controller answers) stops the sweep with exit 1
    and a message that names sbatch and SLURM, not a full disk or a store; the point is enqueued again."""
    repo()
    (tmp_path / "experiments" / "f.yaml").write_text(SLURM_PROFILE)
    cfg = loader.load(tmp_path / "params.yaml", [])

    def refused(self, folder, nodes, label):
        def submit(fn, *args):
            raise subprocess.CalledProcessError(1, ["sbatch", str(folder / "submission_file.sh")])

        return SimpleNamespace(submit=submit)

    monkeypatch.setattr(slurm.Runner, "executor", refused)
    code = main(["sweep", "--strategy", "single"])
    flat = " ".join(capfd.readouterr().err.split())
    assert code == 1, flat[-3000:]
    tail = flat.split("error: ", 1)[-1]
    assert "sbatch" in tail and "SLURM" in tail and "free disk space" not in tail, tail
    study = load_study(cfg, "single")
    (failed,) = study.get_trials(states=(TrialState.FAIL,))
    assert "failure_kind" not in failed.user_attrs and "enqueued again" in failed.user_attrs["reason"]
    assert len(study.get_trials(states=(TrialState.WAITING,))) == 2
