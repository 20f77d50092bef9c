"""Reliability: dying workers, hung collectives, divergence, interrupted and concurrent sweeps, security.

Faults are real signals sent from outside (SIGKILL, SIGSTOP, SIGINT), never hooks in the code under test. Each
case that starts processes is marked slow; every measured figure is printed as a `FIGURE {...}` line:

    .venv/bin/python -m pytest tests/sweep/test_reliability.py -rP      # figures in the PASSES section

docs/reliability.md lists the cases, the figures of a run and what each fault costs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import psutil
import pytest
import torch
from optuna.trial import TrialState

from tests.conftest import REPO

PROFILE = """
data: {{train_limit: {train_limit}, test_limit: 256}}
train: {{epochs: {epochs}, warmup_steps: 1, check_every: 5}}
sweep:
  spaces:
    {strategy}: {space}
"""
GRACE_S = 4  # PARALLAX_GRACE_S: how long a rerun waits for the trial of a SIGKILLed sweep


# ----------------------------------------------------------------------------- helpers


def figure(**kw) -> None:
    print("FIGURE " + json.dumps(kw))


def make_repo(tmp_path, synthetic_root, strategy, space, train_limit=4096, epochs=2) -> tuple[Path, dict]:
    """A repository root of its own (params.yaml + experiments/rel.yaml) and the environment of a sweep there."""
    root = tmp_path / "repo"
    (root / "experiments").mkdir(parents=True)
    (root / "experiments" / "rel.yaml").write_text(
        PROFILE.format(train_limit=train_limit, epochs=epochs, strategy=strategy, space=space)
    )
    (root / "params.yaml").write_text(  # no wait for, and no flag of, a host the suite's own load keeps busy
        f"profile: rel\ndata: {{source: synthetic, dir: {synthetic_root}}}\n"
        "train: {interference_threshold: 1.0e+6}\nsweep: {quiet_wait_s: 0}\n"
    )
    env = {
        **os.environ,
        "DVC_ROOT": str(root),
        "PARALLAX_GRACE_S": str(GRACE_S),
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    return root, env


def start_sweep(root, env, strategy, *args, log="sweep.log") -> subprocess.Popen:
    # a session of its own: a signal to its process group is a Ctrl-C in a terminal
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline", "sweep", "--strategy", strategy, *args],
        cwd=root,
        env=env,
        stdout=open(root / log, "a"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def left_behind(root) -> list[psutil.Process]:
    """Live processes (not zombies) started for this repository root: DVC_ROOT is in their environment."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.status() != psutil.STATUS_ZOMBIE and p.environ().get("DVC_ROOT") == str(root):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


