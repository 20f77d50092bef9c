"""How a trial's ranks start (pipeline/trial/start.py): auto picks forkserver on GPUs and fork on CPU; a forkserver
serves every trial of one process from one server that never trains, whose ranks take the caller's environment as it
is at each launch; every trial writes its timeline.

These run the forkserver path on a CPU: the same code GPU hosts run, minus CUDA (that the server never initialises
CUDA, so its forks may, only a GPU shows).

    .venv/bin/python -m pytest tests/trial/test_start.py
"""

from __future__ import annotations

import json
import multiprocessing.forkserver
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.measure.comm_probes import DUMP_ENV
from pipeline.trial import start
from pipeline.trial.launch import run_trial

REPO = Path(__file__).resolve().parents[2]
SMALL = ("train.batch_size=32", "data.train_limit=256", "data.test_limit=64", "train.epochs=1")


def test_auto_is_forkserver_on_gpus_and_fork_on_cpus():
    assert start.resolve("auto", "cuda") == "forkserver"
    assert start.resolve("auto", "cpu") == "fork"
    for method in ("fork", "spawn", "forkserver"):
        assert start.resolve(method, "cuda") == start.resolve(method, "cpu") == method


def test_a_rank_takes_the_callers_changes_but_keeps_the_launchers_own(monkeypatch):
    """env_delta holds what changed in the caller since its server started; apply_env takes it in a rank, except a
    variable the launcher set for that rank (RANK and the like: the rank's value differs from the server's)."""
    monkeypatch.setattr(start, "_SERVER_ENV", {"KEEP": "1", "CHANGED": "old", "GONE": "x", "RANK": "7"})
    monkeypatch.setattr(os, "environ", {"KEEP": "1", "CHANGED": "new", "ADDED": "a", "RANK": "7"})
    delta = start.env_delta("forkserver")
    assert delta == {"CHANGED": ("old", "new"), "GONE": ("x", None), "ADDED": (None, "a")}
    assert start.env_delta("fork") == start.env_delta("spawn") == {}
    # in a rank: the server's environment, RANK set by the launcher for this rank
    rank_env = {"KEEP": "1", "CHANGED": "old", "GONE": "x", "RANK": "0"}
    monkeypatch.setattr(os, "environ", rank_env)
    start.apply_env({**delta, "RANK": ("7", "9")})
    assert rank_env == {"KEEP": "1", "CHANGED": "new", "ADDED": "a", "RANK": "0"}


@pytest.mark.timeout(300)
def test_forkserver_trials_share_one_server_and_see_the_callers_environment(make_cfg, tmp_path, monkeypatch):
    """Two fsdp trials in one process with train.start_method=forkserver: both are right (the same final state as a
    forked trial of the same seed), both ranks are forks of one server that outlives them, and an environment
    variable the caller sets after the server started reaches the second trial's rank (here the profiler-event dump
    that `doctor --dump-events` asks for: its file appears only if the rank saw the variable)."""
    sets = ("train.strategy=fsdp", "train.devices=1", "train.breakdown_every=2", *SMALL)
    run_trial(make_cfg(*sets, "train.start_method=fork"), tmp_path / "fork", progress=False)  # this process's imports
    forked = run_trial(make_cfg(*sets, "train.start_method=fork"), tmp_path / "fork", progress=False)
    cfg = make_cfg(*sets, "train.start_method=forkserver")
    first = run_trial(cfg, tmp_path / "fs1", progress=False)
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    assert server is not None and os.path.exists(f"/proc/{server}")
    monkeypatch.setenv(DUMP_ENV, str(tmp_path / "events"))
    second = run_trial(cfg, tmp_path / "fs2", progress=False)
    assert multiprocessing.forkserver._forkserver._forkserver_pid == server  # the same server served both
    assert list((tmp_path / "events").glob("*.json")), "the rank did not see the caller's later environment"
    for record in (first, second):
        assert record["train_loss"] == forked["train_loss"] and record["test_acc"] == forked["test_acc"]
    # the ranks' CPU time is the trial's own, not other processes' (interference.py): the server reaps them, not us
    assert second["interference"]["own_cpu_s"] >= 0.5 * forked["interference"]["own_cpu_s"], (second, forked)
    ref = torch.load(tmp_path / "fork" / "final_state.pt", weights_only=True)
    got = torch.load(tmp_path / "fs2" / "final_state.pt", weights_only=True)
    assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)


def test_every_trial_writes_its_timeline_in_order(make_cfg, tmp_path):
    """timeline.json: where a trial's wall time goes (benchmarks/overhead/trial_start.py reads it), its stamps in the
    order the trial passes them, and steps and evaluation inside the rank's training span."""
    run_trial(make_cfg("train.strategy=single", *SMALL), tmp_path / "o", progress=False)
    tl = json.loads((tmp_path / "o" / "timeline.json").read_text())
    r = tl["rank0"]
    assert tl["start_method"] == "fork"
    stamps = [
        tl["entered"],
        tl["launched"],
        r["entered"],
        r["imported"],
        r["data"],
        r["built"],
        r["trained"],
        r["returned"],
        tl["returned"],
        tl["written"],
    ]
    assert stamps == sorted(stamps)
    assert 0 < r["steps_s"] and 0 < r["eval_s"] and r["steps_s"] + r["eval_s"] <= r["trained"] - r["built"]


def test_the_servers_preload_leaves_the_collector_on_and_its_imports_frozen():
    """preload.py imports with the collector off; the server and every rank it forks must have it on again."""
    code = (
        "import gc, sys; import pipeline.trial.preload; "
        "print(gc.isenabled(), gc.get_freeze_count() > 0, 'torch._dynamo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert out.split() == ["True", "True", "True"]
