"""Where and under what limits a trial's ranks run: every trial (also single, scratch, dp, dp_criterion, which drive
their devices from one process) runs outside the caller's process under the trial's time budget; start_method=fork
is refused on a CUDA host; ranks share a GPU only in an oversubscribed trial.

These run on a CPU. They check the contracts (a budget ends a hung trial with kind `timeout`, the caller's process
never trains, the refusal, the backend rule), not CUDA: whether a hung NCCL broadcast inside DataParallel yields to
SIGTERM/SIGKILL, and what memory a GPU gets back when the trial's process exits, need a GPU.

    .venv/bin/python -m pytest tests/trial/test_trial_exec.py
"""

from __future__ import annotations

import os
import threading

import pytest
import torch

from pipeline.errors import Infeasible, TrialFailed
from pipeline.host.devices import Host, device_for
from pipeline.strategies.base import Strategy
from pipeline.strategies.ddp import DDPStrategy
from pipeline.trial import ranks
from pipeline.trial.launch import check_feasible, run_trial

HANG_S = 40  # how long the planted hang lasts: a trial that is not stopped before then completes (and the test fails)
SMALL = ("train.batch_size=32", "data.train_limit=256", "data.test_limit=64", "train.epochs=1")


def _host(kind: str, n: int) -> Host:
    return Host(kind, n, "test device", "testhost", "2.11.0", "13.0" if kind == "cuda" else "")


@pytest.mark.timeout(HANG_S * 3)
@pytest.mark.parametrize("strategy", ["single", "scratch"])
def test_an_in_process_strategy_over_its_budget_fails_with_kind_timeout(make_cfg, tmp_path, monkeypatch, strategy):
    """A trial of a one-process strategy whose step hangs (the stand-in for a DataParallel NCCL broadcast that never
    returns on a host with broken P2P) is stopped at run_trial's timeout_s and fails with kind `timeout`, as a
    multi-process trial over its budget does. The hang is a wait that ends after HANG_S, so a trial nobody stops
    completes and the test fails instead of hanging. Only a GPU shows that a process blocked inside NCCL dies on the
    launcher's SIGTERM (or its SIGKILL after the grace period)."""
    release = threading.Event()
    real_step = Strategy.train_step

    def hung_step(self, *args, **kwargs):
        release.wait(HANG_S)
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(Strategy, "train_step", hung_step)
    releaser = threading.Timer(HANG_S, release.set)
    releaser.start()
    try:
        with pytest.raises(TrialFailed) as e:
            run_trial(make_cfg(f"train.strategy={strategy}", *SMALL), tmp_path / "o", progress=False, timeout_s=2)
    finally:
        release.set()
        releaser.cancel()
    assert e.value.kind == "timeout" and "time budget of 2 s" in str(e.value), (e.value.kind, str(e.value))
    assert not (tmp_path / "o" / "metrics.json").exists()
    # where it hung: the stopped process's Python stack, named in the reason
    stacks = tmp_path / "o" / "stacks-rank0.txt"
    assert str(stacks) in str(e.value) and "in hung_step" in stacks.read_text(), stacks.read_text()


def test_an_in_process_strategy_trains_in_a_child_and_reports_its_epochs_to_the_caller(make_cfg, tmp_path, monkeypatch):
    """The training loop of a one-process strategy runs in a process of its own, never in the caller's (a sweep, the
    doctor): whatever it initialises on a device (CUDA contexts, the caching allocator's reserve on each of dp's k
    GPUs) goes when that process exits, so it is not left to the trials after it. The caller's on_epoch callback
    (MLflow logging, Optuna pruning) still runs in the caller's process, once per epoch, and the final state comes
    back. That the driver frees a process's contexts and memory on exit is CUDA's contract: a GPU shows it."""
    pids = tmp_path / "pids"

    def spy(name, real):
        def recorded(*args, **kwargs):
            with open(pids, "a") as f:
                f.write(f"{name} {os.getpid()}\n")
            return real(*args, **kwargs)

        return recorded

    # where a trial first touches its devices: the strategy's setup (set_device), then the loop (model, data)
    monkeypatch.setattr(Strategy, "setup", spy("setup", Strategy.setup))
    monkeypatch.setattr(ranks, "train", spy("train", ranks.train))
    called = []
    record = run_trial(
        make_cfg("train.strategy=single", *SMALL),
        tmp_path / "o",
        progress=False,
        on_epoch=lambda r: called.append((os.getpid(), r["epoch"])) and False,
    )
    ran = [line.split() for line in pids.read_text().splitlines()]
    assert [name for name, _ in ran] == ["setup", "train"], ran
    assert str(os.getpid()) not in {pid for _, pid in ran}, (ran, os.getpid())
    assert called == [(os.getpid(), 1)]
    assert record["steps"] == 8 and (tmp_path / "o" / "final_state.pt").exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy,k", [("single", 1), ("ddp", 2)])
