"""A full disk where trials write (runs/trials): the trial that could not write its folder is the host's failure, not
the point's. The sweep stops with exit 1 and one paragraph naming the folder and its free space; the trial is failed
and its point enqueued again, as for a store fault; a rerun once space is freed runs every point.

A real full file system needs root (a tmpfs on runs/trials): here the rank's write of final_state.pt raises what the
host's would (torch's "unexpected pos" of a file cut short, or ENOSPC).

    .venv/bin/python -m pytest tests/sweep/test_full_disk.py
"""

from __future__ import annotations

import errno
import os

import pytest
import torch
from optuna.trial import TrialState

from pipeline.cli import main
from pipeline.config import loader
from pipeline.sweep.stage import load_study

from . import test_faults
from .test_faults import _runs

repo = test_faults.repo  # the fixture


def _cut_short(*a, **kw):
    raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 102656 vs 102552")


def _no_space(*a, **kw):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fault", [_cut_short, _no_space], ids=["torch-cut-short", "ENOSPC"])
def test_a_full_trial_folder_stops_the_sweep_and_a_rerun_runs_every_point(repo, tmp_path, monkeypatch, capfd, fault):
    repo()
    cfg = loader.load(tmp_path / "params.yaml", [])  # as the sweep reads it: the same study name
    real = torch.save
    monkeypatch.setattr(torch, "save", fault)  # the ranks are forked: they inherit it
    code = main(["sweep", "--strategy", "single"])
    err = capfd.readouterr().err
    flat = " ".join(err.split())
    assert code == 1, flat[-3000:]
    assert "Traceback (most recent" not in err and "api.py" not in err, err[-3000:]
    assert "The sweep stopped in trial #0" in flat and "free" in flat, flat[-3000:]
    assert str(tmp_path / "runs" / "trials") in flat, flat[-3000:]
    assert "trial #1" not in flat  # the next point never started on the full disk
    study = load_study(cfg, "single")
    (failed,) = study.get_trials(states=(TrialState.FAIL,))
    assert "failure_kind" not in failed.user_attrs and "enqueued again" in failed.user_attrs["reason"]
    assert len(study.get_trials(states=(TrialState.WAITING,))) == 2  # its copy, and the point not reached
    assert not [r for r in _runs(tmp_path) if r.info.status == "RUNNING"]

    monkeypatch.setattr(torch, "save", real)  # space freed
    assert main(["sweep", "--strategy", "single"]) == 0
    study = load_study(cfg, "single")
    done = sorted(t.params["lr"] for t in study.get_trials(states=(TrialState.COMPLETE,)))
    assert done == [0.1, 0.2]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("full", [True, False], ids=["folder-full", "folder-writable"])
def test_a_peer_reported_dead_on_a_full_disk_keeps_its_point(repo, tmp_path, monkeypatch, capfd, full):
    """In a multi-process trial the launcher may report a peer of the rank whose write failed (worker_died). When the
    trial's folder then refuses a write, the failure is the host's: the sweep stops, the point is enqueued again. When
    the folder takes writes, worker_died stays the trial's own failure (the study goes on)."""
    from pipeline.errors import TrialFailed
    from pipeline.records import files
    from pipeline.trial import lifecycle

    repo()
    cfg = loader.load(tmp_path / "params.yaml", [])

    def peer_died(*a, **kw):
        raise TrialFailed("rank 1 (pid 4242) died: SIGABRT", "worker_died")

    monkeypatch.setattr(lifecycle, "run_locally", peer_died)
    monkeypatch.setattr(files, "refuses_writes", lambda folder: "No space left on device" if full else None)
    code = main(["sweep", "--strategy", "single"])
    flat = " ".join(capfd.readouterr().err.split())
    study = load_study(cfg, "single")
    failed = study.get_trials(states=(TrialState.FAIL,))
    if full:
        assert code == 1 and "could not write the trial directory" in flat and "worker_died" in flat, flat[-2000:]
        assert len(failed) == 1 and "enqueued again" in failed[0].user_attrs["reason"]
        assert len(study.get_trials(states=(TrialState.WAITING,))) == 2
    else:
        assert code == 0 and len(failed) == 2, flat[-2000:]
        assert {t.user_attrs["failure_kind"] for t in failed} == {"worker_died"}
