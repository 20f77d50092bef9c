"""Every run Parallax makes carries MLflow's own provenance tags (user, source, commit) as mlflow.start_run sets them;
MLflow's system-metrics switch turns system metrics on; the store's location is said with MLflow's own command."""

from __future__ import annotations

import getpass
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import pipeline
from pipeline.cli import main
from pipeline.config import loader
from pipeline.scaling import overlap
from pipeline.sweep.stage import run_sweep
from pipeline.tracking import client

from ..analysis.test_analyze import row, write
from ..sweep.test_reliability import mlflow_runs
from .test_analysis_run import _params, _trial

MAIN = str(Path(pipeline.__file__).parent / "__main__.py")  # sys.argv[0] under `python -m pipeline`
PROFILE = """
data: {train_limit: 512, test_limit: 256}
train: {epochs: 1, warmup_steps: 1}
sweep: {spaces: {single: {devices: [1], batch_size: [64], lr: [0.1]}}}
"""
OVERLAP = {
    "settings": {"size": 64},
    "concurrent": {"A": {"median_s": 1.0}, "B": {"median_s": 1.0}, "both": {"median_s": 1.0}},
    "communication": {"sequential": {"median_s": 1.0}, "overlapped": {"median_s": 1.0}},
    "ratio_both_to_sum": 0.5,
    "comm_saving": 0.0,
}


def _commit(root: Path) -> str:
    """Make `root` a git checkout with one commit; its sha."""
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()


def _as_command(monkeypatch, *argv):
    monkeypatch.setattr(sys, "argv", [MAIN, *argv])


def test_every_kind_of_run_carries_mlflows_provenance(make_cfg, tmp_path, synthetic_root, monkeypatch, capsys):
    sha = _commit(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "experiments" / "prov.yaml").write_text(PROFILE)
    _as_command(monkeypatch, "sweep", "--strategy", "single")
    run_sweep(make_cfg(profile="prov"), "single", tmp_path / "single.jsonl")  # a study's parent run and a trial run

    _params(tmp_path, synthetic_root)
    _as_command(monkeypatch, "train")
    _trial(make_cfg, tmp_path, synthetic_root)  # `python -m pipeline train`
    trained = capsys.readouterr().out

    def measured(cfg, out, watch=None):  # the measurement is tests/scaling's: here only its run is logged
        (out / "overlap.md").write_text("overlap\n")
        return OVERLAP

    monkeypatch.setattr(overlap, "run", measured)
    _as_command(monkeypatch, "overlap")
    assert main(["overlap", "--out", str(tmp_path / "overlap")]) == 0

    sweeps = tmp_path / "results" / "sweeps"
    sweeps.mkdir(parents=True)
    write([row("ddp", k=1, B=128, thr=1000), row("ddp", k=2, B=256, thr=1800)], sweeps / "ddp.jsonl")
    _as_command(monkeypatch, "analyze")
    assert main(["analyze", "--sweeps", str(sweeps), "--out", str(tmp_path / "analysis")]) == 0
    analyzed = capsys.readouterr().out

    runs, parents, children = mlflow_runs(tmp_path)
    kinds = {
        r.data.tags.get("role") or r.data.tags.get("stage") or r.data.tags.get("dvc_stage"): r.data.tags for r in runs
    }
    assert set(kinds) == {"study", "sweep@single", "train", "overlap", "analyze"}, kinds
    assert len(parents) == len(children) == 1
    for kind, tags in kinds.items():
        assert tags.get("mlflow.source.git.commit") == sha, (kind, tags)
        assert tags.get("mlflow.user") == getpass.getuser(), (kind, tags)
        assert tags.get("mlflow.source.type") == "LOCAL", (kind, tags)
        assert "git_sha" not in tags, kind  # MLflow's own name, one name
    assert {k: t["mlflow.source.name"] for k, t in kinds.items()} == {
        "study": "python -m pipeline sweep",
        "sweep@single": "python -m pipeline sweep",
        "train": "python -m pipeline train",
        "overlap": "python -m pipeline overlap",
        "analyze": "python -m pipeline analyze",
    }
    # where a command names the store, it names MLflow's own command for it (a bare `mlflow ui` opens ./mlflow.db)
    assert "(make ui, or mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db)" in trained
    assert "make ui (every run in MLflow; mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db)" in analyzed


def test_mlflows_switch_turns_system_metrics_on(make_cfg, tmp_path, synthetic_root, monkeypatch):
    pytest.importorskip("psutil", reason="MLflow's system metrics need psutil")
    monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "true")
    run = _trial(make_cfg, tmp_path, synthetic_root, "tracking.system_metrics_interval_s=0.1")
    assert f"system/{socket.gethostname()}/cpu_utilization_percentage" in run.data.metrics  # setting left false


def test_the_switch_set_false_leaves_the_setting_and_an_unreadable_one_is_refused(make_cfg, monkeypatch):
    cfg = make_cfg()
    on = make_cfg("tracking.system_metrics=true")
    for value, off_cfg, on_cfg in (("false", False, True), ("0", False, True), ("TRUE", True, True), ("1", True, True)):
        monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", value)
        assert (client.system_metrics_on(cfg), client.system_metrics_on(on)) == (off_cfg, on_cfg), value
    monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "yes")
    with pytest.raises(loader.ConfigError, match="MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING='yes' is neither"):
        client.Tracker(cfg)  # before any run is made


def test_the_printed_command_opens_the_store(make_cfg, tmp_path, synthetic_root, monkeypatch):
    cfg = make_cfg()
    monkeypatch.chdir(tmp_path)
    client.Tracker(cfg)
    command = client.ui_command(cfg)
    assert command == "mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db"
    from mlflow.tracking import MlflowClient

    uri = command.split("--backend-store-uri ", 1)[1]
    names = {e.name for e in MlflowClient(tracking_uri=uri).search_experiments()}
    assert client.experiment_name(cfg) in names
    monkeypatch.chdir(synthetic_root)  # elsewhere: the store by its absolute path
    assert client.ui_command(cfg) == f"mlflow ui --backend-store-uri sqlite:///{tmp_path.resolve()}/mlruns/mlflow.db"
