"""A trial measured under interference, as every viewer shows it (MLflow run name, tag and metric; Optuna's numeric
attributes; the console counter; the pipeline run's tag), and the study row showing the report's efficiencies."""

from __future__ import annotations

import json
import time

import pytest

from pipeline.measure import interference
from pipeline.sweep import study_view
from pipeline.sweep.stage import load_study, run_sweep
from pipeline.tracking import client
from pipeline.tracking.metric_names import rounded

ONE_POINT = [
    "sweep.strategies=[single]",
    "sweep.spaces.single={devices: [1], batch_size: [64], lr: [0.1]}",
    "train.epochs=1",
    "data.train_limit=256",
    "data.test_limit=128",
    "sweep.remeasure_interfered=1",
]
REASON = "other processes kept 1.90 cores busy on average (planted)"


def notes(study) -> list[str]:
    """Each trial's optuna-dashboard note ("" for none), read as the dashboard reads it (the test extra has it)."""
    note = pytest.importorskip("optuna_dashboard._note")
    attrs = study._storage.get_study_system_attrs(study._study_id)
    return [note.get_note_from_system_attrs(attrs, t._trial_id)["body"] for t in study.trials]


@pytest.fixture
def loaded(monkeypatch):
    """Every trial's interference monitor reports a busy host."""
    measured = interference.Monitor.result

    def busy(self):
        return {**measured(self), "interfered": True, "interference_reason": REASON, "foreign_cores": 1.9}

    monkeypatch.setattr(interference.Monitor, "result", busy)


def test_a_flagged_trial_and_its_remeasure_say_so_everywhere(make_cfg, tmp_path, loaded, capsys, monkeypatch):
    """A flagged trial's run is named "[under load] ...", tagged parallax.flagged with the reason and has metric
    flagged=1; Optuna holds flagged=1.0 and foreign_cores as numbers, and its optuna-dashboard page a note that
    says so; its re-measure is named and tagged with the trial it repeats; the counter reads "2/1+1 re-measure",
    never "2/1"; each console outcome line marks its img/s "[under load: N cores busy]", the last re-measure's too;
    every run carries the pipeline run."""
    monkeypatch.setenv("PARALLAX_PIPELINE_RUN", "exp-test")
    cfg = make_cfg(*ONE_POINT)
    run_sweep(cfg, "single", tmp_path / "single.jsonl")
    tr = client.Tracker(cfg)
    (parent,) = tr.find_runs("tags.role = 'study'")
    assert parent.info.run_name == "study single · exp-test"
    trials = {r.info.run_name: r for r in tr.find_runs(f"tags.mlflow.parentRunId = '{parent.info.run_id}'")}
    first, again = "[under load] single k=1 B=64 lr=0.1", "[under load] single k=1 B=64 lr=0.1 re-measure of #0"
    assert set(trials) == {first, again}
    for run in trials.values():
        assert run.data.tags["parallax.flagged"] == REASON and run.data.metrics["flagged"] == 1
        assert run.data.tags["parallax.pipeline_run"] == "exp-test"
    assert (
        trials[again].data.tags["parallax.remeasure_of"] == "0"
        and "parallax.remeasure_of" not in trials[first].data.tags
    )
    assert parent.data.tags["parallax.pipeline_run"] == "exp-test"
    study = load_study(cfg, "single")
    for t in study.trials:
        assert t.user_attrs["flagged"] == 1.0 and t.user_attrs["foreign_cores"] == 1.9
    err = capsys.readouterr().err
    assert "trial 2/2 (1 planned + 1 re-measure)" in err and "trial 2/1 " not in err
    ends = [line for line in err.splitlines() if " -> " in line]  # each trial's outcome, the re-measure's too
    assert len(ends) == 2 and all(" img/s [under load: 1.9 cores busy], acc " in line for line in ends), ends
    for note in notes(study):
        assert note.startswith("**Measured under load**: 1.90 cores busy in other processes while the trial ran.\\\n")
        assert "`[under load]`" in note and REASON in note
        # lines of its own, each ending in a hard break: the dashboard's trial page does not wrap a long one
        lines = note.splitlines()
        assert len(lines) >= 5 and max(map(len, lines)) <= study_view.NOTE_WIDTH, lines
        for paragraph in note.split("\n\n"):
            assert all(line.endswith("\\") for line in paragraph.splitlines()[:-1]), paragraph


