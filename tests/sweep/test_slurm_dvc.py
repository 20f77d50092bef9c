"""`dvc repro` with the SLURM profile from a login node: a temporary copy of the project, whose experiments/slurm.yaml
states the throwaway cluster's shape (tests/sweep/slurm_cluster.py: two nodes of 2 CPU devices), runs
`dvc repro sweep@ddp` in the root namespace (the login node: no slurmd there); every point is a SLURM job."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline import catalog
from tests.project import copy_tracked
from tests.sweep import slurm_cluster

slurm = slurm_cluster.slurm  # the module's cluster (a fixture: assigned, not imported by name)
REPO = next(p for p in Path(__file__).resolve().parents if (p / "dvc.yaml").is_file())
BIN = Path(sys.executable).parent
DVC = BIN / "dvc" if (BIN / "dvc").exists() else shutil.which("dvc")
pytestmark = pytest.mark.slow
# the profile's cluster section and spaces, shrunk to the test cluster and one step per trial
CLUSTER = {"partition": "main", "devices_per_node": 2, "device": "cpu", "time_limit_min": 10, "poll_s": 0.5}
SPACE = {"devices": [2, 4], "batch_size": [64], "lr": [0.5]}


def _clone(dst: Path) -> Path:
    copy_tracked(dst)
    prof = yaml.safe_load((dst / "experiments" / "slurm.yaml").read_text())
    assert {"partition", "devices_per_node", "time_limit_min", "account"} <= set(prof["slurm"])  # the user's shape
    prof["slurm"].update(CLUSTER)
    prof["data"] = {"train_limit": 128, "test_limit": 64}
    prof["train"] = {"epochs": 1, "max_steps": 1, "warmup_steps": 0, "interference_threshold": 1000}
    # a one-device row keeps its one device: a space that gives it none is refused by every stage (sweep_refusal)
    one = {s for s in prof["sweep"]["spaces"] if catalog.is_one_device_only(s)}
    prof["sweep"]["spaces"] = {s: {**SPACE, "devices": [1]} if s in one else SPACE for s in prof["sweep"]["spaces"]}
    (dst / "experiments" / "slurm.yaml").write_text(yaml.safe_dump(prof))
    params = (dst / "params.yaml").read_text()
    for old, new in {"profile: cpu": "profile: slurm", "source: fashion-mnist": "source: synthetic"}.items():
        assert old in params, old
        params = params.replace(old, new)
    (dst / "params.yaml").write_text(params)
    return dst


@pytest.mark.skipif(not DVC or not shutil.which("git"), reason="needs dvc and git")
def test_dvc_repro_with_the_slurm_profile_runs_every_point_as_a_job(slurm, tmp_path):
    """From the login node, `dvc repro sweep@ddp` with profile slurm submits each point as a job sized
    ceil(k/2) nodes: the sweep table's rows are complete with nnodes 1 (k=2) and 2 (k=4), each trial's MLflow run
    names its own job, which SLURM ran to COMPLETED on that many nodes; the log shows queued/running/done."""
    pytest.importorskip("submitit", reason="submitit (the `slurm` extra) is not installed")
    repo = _clone(tmp_path / "proj")
    env = {k: v for k, v in slurm.env.items() if k not in ("DVC_ROOT", "DVC_STAGE", "PYTHONPATH")}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", DVC_NO_ANALYTICS="1")
    for cmd in (
        ["git", "init", "-q"],
        ["git", "add", "-A"],
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "clone"],
    ):
        subprocess.run(cmd, cwd=repo, env=env, check=True, capture_output=True)
    p = subprocess.run([str(DVC), "repro", "sweep@ddp"], cwd=repo, env=env, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    table = [json.loads(line) for line in (repo / "results" / "sweeps" / "ddp.jsonl").read_text().splitlines()]
    assert sorted((r["devices"], r["nnodes"], r["state"]) for r in table) == [(2, 1, "complete"), (4, 2, "complete")]
    with sqlite3.connect(repo / "mlruns" / "mlflow.db") as db:
        tags = db.execute(
            "SELECT r.run_uuid, t.key, t.value FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
            "WHERE t.key IN ('parallax.slurm_job_id', 'parallax.nodes')"
        ).fetchall()
    jobs: dict[str, dict] = {}
    for run, key, value in tags:
        jobs.setdefault(run, {})[key] = value
    points = sorted((int(j["parallax.nodes"]), j["parallax.slurm_job_id"]) for j in jobs.values())
    assert [n for n, _ in points] == [1, 2] and len({j for _, j in points}) == 2, jobs
    for nodes, job in points:
        info = slurm.job(job)
        assert info.get("JobState") == "COMPLETED" and info.get("NumNodes", "").split("-")[0] == str(nodes), info
        for phase in ("submitted to partition main", "done: COMPLETED"):  # queued, running: only if a poll sees them
            assert f"SLURM job {job} ({nodes} node{'s' * (nodes > 1)}): {phase}" in p.stderr + p.stdout
    print(
        "FIGURE slurm_dvc_repro_points="
        + json.dumps([(r["devices"], r["nnodes"]) for r in table])
        + " jobs="
        + json.dumps(points)
    )
