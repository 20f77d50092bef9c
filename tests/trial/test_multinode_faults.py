"""Faults in a 2-node x 1-process ddp trial (two elastic agents on this machine, c10d rendezvous on 127.0.0.1):
a partition (node 0's whole process group stopped: its connections stay open, nothing answers) ends node 1's trial
within a bound derived from train.timeout_s with a Parallax error naming the rendezvous host; a rank killed on one
node ends both nodes' trial with a reason."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.trial.tiny_args import tiny_synthetic_sets

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 10  # train.timeout_s of these trials


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_nodes(tmp_path, synthetic_root, port):
    """Both nodes of a trial that trains until stopped, each in its own process group; returns once one rank has
    finished an epoch (both nodes train)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "DVC_ROOT": str(tmp_path)}
    common = [
        "--batch-size",
        "64",
        "--lr",
        "0.05",
        "--epochs",
        "100000",
        "--no-track",
        "--quiet",
        *tiny_synthetic_sets(synthetic_root),
        "--set",
        f"train.timeout_s={TIMEOUT_S}",
        "--set",
        "train.nnodes=2",
        "--set",
        f"train.rdzv_endpoint=127.0.0.1:{port}",
        "--set",
        f"train.rdzv_id=faults-{port}",
    ]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipeline",
                "train",
                "--strategy",
                "ddp",
                "--devices",
                "2",
                "--set",
                f"train.node_rank={n}",
                "--out",
                str(tmp_path / f"node{n}"),
                *common,
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for n in (0, 1)
    ]
    deadline = time.monotonic() + 180
    while not any((tmp_path / f"node{n}" / "progress.jsonl").exists() for n in (0, 1)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "the trial never trained"
        time.sleep(0.2)
    return procs


def _end(proc):
    """Stop a node's whole process group for good (it may be stopped)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
        os.killpg(proc.pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
    return proc.communicate()[0]


@pytest.mark.slow
def test_partition_ends_the_other_node_with_the_reason(tmp_path, synthetic_root):
    """Node 0 (the rendezvous host) stops answering: node 1 ends within the bound (a few train.timeout_s), exit 1,
    with one Parallax message naming the rendezvous host and the timeout, and no C++ frame dump."""
    port = _free_port()
    node0, node1 = _start_nodes(tmp_path, synthetic_root, port)
    os.killpg(node0.pid, signal.SIGSTOP)
    try:
        out = node1.communicate(timeout=TIMEOUT_S * 6 + 30)[0]
    except subprocess.TimeoutExpired:
        _end(node1)
        pytest.fail(f"node 1 still ran {TIMEOUT_S * 6 + 30} s after node 0 stopped answering")
    finally:
        _end(node0)
    assert node1.returncode == 1, out[-3000:]
    message = " ".join(out[out.rfind("\nerror: ") :].split())  # Parallax's message, unwrapped
    assert f"rendezvous host 127.0.0.1:{port}" in message and "train.timeout_s" in message, out[-3000:]
    assert "frame #" not in out and "Traceback" not in out, out[-3000:]


@pytest.mark.slow
def test_a_killed_rank_ends_both_nodes_with_a_reason(tmp_path, synthetic_root):
    """SIGKILL of node 1's rank: both nodes' train end (exit 1) within a bound, never a hang, each with Parallax's
    reason last (a rank died or lost its peer, or the rendezvous host was lost)."""
    port = _free_port()
    procs = _start_nodes(tmp_path, synthetic_root, port)
    rank = subprocess.run(["pgrep", "-P", str(procs[1].pid)], capture_output=True, text=True).stdout.split()
    assert rank, "node 1 has no rank process"
    os.kill(int(rank[0]), signal.SIGKILL)
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=TIMEOUT_S * 6 + 30)[0])
        except subprocess.TimeoutExpired:
            outs.append(_end(p))
    assert [p.returncode for p in procs] == [1, 1], "\n----\n".join(o[-3000:] for o in outs)
    for out in outs:  # the last line is Parallax's: the failed rank's own error, or the lost rendezvous host
        assert "\nerror: " in out and "Traceback" not in out[out.rfind("\nerror: ") :], out[-3000:]