def test_an_error_in_the_callers_epoch_callback_stops_the_trial_and_reaches_the_caller(make_cfg, tmp_path, strategy, k):
    """The caller's on_epoch (MLflow logging: its store may be down) runs in the caller's process while the ranks
    train elsewhere: its error stops the trial at that epoch and is raised by run_trial, as if the loop had called it,
    instead of dying with the watcher thread while the ranks wait train.timeout_s for an answer at every epoch."""

    def store_down(record):
        raise OSError(f"store unreachable at epoch {record['epoch']}")

    with pytest.raises(OSError, match="store unreachable at epoch 1"):
        run_trial(
            make_cfg(
                f"train.strategy={strategy}",
                f"train.devices={k}",
                "train.oversubscribe=true",
                *SMALL,
                "train.epochs=3",
                "train.timeout_s=100",
            ),
            tmp_path / "o",
            progress=False,
            on_epoch=store_down,
        )
    assert not (tmp_path / "o" / "metrics.json").exists()


@pytest.mark.parametrize("strategy,k", [("single", 1), ("ddp", 2)])
def test_fork_is_refused_on_a_cuda_host(make_cfg, strategy, k):
    """The parent has initialised CUDA (probing the GPUs) before it starts any rank, and a forked process cannot use
    CUDA then ("Cannot re-initialize CUDA in forked subprocess"): start_method=fork is refused before anything runs,
    naming the choices that work. A mock host; the CUDA error itself needs a GPU to see."""
    sets = (f"train.strategy={strategy}", f"train.devices={k}", "train.batch_size=64")
    with pytest.raises(Infeasible, match=r"train\.start_method=fork.*spawn"):
        check_feasible(make_cfg(*sets, "train.start_method=fork"), _host("cuda", 2))
    for method in ("auto", "spawn"):
        check_feasible(make_cfg(*sets, f"train.start_method={method}"), _host("cuda", 2))
    check_feasible(make_cfg(*sets, "train.start_method=fork"), _host("cpu", 2))


@pytest.mark.parametrize(
    "visible,devices,nnodes,oversubscribe,shared",
    [
        (4, 4, 1, False, False),  # the built-in launcher: every rank sees the node's 4 GPUs, takes cuda:local_rank
        (1, 4, 1, False, False),  # an external per-rank binding (SLURM --gpus-per-task=1): each rank sees its own GPU
        (2, 4, 2, False, False),  # 2 nodes, 2 ranks each, 2 GPUs each
        (1, 8, 2, False, False),  # 2 nodes, 4 ranks each, one GPU bound to each rank
        (2, 4, 1, True, True),  # oversubscribed: 4 ranks round-robin on 2 GPUs
        (1, 2, 1, True, True),  # oversubscribed: 2 ranks on the one GPU
        (4, 4, 1, True, False),  # oversubscribe allowed but not needed: every rank has its own GPU
    ],
)
def test_ranks_share_a_gpu_only_in_an_oversubscribed_trial(make_cfg, visible, devices, nnodes, oversubscribe, shared):
    """shares_gpu (Gloo instead of NCCL) for the GPU counts a rank may see. A rank seeing fewer GPUs than its node
    runs ranks is not by itself sharing: under per-rank binding each sees one, its own. The trial's feasibility
    check (made where the node's GPUs are all visible) allows more ranks than GPUs only with train.oversubscribe.
    Checks the rule on mock hosts; whether NCCL initialises on a bound node needs the node."""
    cfg = make_cfg(
        "train.strategy=ddp",
        f"train.devices={devices}",
        f"train.nnodes={nnodes}",
        f"train.oversubscribe={str(oversubscribe).lower()}",
        "train.batch_size=64",
    )
    assert DDPStrategy(cfg.train, _host("cuda", visible)).shares_gpu is shared
    assert DDPStrategy(cfg.train, _host("cpu", visible)).shares_gpu is False
    if visible == 1:  # a bound rank's device is its own GPU, cuda:0 in its numbering, whatever its local rank
        assert device_for(_host("cuda", 1), 3) == torch.device("cuda", 0)


def test_a_forked_rank_ends_on_sigterm_with_its_stacks_even_under_the_agents_handler(tmp_path):
    """A rank forked by the elastic agent inherits the agent's Python SIGTERM handler, which raises SignalException
    wherever the main thread is: inside a weakref callback Python prints "Exception ignored ... Traceback" and the
    rank goes on. The rank's stop (ranks._stacks_on_stop) writes its stacks, then ends as SIGTERM does: killed by
    the signal, with nothing printed."""
    import signal
    import subprocess
    import sys

    code = f"""
import os, signal, time
from pathlib import Path

def agent_handler(signum, frame):  # as torch's _terminate_process_handler: raise wherever the main thread is
    raise RuntimeError("the agent's handler ran in the rank")

signal.signal(signal.SIGTERM, agent_handler)
from pipeline.trial import ranks

ranks._stacks_on_stop(Path({str(tmp_path / "stacks-rank0.txt")!r}))
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(5)
print("still running after SIGTERM")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGTERM, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and "agent's handler" not in p.stderr and not p.stdout, p.stderr
    assert "most recent call first" in (tmp_path / "stacks-rank0.txt").read_text()