def test_a_host_that_stays_busy_gets_no_remeasure(make_cfg, tmp_path, loaded, capsys, monkeypatch):
    """Once the quiet wait has failed give_up_after times in a row, a flagged trial is kept as it is: a re-measure
    would meet the same load. The console says why; no second run is made."""
    from pipeline.measure import quiet
    from pipeline.sweep import stage

    def busy_gate(threshold, max_wait_s):
        return quiet.QuietGate(threshold, max_wait_s, probe=lambda: time.sleep(0.01) or 1.9, give_up_after=1)

    monkeypatch.setattr(stage, "QuietGate", busy_gate)
    cfg = make_cfg(*ONE_POINT, "sweep.quiet_wait_s=0.05", "train.interference_threshold=0.5")
    run_sweep(cfg, "single", tmp_path / "single.jsonl")
    tr = client.Tracker(cfg)
    (parent,) = tr.find_runs("tags.role = 'study'")
    (run,) = tr.find_runs(f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert run.data.tags["parallax.flagged"] == REASON
    assert "not re-measured: the host stayed busy through 1 quiet wait in a row" in capsys.readouterr().err


def test_an_unflagged_trial_has_flagged_zero(make_cfg, tmp_path, capsys):
    """On a quiet host (the tests' threshold) a trial's run has metric flagged=0, no flag tag and no suffix, and its
    Optuna trial no note."""
    cfg = make_cfg(*ONE_POINT)
    run_sweep(cfg, "single", tmp_path / "single.jsonl")
    tr = client.Tracker(cfg)
    (parent,) = tr.find_runs("tags.role = 'study'")
    (run,) = tr.find_runs(f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert run.info.run_name == "single k=1 B=64 lr=0.1" and run.data.metrics["flagged"] == 0
    assert "under load" not in capsys.readouterr().err  # its outcome line is the bare "-> N img/s, acc ..."
    assert "parallax.flagged" not in run.data.tags
    assert notes(load_study(cfg, "single")) == [""]


@pytest.mark.slow
def test_the_study_row_shows_the_reports_efficiency_at_every_k(make_cfg, tmp_path):
    """A small ddp sweep (k=1 and k=2 at the same per-device batch), then analyze: every efficiency metrics.json
    holds (weak_efficiency.ddp.kK) is on the MLflow study row under that same key, the same number, and the row's
    weak_efficiency is summary.json's, under its name, rounded as every metric is."""
    from pipeline.cli import main

    cfg = make_cfg(
        "sweep.strategies=[ddp]",
        # k=2 at B=128 only, so that the fastest k=2 point (the one metrics.json reports) has its k=1 reference, B=64,
        # whatever the timings: with k=2 at B=64 too, a loaded host could make that one the fastest, with no reference
        "sweep.spaces.ddp=[{devices: [1], batch_size: [64], lr: [0.1]}, {devices: [2], batch_size: [128], lr: [0.1]}]",
        "train.epochs=1",
        "data.train_limit=512",
        "data.test_limit=128",
    )
    sweeps = tmp_path / "results" / "sweeps"
    sweeps.mkdir(parents=True)
    run_sweep(cfg, "ddp", sweeps / "ddp.jsonl")
    (tmp_path / "params.yaml").write_text("profile: ''\nsweep: {strategies: [ddp]}\n")
    assert main(["analyze", "--sweeps", str(sweeps), "--out", str(tmp_path / "analysis")]) == 0
    flat = json.loads((tmp_path / "analysis" / "metrics.json").read_text())
    summary = json.loads((tmp_path / "analysis" / "summary.json").read_text())
    effs = {k: v for k, v in flat.items() if k.startswith("weak_efficiency.ddp.")}
    assert effs, flat  # a weak efficiency was measured
    (parent,) = client.Tracker(cfg).find_runs("tags.role = 'study'")
    row = parent.data.metrics
    for key, v in effs.items():
        assert row[key] == v, key
    assert row["weak_efficiency"] == rounded(summary["strategies"]["ddp"]["weak_efficiency"])
