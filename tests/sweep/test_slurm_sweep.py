"""Sweeps through a real SLURM (tests/sweep/slurm_cluster.py: slurmctld + two slurmd of 2 CPU "devices" each, in network
namespaces): every point is a job of ceil(k/2) nodes; k=4 spans both and matches single-device SGD after one step;
a scancelled job's trial runs again, nothing repeated or left RUNNING; a node lost mid-trial fails its trial."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
import torch

from pipeline.sweep import study_setup
from pipeline.sweep.stage import load_study, run_sweep
from pipeline.tracking import client
from tests.sweep import slurm_cluster

slurm = slurm_cluster.slurm  # the module's cluster (a fixture: assigned, not imported by name)
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture
def on_cluster(slurm, make_cfg, monkeypatch):
    """make_cfg for a sweep whose trials are SLURM jobs on the test cluster (nodes of 2 CPU devices)."""
    pytest.importorskip("submitit", reason="submitit (the `slurm` extra) is not installed")
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the jobs import this checkout's package

    def make(*sets):
        return make_cfg(
            "slurm.partition=main",
            "slurm.devices_per_node=2",
            "slurm.device=cpu",
            "slurm.poll_s=0.5",
            "slurm.time_limit_min=10",
            "data.train_limit=128",
            "data.test_limit=64",
            *sets,
        )

    return make


def rows(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def counts(cfg, strategy, out):
    """(Optuna trials run, MLflow trial runs, table rows of trials, RUNNING anywhere)."""
    study = load_study(cfg, strategy)
    trials = [t for t in study.trials if t.state.name != "WAITING"]
    runs = [
        r
        for r in client.Tracker(cfg).find_runs(f"tags.study = '{study.study_name}'")
        if r.data.tags.get("role") != "study"
    ]
    table = [r for r in rows(out) if r["state"] != "skipped"]
    running = sum(t.state.name == "RUNNING" for t in trials) + sum(r.info.status == "RUNNING" for r in runs)
    return study, trials, runs, table, running


def test_sweep_points_span_nodes_and_k4_matches_single(on_cluster, make_cfg, tmp_path, capfd):
    from pipeline.trial.launch import run_trial

    cfg = on_cluster("train.max_steps=1", "sweep.spaces.ddp={devices: [1, 2, 4], batch_size: [64], lr: [0.5]}")
    out = tmp_path / "ddp.jsonl"
    t0 = time.monotonic()
    run_sweep(cfg, "ddp", out)
    err = capfd.readouterr().err
    print(f"FIGURE slurm_sweep_3_points_s={time.monotonic() - t0:.1f}")
    print("\n".join(line for line in err.splitlines() if "SLURM job" in line))
    study, trials, runs, table, running = counts(cfg, "ddp", out)
    assert [r["state"] for r in table] == ["complete"] * 3, err[-3000:]
    assert {r["devices"]: r["nnodes"] for r in table} == {1: 1, 2: 1, 4: 2}
    jobs = {t.params["devices"]: t.user_attrs["slurm_job_id"] for t in trials}
    assert len(set(jobs.values())) == 3 and all(
        t.user_attrs["nodes"] == (2 if t.params["devices"] == 4 else 1) for t in trials
    )
    assert len(trials) == len(runs) == len(table) == 3 and running == 0
    for r in runs:  # the job id and node count on each MLflow run
        assert r.data.tags["parallax.slurm_job_id"] in jobs.values() and r.data.tags["parallax.nodes"] in "12"
    for phase in ("submitted to partition main", "done: COMPLETED on node[1-2]"):  # queued, running: if a poll sees
        assert f"SLURM job {jobs[4]} (2 nodes): {phase}" in err, err[-3000:]
    k4 = next(r for r in table if r["devices"] == 4)
    # both nodes are this one machine (2 cores): 4 ranks share them, tagged as such
    k4_metrics = next(t.user_attrs["metrics"] for t in trials if t.params["devices"] == 4)
    assert k4["oversubscribed"] is True and {d.split(":")[0] for d in k4_metrics["mem_devices"]} == {"node0", "node1"}
    print(
        "FIGURE slurm_sweep_points="
        + json.dumps(sorted((r["devices"], r["nnodes"], jobs[r["devices"]]) for r in table))
    )
    k4_trial = next(t.number for t in trials if t.params["devices"] == 4)
    got = torch.load(
        study_setup.trial_folder(study, tmp_path / "runs" / "trials", k4_trial) / "final_state.pt", weights_only=True
    )
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


def _running_job(cfg, strategy, timeout=120) -> tuple[int, str]:
    """(trial number, job id) of the first trial whose SLURM job has been submitted."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            study = load_study(cfg, strategy)
            for t in study.get_trials(deepcopy=False):
                if t.state.name == "RUNNING" and "slurm_job_id" in t.user_attrs:
                    return t.number, t.user_attrs["slurm_job_id"]
        except KeyError:  # the study is not created yet
            pass
        time.sleep(0.3)
    raise AssertionError("no trial's job was submitted")