def wait_for(pred, timeout, proc=None, what=""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the sweep exited (rc {proc.returncode}) while waiting for {what}")
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def trial_started(root, number):
    """True once the main rank of trial `number` has reported its first epoch (the trial is mid-run)."""
    return any((root / "runs" / "trials").glob(f"*-{number:04d}/progress.jsonl"))


def workers(proc) -> list[psutil.Process]:
    """The trial's worker processes: forked by the sweep, so they carry its command line."""
    parent = psutil.Process(proc.pid)
    return sorted((c for c in parent.children() if c.cmdline() == parent.cmdline()), key=lambda c: c.pid)


def rows(root, strategy):
    path = root / "results" / "sweeps" / f"{strategy}.jsonl"
    if not path.exists():
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def study(root):
    url = f"sqlite:///{root}/mlruns/optuna.db"
    (summary,) = optuna.get_all_study_summaries(url)
    return optuna.load_study(study_name=summary.study_name, storage=url)


def mlflow_runs(root):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root}/mlruns/mlflow.db")
    exps = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(exps, max_results=10000)
    parents = [r for r in runs if r.data.tags.get("role") == "study"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return runs, parents, children


def assert_stores_intact(root):
    for db in ("optuna.db", "mlflow.db"):
        with sqlite3.connect(root / "mlruns" / db) as con:
            assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok", db


def finish(proc, root, log="sweep.log", timeout=300) -> str:
    rc = proc.wait(timeout)
    text = (root / log).read_text()
    assert rc == 0, text[-4000:]
    return text


@pytest.fixture(autouse=True)
def _no_strays(tmp_path):
    """Whatever a failed assertion leaves running (a stopped rank, a sweep) is killed after the test."""
    yield
    for p in left_behind(tmp_path / "repo"):
        p.kill()


# ----------------------------------------------------------------------------- 3. a worker dies


@pytest.mark.slow
def test_sigkilled_rank_fails_the_trial_naming_it_and_the_study_goes_on(tmp_path, synthetic_root):
    root, env = make_repo(
        tmp_path, synthetic_root, "ddp", "{devices: [2], batch_size: [64], lr: [0.1, 0.2]}", epochs=6
    )  # trial 0 must still run when the signal lands, a few tenths after its epoch 1
    proc = start_sweep(root, env, "ddp")
    wait_for(lambda: trial_started(root, 0), 120, proc, "trial 0 to report its first epoch")
    time.sleep(0.2)  # into epoch 2
    ranks = workers(proc)
    assert len(ranks) == 2, ranks
    victim = ranks[-1]
    t0 = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    failed = wait_for(
        lambda: [r for r in rows(root, "ddp") if r["state"] == "failed"], 60, proc, "the trial to be recorded as failed"
    )[0]
    seconds = time.monotonic() - t0
    # PyTorch's launcher reports one failed rank, the first it polls: the killed one (named, with its pid), or the
    # survivor whose Gloo connection the death closed (then the reason says a peer most likely died)
    named = f"pid {victim.pid}" in failed["reason"]
    assert named or "peer rank's connection closed first" in failed["reason"], failed["reason"]
    assert failed["reason"].startswith("worker_died") and (not named or "SIGKILL" in failed["reason"])
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ranks)  # the other rank too
    finish(proc, root)
    states = sorted((r["lr"], r["state"]) for r in rows(root, "ddp"))
    assert states == [(0.1, "failed"), (0.2, "complete")]  # the next trial ran
    assert not left_behind(root)
    _, parents, children = mlflow_runs(root)
    assert sorted(c.info.status for c in children) == ["FAILED", "FINISHED"]
    assert [p.info.status for p in parents] == ["FINISHED"]
    dead = next(c for c in children if c.info.status == "FAILED")
    assert ("SIGKILL" if named else "peer rank's connection closed first") in dead.data.tags["failure"]
    figure(
        case="SIGKILL rank of a 2-process ddp trial",
        seconds_to_failed=round(seconds, 2),
        reason=failed["reason"],
        next_trial="complete",
        left_behind=0,
    )


# ----------------------------------------------------------------------------- 4. a collective hangs


