"""A tiny study end to end: CSV rows, Optuna trial states, MLflow parent/child runs, failure, resume."""

from __future__ import annotations

import json

import optuna
import pytest
from optuna.trial import TrialState

from pipeline.records.table import point_of
from pipeline.sweep.space import Space, points
from pipeline.sweep.stage import load_study, run_sweep
from pipeline.tracking import client

TINY = """
data: {{train_limit: 512, test_limit: 256}}
train: {{epochs: 1, warmup_steps: 1}}
sweep:
  spaces:
    single: {{devices: [1, 2], batch_size: [64], lr: [0.1, {bad_lr}]}}
    ddp: {{devices: [1, 2], batch_size: [64, 63], lr: [0.1]}}
    dp: {{devices: [1], batch_size: [64], lr: [0.1]}}
"""


@pytest.fixture
def tiny(make_cfg, tmp_path):
    def make(bad_lr=100.0, *sets):
        (tmp_path / "experiments" / "tiny.yaml").write_text(TINY.format(bad_lr=bad_lr))
        return make_cfg(*sets, profile="tiny")

    (tmp_path / "experiments").mkdir(exist_ok=True)
    return make


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_tiny_study_end_to_end(tiny, tmp_path, capsys):
    cfg = tiny()
    out = tmp_path / "results" / "single.jsonl"
    run_sweep(cfg, "single", out)
    rows = read(out)
    # the two points skipped for one reason: one console line with their count, not one line each
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.lstrip().startswith("skipped ")]
    assert line.startswith("  skipped 2 points (k=2 B=64 lr=0.1; k=2 B=64 lr=100.0): "), line
    states = sorted((r["devices"], r["lr"], r["state"]) for r in rows)
    # k=2 is infeasible for `single` (skipped, not run); lr=100 diverges and is recorded as failed
    assert states == [(1, 0.1, "complete"), (1, 100.0, "failed"), (2, 0.1, "skipped"), (2, 100.0, "skipped")]
    failed = next(r for r in rows if r["state"] == "failed")
    assert "diverged" in failed["reason"] and ("nan" in failed["reason"] or "inf" in failed["reason"])
    ok = next(r for r in rows if r["state"] == "complete")
    assert ok["throughput_img_s"] > 0 and len(ok["peak_mem_bytes"]) == 1 and isinstance(ok["throughput_windows"], list)
    assert ok["data_source"] == "synthetic" and ok["host_cpu_isa"] and ok["host_bf16"]
    skipped = next(r for r in rows if r["state"] == "skipped")
    assert skipped["host"] == ok["host"] and skipped["throughput_img_s"] is None

    study = load_study(cfg, "single")
    assert sorted(t.state.name for t in study.trials) == ["COMPLETE", "FAIL"]

    tr = client.Tracker(cfg)
    parents = tr.find_runs("tags.role = 'study' and tags.strategy = 'single'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = tr.find_runs(f"tags.mlflow.parentRunId = '{parents[0].info.run_id}'")
    assert sorted(c.info.status for c in children) == ["FAILED", "FINISHED"]
    done = next(c for c in children if c.info.status == "FINISHED")
    assert done.data.tags["synthetic"] == "true" and done.data.tags["dvc_stage"] == "sweep@single"
    assert "final_test_acc" in done.data.metrics and "peak_mem_mib_dev0" in done.data.metrics
    assert done.data.tags["host_cpu_isa"] == ok["host_cpu_isa"] and done.data.params["lr"] == "0.1"
    complete = next(t for t in study.trials if t.state.name == "COMPLETE")
    assert complete.user_attrs["throughput_img_s"] == ok["throughput_img_s"]
    assert done.info.run_name.startswith("single k=1 B=64 lr=0.1")
    assert not tr.find_runs("attributes.status = 'RUNNING'")


def test_a_trial_of_warm_up_steps_only_is_complete_and_says_why_it_has_no_throughput(tiny, tmp_path, capsys):
    """2 steps, 3 of warm-up: the trial stays complete (its accuracy is valid); its line read `-> 0 img/s`."""
    cfg = tiny(100.0, "train.warmup_steps=3", "sweep.spaces.single={devices: [1], batch_size: [256], lr: [0.1]}")
    out = tmp_path / "single.jsonl"
    run_sweep(cfg, "single", out)
    why = "no steady-state step was timed: all 2 step(s) of the run were warm-up (the first 3"
    assert f"-> no throughput ({why}" in capsys.readouterr().err
    (row,) = read(out)
    assert row["state"] == "complete" and row["throughput_img_s"] is None and why in row["reason"]
    (run,) = [r for r in client.Tracker(cfg).find_runs("tags.strategy = 'single'") if "trial" in r.data.tags]
    assert run.info.status == "FINISHED" and why in run.data.tags["parallax.untimed"]


def test_n_trials_0_sets_the_study_up_and_says_it_runs_nothing_by_design(tiny, tmp_path, capsys):
    """The set-up step of docs/scale-out.md: the queue and the parent run, no trial; its console line says so."""
    cfg = tiny()
    run_sweep(cfg, "single", tmp_path / "single.jsonl", max_new_trials=0)
    err = capsys.readouterr().err
    assert "2 trial(s) to run" in err and "--n-trials 0: the study is set up and no trial is run here, by design" in err
    study = load_study(cfg, "single")
    assert [t.state for t in study.trials] == [TrialState.WAITING] * 2


def test_the_header_counts_the_trials_that_run_re_measures_among_them(tiny, tmp_path, capsys):
    """A rerun says how many trials it runs: the queued re-measures of trials flagged under interference count (its
    header said "2 to run" and ran more), and a study whose planned trials all ran but a re-measure waits is not
    complete."""
    cfg = tiny(100.0, "sweep.remeasure_interfered=1")
    out = tmp_path / "single.jsonl"
    run_sweep(cfg, "single", out, max_new_trials=0)
    assert "2 trial(s) to run" in capsys.readouterr().err
    study = load_study(cfg, "single")
    first = study.get_trials(deepcopy=False)[0]
    study.enqueue_trial(point_of(first), user_attrs={"repeat": 0, "remeasure": 1, "remeasure_of": first.number})
    run_sweep(cfg, "single", out, max_new_trials=0)
    err = " ".join(capsys.readouterr().err.split())
    assert "3 trial(s) to run (1 of them a re-measure of a trial flagged as measured under interference" in err, err
    assert "each trial flagged as measured under interference adds one: sweep.remeasure_interfered=1)" in err, err


def test_a_complete_study_says_it_is_complete_and_runs_nothing(tiny, tmp_path, capsys):
    """A rerun of a study whose every trial ran to an end: "is complete ... nothing to run", never "N to run"."""
    cfg = tiny()
    out = tmp_path / "single.jsonl"
    run_sweep(cfg, "single", out, max_new_trials=1)
    err = capsys.readouterr().err
    assert "2 trial(s) to run" in err, err
    run_sweep(cfg, "single", out)  # the second trial: one left, one ran already
    err = " ".join(capsys.readouterr().err.split())
    assert "1 trial(s) to run (1 of 2 ran to an end already)" in err, err
    run_sweep(cfg, "single", out)
    err = " ".join(capsys.readouterr().err.split())
    name = Space(cfg, "single").name
    assert f"study {name} is complete: all 2 trial(s) of its points ran to an end (1 failed" in err, err
    assert "nothing to run" in err and "trial(s) to run" not in err and "trial 1/" not in err, err
    assert sorted(r["state"] for r in read(out)) == ["complete", "failed", "skipped", "skipped"]


def test_unavailable_strategy_rows_say_why(tiny, tmp_path, capsys):
    from pipeline.host.devices import probe

    if probe().kind == "cuda":
        pytest.skip("dp is available on CUDA hosts")
    out = tmp_path / "dp.jsonl"
    run_sweep(tiny(100.0, "sweep.quiet_wait_s=5"), "dp", out)
    rows = read(out)
    assert rows and all(r["state"] == "skipped" and "CUDA" in r["reason"] for r in rows)
    assert "before each trial: waiting" not in capsys.readouterr().err  # no trial to run: no quiet moment waited for


@pytest.mark.slow
def test_resume_runs_only_what_is_left_and_multiprocess_rows(tiny, tmp_path):
    cfg = tiny()
    out = tmp_path / "ddp.jsonl"
    feasible = [p for p in points(cfg, "ddp") if p["batch_size"] % p["devices"] == 0]
    run_sweep(cfg, "ddp", out, max_new_trials=1)
    first = [r for r in read(out) if r["state"] == "complete"]
    assert len(first) == 1
    run_sweep(cfg, "ddp", out)
    rows = read(out)
    complete = [r for r in rows if r["state"] == "complete"]
    assert len(complete) == len(feasible)  # every point once, none repeated
    assert first[0]["trial"] in {r["trial"] for r in complete}
    assert any(r["state"] == "skipped" and "divisible" in r["reason"] for r in rows)
    two = next(r for r in complete if r["devices"] == 2)
    assert len(two["peak_mem_bytes"]) == 2
    study = load_study(cfg, "ddp")
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == len(feasible)


def test_changed_space_is_a_new_study(tiny):
    assert Space(tiny(), "single").name == Space(tiny(), "single").name  # same space: the same study (resume)
    assert Space(tiny(50.0), "single").name != Space(tiny(), "single").name  # an lr changed: a new study
    # another strategy's space changing leaves this one's study (and its DVC stage) alone
    assert Space(tiny(50.0), "ddp").name == Space(tiny(), "ddp").name


@pytest.mark.slow
def test_pruning_reaches_a_multiprocess_trial_through_rank_0(tiny, tmp_path, monkeypatch):
    """Rank 0 (a worker process) reports each epoch; the sweep's pruning decision stops every rank."""
    reported = []
    monkeypatch.setattr(optuna.Trial, "report", lambda self, value, step: reported.append((value, step)))
    monkeypatch.setattr(optuna.Trial, "should_prune", lambda self: True)
    cfg = tiny(
        100.0, "sweep.pruning=true", "train.epochs=3", "sweep.spaces.ddp={devices: [2], batch_size: [64], lr: [0.1]}"
    )
    out = tmp_path / "ddp.jsonl"
    run_sweep(cfg, "ddp", out)
    rows = [r for r in read(out) if r["state"] != "skipped"]
    assert [r["state"] for r in rows] == ["pruned"] and "after epoch 1" in rows[0]["reason"]
    assert len(rows[0]["test_acc"]) == 1  # both ranks stopped after the first epoch
    assert [step for _, step in reported] == [1]
    study = load_study(cfg, "ddp")
    assert [t.state for t in study.trials] == [TrialState.PRUNED]
    runs = client.Tracker(cfg).find_runs("tags.strategy = 'ddp'")
    assert [r.info.status for r in runs if "mlflow.parentRunId" in r.data.tags] == ["KILLED"]


def test_unselected_strategy_writes_a_table_saying_so_and_opens_no_store(tiny, tmp_path):
    cfg = tiny(100.0, "sweep.strategies=[single, ddp]")
    out = run_sweep(cfg, "scratch", tmp_path / "scratch.jsonl")
    rows = read(out)
    assert rows and all(r["state"] == "skipped" and r["reason"].startswith("not selected") for r in rows)
    assert not (tmp_path / "mlruns").exists()


def test_a_table_written_while_another_worker_starts_a_trial_has_its_whole_point():
    """Another worker's trial, claimed and half-way through suggesting its params (model and devices so far), is
    written as its enqueued point, not a KeyError that stops this worker's sweep."""
    from pipeline.records.table import trial_row
    from pipeline.sweep import claims

    study = optuna.create_study(storage=optuna.storages.RDBStorage("sqlite:///:memory:", heartbeat_interval=1))
    point = {"model": "lenet", "devices": 2, "batch_size": 128, "lr": 0.1}
    study.enqueue_trial(point)
    trial = claims.claim(study)
    trial.suggest_categorical("model", ["lenet"])
    trial.suggest_categorical("devices", [2])
    [running] = study.get_trials(states=(TrialState.RUNNING,))
    assert set(running.params) == {"model", "devices"}  # the moment the race happened at
    row = trial_row(study, "ddp", t=running)
    assert (row["batch_size"], row["per_device_batch"], row["lr"], row["state"]) == (128, 64, 0.1, "running")


def test_an_unselected_stage_loads_neither_torch_optuna_nor_mlflow(tmp_path):
    """DVC runs every sweep@ stage: one that params.yaml does not select writes its table in the time its
    configuration takes to load, not the seconds torch, Optuna and MLflow take to import."""
    import os
    import subprocess
    import sys

    out = tmp_path / "scratch.jsonl"
    code = (
        "import json, sys; from pipeline.cli.commands import main;"
        f"rc = main(['sweep', '--strategy', 'scratch', '--out', {str(out)!r},"
        " '--set', 'profile=', '--set', 'sweep.strategies=[single]']);"
        "print(json.dumps([rc, [m for m in ('torch', 'optuna', 'mlflow') if m in sys.modules]]))"
    )
    env = {**os.environ, "DVC_ROOT": str(tmp_path)}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.splitlines()[-1]) == [0, []]
    rows = read(out)
    assert rows and all(r["state"] == "skipped" and r["reason"].startswith("not selected") for r in rows)
    assert "not selected" in p.stderr and not (tmp_path / "mlruns").exists()