def _sweep_in_thread(cfg, strategy, out):
    box = {}

    def go():
        try:
            run_sweep(cfg, strategy, out)
        except BaseException as e:  # noqa: BLE001 - re-raised by the test
            box["error"] = e

    th = threading.Thread(target=go, daemon=True)
    th.start()
    return th, box


def test_scancel_reenqueues_the_trial_and_the_study_finishes_without_repeats(on_cluster, slurm, tmp_path, capfd):
    cfg = on_cluster("train.epochs=2", "sweep.spaces.ddp={devices: [2], batch_size: [64], lr: [0.1, 0.2]}")
    out = tmp_path / "ddp.jsonl"
    th, box = _sweep_in_thread(cfg, "ddp", out)
    number, job = _running_job(cfg, "ddp")
    slurm.wait_state(job, "RUNNING", timeout=120)
    slurm.run(["scancel", job], check=True)
    th.join(timeout=400)
    assert not th.is_alive() and "error" not in box, box
    err = capfd.readouterr().err
    study, trials, runs, table, running = counts(cfg, "ddp", out)
    cancelled = next(t for t in trials if t.number == number)
    assert cancelled.state.name == "FAIL" and "CANCELLED" in cancelled.user_attrs["reason"], cancelled.user_attrs
    complete = [t.params["lr"] for t in trials if t.state.name == "COMPLETE"]
    assert sorted(complete) == [0.1, 0.2]  # each point once: no repeat
    assert len(trials) == len(runs) == len(table) == 3 and running == 0
    assert "enqueued again" in err and slurm.job(job).get("JobState") == "CANCELLED"
    print(
        f"FIGURE slurm_scancel_counts optuna={len(trials)} mlflow={len(runs)} rows={len(table)} running={running} "
        f"job={job}"
    )


def test_each_node_that_trained_logs_its_system_metrics_into_the_trial_run(on_cluster, tmp_path, capfd):
    """System metrics are sampled where the ranks ran: each node of the job, labelled with its SLURM name (MLflow's
    node_id), never the submitting host."""
    pytest.importorskip("psutil", reason="MLflow's system metrics need psutil")
    cfg = on_cluster(
        "train.max_steps=1",
        "tracking.system_metrics=true",
        "tracking.system_metrics_interval_s=0.1",
        "sweep.spaces.ddp={devices: [4], batch_size: [64], lr: [0.5]}",
    )
    out = tmp_path / "ddp.jsonl"
    run_sweep(cfg, "ddp", out)
    err = capfd.readouterr().err
    study, trials, (run,), table, running = counts(cfg, "ddp", out)
    assert [r["state"] for r in table] == ["complete"] and running == 0, err[-3000:]
    labels = {k.split("/")[1] for k in run.data.metrics if k.startswith("system/")}
    assert labels == set(slurm_cluster.NODES), sorted(run.data.metrics)  # both nodes of the k=4 job, only they
    for node in slurm_cluster.NODES:
        assert f"system/{node}/cpu_utilization_percentage" in run.data.metrics
    assert socket.gethostname() not in labels
    print(f"FIGURE slurm_system_metrics_nodes={sorted(labels)}")


def test_a_node_lost_mid_trial_fails_the_trial_with_the_reason(on_cluster, slurm, tmp_path):
    """Last in this module: node2 stays down."""
    cfg = on_cluster(
        "train.epochs=400",
        "sweep.trial_timeout_s=300",
        "data.train_limit=256",
        "sweep.spaces.ddp={devices: [4], batch_size: [64], lr: [0.1]}",
    )
    out = tmp_path / "ddp.jsonl"
    th, box = _sweep_in_thread(cfg, "ddp", out)
    number, job = _running_job(cfg, "ddp")
    slurm.wait_state(job, "RUNNING", timeout=120)
    trial_dir = next((tmp_path / "runs" / "trials").glob(f"*-{number:04d}"))
    deadline = time.monotonic() + 120
    while not list(trial_dir.glob("node*/progress.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.3)  # the ranks are training
    os.kill(slurm.daemons["node2"], signal.SIGKILL)
    t0 = time.monotonic()
    th.join(timeout=300)
    assert not th.is_alive() and "error" not in box, box
    print(f"FIGURE slurm_node_lost_to_failed_s={time.monotonic() - t0:.1f}")
    study, trials, runs, table, running = counts(cfg, "ddp", out)
    (t,) = trials
    assert t.state.name == "FAIL" and t.user_attrs["failure_kind"] == "node_fail", t.user_attrs
    assert "NODE_FAIL" in t.user_attrs["reason"] and "node2" in t.user_attrs["reason"]
    assert len(runs) == len(table) == 1 and running == 0 and runs[0].info.status == "FAILED"
    print(f"FIGURE slurm_node_lost_reason={t.user_attrs['reason']!r}")