@pytest.mark.slow
def test_stopped_rank_fails_the_trial_on_the_collective_timeout(tmp_path, synthetic_root):
    root, env = make_repo(
        tmp_path, synthetic_root, "ddp", "{devices: [2], batch_size: [64], lr: [0.1, 0.2]}", epochs=6
    )  # trial 0 must still run when the rank is stopped, a few tenths after its epoch 1
    proc = start_sweep(root, env, "ddp", "--set", "train.timeout_s=3", "--set", "sweep.trial_timeout_s=300")
    wait_for(lambda: trial_started(root, 0), 120, proc, "trial 0 to report its first epoch")
    time.sleep(0.2)
    ranks = workers(proc)
    victim = ranks[-1]
    t0 = time.monotonic()
    os.kill(victim.pid, signal.SIGSTOP)  # alive, holds its sockets, never answers: a rank that stops participating
    try:
        failed = wait_for(
            lambda: [r for r in rows(root, "ddp") if r["state"] == "failed"],
            90,
            proc,
            "the trial to fail on the collective timeout",
        )[0]
    finally:
        if victim.is_running():
            os.kill(victim.pid, signal.SIGCONT)  # only matters when the assertion above failed
    seconds = time.monotonic() - t0
    # the collective timeout (train.timeout_s=3) fired, not the trial budget (sweep.trial_timeout_s=300)
    assert failed["reason"].startswith("timeout: rank 0 failed") and "timed out" in failed["reason"].lower()
    assert not victim.is_running() or victim.status() == psutil.STATUS_ZOMBIE  # the stopped rank was killed
    finish(proc, root)
    assert sorted((r["lr"], r["state"]) for r in rows(root, "ddp")) == [(0.1, "failed"), (0.2, "complete")]
    assert not left_behind(root)
    runs, _, _ = mlflow_runs(root)
    assert not [r for r in runs if r.info.status == "RUNNING"]
    figure(
        case="SIGSTOP rank of a 2-process ddp trial, train.timeout_s=3",
        seconds_to_failed=round(seconds, 2),
        reason=failed["reason"][:120],
        next_trial="complete",
        left_behind=0,
    )


@pytest.mark.slow
def test_trial_over_its_budget_is_stopped_and_the_study_goes_on(tmp_path, synthetic_root):
    root, env = make_repo(
        tmp_path, synthetic_root, "ddp", "{devices: [2], batch_size: [64], lr: [0.1, 0.2]}", train_limit=8192, epochs=40
    )  # far over 6 s however fast
    t0 = time.monotonic()
    proc = start_sweep(root, env, "ddp", "--set", "sweep.trial_timeout_s=6")
    finish(proc, root)
    seconds = time.monotonic() - t0
    out = rows(root, "ddp")
    assert [r["state"] for r in out] == ["failed", "failed"]  # both points ran; neither hung the sweep
    assert all("time budget of 6 s" in r["reason"] for r in out), out
    assert not left_behind(root)
    runs, _, _ = mlflow_runs(root)
    assert not [r for r in runs if r.info.status == "RUNNING"]
    figure(case="trials over sweep.trial_timeout_s=6", trials=2, failed_on_budget=2, sweep_seconds=round(seconds, 1))


# ----------------------------------------------------------------------------- 5. divergence


@pytest.mark.slow
def test_diverged_multiprocess_trial_fails_and_the_study_goes_on(make_cfg, tmp_path):
    from pipeline.sweep.stage import run_sweep

    (tmp_path / "experiments").mkdir(exist_ok=True)
    (tmp_path / "experiments" / "rel.yaml").write_text(
        PROFILE.format(
            train_limit=2048, epochs=1, strategy="ddp", space="{devices: [2], batch_size: [64], lr: [100.0, 0.1]}"
        )
    )
    cfg = make_cfg(profile="rel")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    out = tmp_path / "ddp.jsonl"
    run_sweep(cfg, "ddp", out)
    # the elastic agent's signal handlers are gone again: Ctrl-C between trials is a KeyboardInterrupt
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    with open(out) as f:
        by_lr = {r["lr"]: r for r in map(json.loads, f)}
    assert by_lr[100.0]["state"] == "failed" and by_lr[0.1]["state"] == "complete"  # diverged first, then on
    reason = by_lr[100.0]["reason"]
    assert reason.startswith("diverged") and re.search(r"\b(nan|inf)\b", reason) and "rank" in reason, reason
    _, parents, children = mlflow_runs(tmp_path)
    assert sorted(c.info.status for c in children) == ["FAILED", "FINISHED"]
    assert [p.info.status for p in parents] == ["FINISHED"]
    # what a trial leaves behind is plain tensors: loadable without unpickling arbitrary objects
    (state_file,) = (tmp_path / "runs" / "trials").glob("*-0001/final_state.pt")
    assert torch.load(state_file, weights_only=True)
    figure(case="ddp k=2 lr=100", reason=reason[:120], next_trial="complete")


