"""A 2-node x 1-process ddp trial: two elastic agents on this machine ("nodes") joined by c10d rendezvous on
127.0.0.1, as docs/scale-out.md runs them on two machines; one step gives single's parameters."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.trial.tiny_args import tiny_synthetic_sets

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_one_process_each_match_single(make_cfg, tmp_path, synthetic_root):
    from pipeline.trial.launch import run_trial

    common = [
        "--batch-size",
        "64",
        "--lr",
        "0.5",
        "--max-steps",
        "1",
        "--no-track",
        "--quiet",
        *tiny_synthetic_sets(synthetic_root),
    ]
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "DVC_ROOT": str(tmp_path)}
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
                "train.nnodes=2",
                "--set",
                f"train.node_rank={n}",
                "--set",
                f"train.rdzv_endpoint=127.0.0.1:{port}",
                "--set",
                "train.rdzv_id=mn-test",
                "--out",
                str(tmp_path / f"node{n}"),
                *common,
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for n in (0, 1)
    ]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    states = [tmp_path / f"node{n}" / "final_state.pt" for n in (0, 1)]
    got = torch.load(next(s for s in states if s.exists()), weights_only=True)
    m = json.loads((tmp_path / "node0" / "metrics.json").read_text())
    # every device of every node appears in the memory table, with its node
    assert m["nnodes"] == 2 and len(m["peak_mem_bytes"]) == 2
    assert sorted(d.split(":")[0] for d in m["mem_devices"]) == ["node0", "node1"]
    ref_cfg = make_cfg(
        "train.strategy=single",
        "train.batch_size=64",
        "train.lr=0.5",
        "train.max_steps=1",
        "data.train_limit=128",
        "data.test_limit=64",
    )
    run_trial(ref_cfg, tmp_path / "single", progress=False)
    ref = torch.load(tmp_path / "single" / "final_state.pt", weights_only=True)
    for k in ref:
        assert torch.allclose(ref[k], got[k], atol=1e-6, rtol=1e-4), k


def test_multinode_needs_an_endpoint_and_even_split(make_cfg):
    from pipeline.host.devices import probe
    from pipeline.trial.launch import Infeasible, check_feasible

    with pytest.raises(Infeasible, match="rdzv_endpoint"):
        check_feasible(make_cfg("train.strategy=ddp", "train.devices=2", "train.nnodes=2"), probe())
    with pytest.raises(Infeasible, match="evenly"):
        check_feasible(
            make_cfg(
                "train.strategy=ddp",
                "train.devices=3",
                "train.nnodes=2",
                "train.batch_size=66",
                "train.rdzv_endpoint=127.0.0.1:1",
            ),
            probe(),
        )
