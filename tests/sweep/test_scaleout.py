"""Scale-out, for real: two sweep workers share one Optuna study in a PostgreSQL server and log to one `mlflow
server` backed by PostgreSQL; one worker is SIGKILLed mid-trial and the other finishes the study.

Everything runs on 127.0.0.1 with a throwaway PostgreSQL cluster this module creates (initdb into a temporary
folder, its own port, stopped and deleted at the end): no system service is touched. Where PostgreSQL cannot be
started (no server binaries, no driver) the test is skipped with the reason, unless PARALLAX_REQUIRE_POSTGRES=1
(set by .ci/run once it has installed PostgreSQL), which turns the skip into a failure.

The commands are the ones docs/scale-out.md gives, character for character: COMMANDS below holds them with the
page's shell variables, test_docs_give_the_tested_commands checks the page, and the slow test runs them with the
variables filled in (`python` and `mlflow` become this virtual environment's, PostgreSQL's programs are taken
from its bin folder and run as the `postgres` user when the tests run as root).

    .venv/bin/python -m pytest tests/sweep/test_scaleout.py -rP      # timings in the PASSES section
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.sweep.scaleout_services import COMMANDS, GRACE_S, PROFILE, Killer, Worker, figure, render

DOC = REPO / "docs" / "scale-out.md"
STRATEGY = "single"


BUDGET, SPACE = 5, {(b, lr) for b in (64, 128) for lr in (0.05, 0.1, 0.2)}


# ----------------------------------------------------------------------------- the page


def test_docs_give_the_tested_commands():
    text = DOC.read_text()
    missing = [name for name, cmd in COMMANDS.items() if cmd not in text]
    assert not missing, f"docs/scale-out.md lacks the tested command(s) {missing}: keep the page and COMMANDS equal"


# ----------------------------------------------------------------------------- PostgreSQL, MLflow server


# ----------------------------------------------------------------------------- the workers


def machine(tmp_path: Path, name: str, data_dir: Path) -> Path:
    """A checkout of its own, as on another machine: params.yaml and the test profile."""
    root = tmp_path / name
    (root / "experiments").mkdir(parents=True)
    (root / "experiments" / "scale.yaml").write_text(PROFILE)
    (root / "params.yaml").write_text(  # no wait for, and no flag of, a host the suite (or the other worker) loads
        f"profile: scale\ndata: {{source: synthetic, dir: {data_dir}}}\n"
        "train: {interference_threshold: 1.0e+6}\nsweep: {quiet_wait_s: 0}\n"
    )
    return root


def worker_env(root: Path, values: dict) -> dict:
    return {
        **os.environ,
        "DVC_ROOT": str(root),
        "PGPASSWORD": str(values["PGPASSWORD"]),
        "PARALLAX_GRACE_S": str(GRACE_S),
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }


def read_table(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_two_workers_share_one_study_through_postgres_and_mlflow_server(
    postgres, mlflow_server, synthetic_root, tmp_path
):
    import optuna
    from mlflow.tracking import MlflowClient
    from optuna.trial import TrialState

    values = {**mlflow_server, "STRATEGY": STRATEGY}
    roots = {n: machine(tmp_path, n, synthetic_root) for n in ("machine-a", "machine-b")}

    # the study is created once, before the workers (they would race to create the tables)
    t0 = time.monotonic()
    _, argv = render("create_study", values)
    p = subprocess.run(
        [sys.executable, *argv[1:]],
        cwd=REPO,
        env=worker_env(roots["machine-a"], values),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, f"creating the study failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    assert f"{BUDGET} trial(s) to run" in p.stderr, p.stderr
    created_s = time.monotonic() - t0

    # two workers, started together, each in its own checkout
    _, argv = render("worker", values)
    t1 = time.monotonic()
    killer = Killer()
    workers = {
        n: Worker(n, [sys.executable, *argv[1:]], root, worker_env(root, values), killer) for n, root in roots.items()
    }
    try:
        # the first worker in the middle of its second (or later) trial is SIGKILLed by the Killer
        deadline = time.monotonic() + 240
        while not killer.done.wait(0.1):
            assert all(w.proc.poll() is None for w in workers.values()), (
                "a worker exited before one could be killed mid-trial:\n"
                + "\n".join(f"--- {w.name}\n{w.text()[-3000:]}" for w in workers.values())
            )
            assert time.monotonic() < deadline, "no worker reached a second trial in 240 s:\n" + "\n".join(
                f"--- {w.name}\n{w.text()[-3000:]}" for w in workers.values()
            )
        victim, killed_trial, t_kill = killer.victim, killer.trial, killer.at
        survivor = next(w for w in workers.values() if w is not victim)
        assert victim.wait(30) == -signal.SIGKILL
        rc = survivor.wait(300)
        t_end = time.monotonic()
        assert rc == 0, f"the surviving worker failed (rc {rc}):\n{survivor.text()[-5000:]}"
    finally:
        for w in workers.values():
            w.stop()
    figure(
        create_study_s=round(created_s, 1),
        workers_s=round(t_end - t1, 1),
        survivor_after_kill_s=round(t_end - t_kill, 1),
        grace_s=GRACE_S,
        killed=victim.name,
        killed_trial=killed_trial,
        trials_by_worker={w.name: w.started() for w in workers.values()},
    )

    # --- Optuna, read from PostgreSQL
    storage = optuna.storages.RDBStorage(
        f"postgresql://parallax:{postgres['PGPASSWORD']}@{postgres['DB_HOST']}:{postgres['DB_PORT']}/optuna"
    )
    (name,) = optuna.get_all_study_names(storage)  # one study, shared by both workers
    study = optuna.load_study(study_name=name, storage=storage)
    trials = study.get_trials(deepcopy=False)
    by_number = {t.number: t for t in trials}
    assert not [t.number for t in trials if t.state in (TrialState.WAITING, TrialState.RUNNING)]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    points = [(t.params["batch_size"], t.params["lr"]) for t in complete]
    assert len(points) == BUDGET and len(set(points)) == BUDGET, points  # global budget, each point once
    assert set(points) <= SPACE
    assert study.user_attrs["enqueued"] == BUDGET
    originals = [t for t in trials if "failed_trial" not in t.system_attrs]
    retries = [t for t in trials if "failed_trial" in t.system_attrs]
    assert len(originals) == BUDGET, [(t.number, t.state.name) for t in trials]
    assert by_number[killed_trial].state == TrialState.FAIL, (
        f"trial {killed_trial} ended {by_number[killed_trial].state.name}: the SIGKILL came too late"
    )
    (retry,) = [t for t in retries if t.system_attrs["failed_trial"] == killed_trial]
    assert retry.state == TrialState.COMPLETE and retry.params == by_number[killed_trial].params
    assert len(trials) == BUDGET + len(retries)

    # --- the workers: both did work, no trial ran twice, the survivor ran the dead worker's retried trial
    ran = {w.name: set(w.started()) for w in workers.values()}
    assert all(ran.values()), ran
    assert not (ran[victim.name] & ran[survivor.name]), ran
    assert ran[victim.name] | ran[survivor.name] == set(by_number), (ran, sorted(by_number))
    assert retry.number in ran[survivor.name]
    assert victim.finished() and all("img/s" in o for o in victim.finished()), victim.text()[-3000:]
    assert survivor.finished() and all("img/s" in o for o in survivor.finished()), survivor.text()[-3000:]

    # --- MLflow, read from the server
    client = MlflowClient(tracking_uri=mlflow_server["url"])
    exp = client.get_experiment_by_name("parallax-scale")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("role") == "study"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED", [
        (r.info.run_name, r.info.status) for r in parents
    ]
    parent = parents[0]
    assert parent.data.tags["study"] == name
    children = {r.info.run_id: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert len(runs) == 1 + len(children)
    run_of = {t.number: t.user_attrs["mlflow_run_id"] for t in trials}
    assert len(set(run_of.values())) == len(trials) and set(run_of.values()) == set(children)  # one run per trial
    for number, run_id in run_of.items():
        assert children[run_id].data.tags["trial"] == str(number)
        assert children[run_id].data.tags["optuna_trial_id"] == str(by_number[number]._trial_id)
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    dead = children[run_of[killed_trial]]
    assert dead.info.status == "KILLED" and "heartbeat" in dead.data.tags.get("failure", ""), dead.data.tags
    for t in complete:
        r = children[run_of[t.number]]
        assert r.info.status == "FINISHED" and r.data.metrics["final_test_acc"] == pytest.approx(t.value, rel=1e-3)
        artifacts = [a.path for a in client.list_artifacts(r.info.run_id)]  # the step breakdown where one was sampled
        assert "metrics.json" in artifacts and set(artifacts) <= {"metrics.json", "breakdown.json", "trace"}, artifacts
        assert ("breakdown.json" in artifacts) == ("trace" in artifacts), artifacts  # its sampled step's Chrome trace
    # artifacts went through the server into its --artifacts-destination folder
    stored = list(Path(mlflow_server["ARTIFACTS"]).rglob("metrics.json"))
    assert len(stored) == BUDGET, stored
    assert list(Path(mlflow_server["ARTIFACTS"]).rglob(f"study/{STRATEGY}.jsonl"))

    # --- the survivor's table is the whole study
    rows = read_table(roots[survivor.name] / "results" / "sweeps" / f"{STRATEGY}.jsonl")
    states = sorted(r["state"] for r in rows)
    assert states == sorted(["complete"] * BUDGET + ["failed"] * len(retries)), states