# ----------------------------------------------------------------------------- 6. interrupted sweep


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_interrupted_sweep_resumes_without_loss_or_repeats(tmp_path, synthetic_root, sig):
    # six epochs: the signal must land while trial 1 runs, and it is sent a few tenths of a second after trial 1's
    # first epoch; with two, a fast host (an AVX-512 Xeon, CI) finished trial 1 in that window
    root, env = make_repo(
        tmp_path,
        synthetic_root,
        "ddp",
        "{devices: [2], batch_size: [64], lr: [0.1, 0.2, 0.3]}",
        train_limit=3072,
        epochs=6,
    )
    proc = start_sweep(root, env, "ddp")
    wait_for(lambda: trial_started(root, 1), 180, proc, "trial 1 to report its first epoch")
    time.sleep(0.2)
    done_before = {
        t.number: t.user_attrs["mlflow_run_id"] for t in study(root).get_trials(states=(TrialState.COMPLETE,))
    }
    assert list(done_before) == [0]
    t0 = time.monotonic()
    if sig in ("SIGINT", "SIGTERM"):
        os.killpg(proc.pid, getattr(signal, sig))  # Ctrl-C, or a scheduler's stop: the sweep and its workers
    else:
        os.kill(proc.pid, signal.SIGKILL)  # the sweep only; its workers are left to notice
    rc = proc.wait(60)
    exit_s = time.monotonic() - t0
    assert rc == {"SIGINT": 130, "SIGTERM": 143, "SIGKILL": -9}[sig], (root / "sweep.log").read_text()[-3000:]
    wait_for(lambda: not left_behind(root), 30, what="the workers of the interrupted sweep to exit")
    gone_s = time.monotonic() - t0
    still_running = sorted(r.info.run_name for r in mlflow_runs(root)[0] if r.info.status == "RUNNING")
    if sig != "SIGKILL":
        assert not still_running  # ended KILLED at once; the point is enqueued again
    t1 = time.monotonic()
    text = finish(start_sweep(root, env, "ddp", log="rerun.log"), root, log="rerun.log")
    rerun_s = time.monotonic() - t1
    assert "Traceback" not in text

    s = study(root)
    complete = s.get_trials(states=(TrialState.COMPLETE,))
    points = sorted(t.params["lr"] for t in complete)
    assert points == [0.1, 0.2, 0.3]  # every point complete once: none lost, none repeated
    assert all(s.trials[n].user_attrs["mlflow_run_id"] == run for n, run in done_before.items())  # kept as it was
    assert not s.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))
    runs, parents, children = mlflow_runs(root)
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    assert [p.info.status for p in parents] == ["FINISHED"]
    finished = sorted(c.data.params["lr"] for c in children if c.info.status == "FINISHED")
    assert finished == ["0.1", "0.2", "0.3"]
    assert [c.info.status for c in children if c.info.status != "FINISHED"] == ["KILLED"]  # the interrupted one
    assert sorted(r["state"] for r in rows(root, "ddp")) == ["complete"] * 3 + ["failed"]
    assert not left_behind(root)
    assert_stores_intact(root)
    # the killed sweep's trial folder went with the rerun's first trial; the others with their trial
    assert not list(Path(tempfile.gettempdir()).glob(f"parallax-trial-{proc.pid}-*"))
    figure(
        case=f"{sig} to the sweep mid-trial (trial 1 of 3)",
        sweep_exit_s=round(exit_s, 2),
        all_processes_gone_s=round(gone_s, 2),
        running_mlflow_runs_while_stopped=still_running,
        rerun_s=round(rerun_s, 1),
        completed_kept=len(done_before),
        repeated=0,
        lost=0,
    )


# ----------------------------------------------------------------------------- 7. concurrent workers


# ----------------------------------------------------------------------------- 8. security
