"""What the viewers show: MLflow (experiment kind, learning curves, MiB, dataset input, host tags, study summaries,
unavailable studies, analysis metrics) and Optuna (metric name, numeric user attributes, optuna-dashboard)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

import optuna
import pytest

from pipeline.records.trial import TrialRecord
from pipeline.sweep import study_view
from pipeline.sweep.space import Space
from pipeline.sweep.stage import load_study, run_sweep
from pipeline.tracking import client

PROFILE = """
data: {train_limit: 512, test_limit: 256}
train: {epochs: 2, warmup_steps: 1}
sweep:
  spaces:
    single: {devices: [1, 2], batch_size: [64], lr: [0.1]}
    dp: {devices: [1], batch_size: [64], lr: [0.1]}
"""


@pytest.fixture
def views(make_cfg, tmp_path):
    (tmp_path / "experiments").mkdir(exist_ok=True)
    (tmp_path / "experiments" / "views.yaml").write_text(PROFILE)
    return make_cfg(profile="views")


def test_sweep_as_the_viewers_show_it(views, tmp_path, synthetic_root):
    cfg = views
    run_sweep(cfg, "single", tmp_path / "single.jsonl")
    tr = client.Tracker(cfg)
    exp = tr.client.get_experiment(tr.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"

    (parent,) = tr.find_runs("tags.role = 'study'")
    (trial,) = tr.find_runs(f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    rid = trial.info.run_id
    for key in ("train_loss", "test_acc", "epoch_s"):  # learning curves: one point per epoch
        assert [h.step for h in tr.client.get_metric_history(rid, key)] == [1, 2], key
    # the trial's final numbers sit at the last epoch, not at step 0 before the curves
    assert [h.step for h in tr.client.get_metric_history(rid, "throughput_img_s")] == [2]
    m = trial.data.metrics
    assert 0 < m["peak_mem_mib_dev0"] < 2**20 and m["peak_mem_mib"] == m["peak_mem_mib_dev0"]
    assert "final_test_acc" in m and "wall_s" in m and not any("/" in k for k in m)  # the record's own names
    # the tag keeps the bytes; the metric is rounded to 4 significant digits (metric_names.ROUND_DIGITS)
    assert json.loads(trial.data.tags["peak_mem_bytes"])[0] == pytest.approx(m["peak_mem_mib_dev0"] * 2**20, rel=1e-3)

    (ds,) = tr.client.get_run(rid).inputs.dataset_inputs
    assert ds.dataset.name == "synthetic" and ds.dataset.digest == client.data_digest(synthetic_root)
    assert ds.dataset.digest and {t.key: t.value for t in ds.tags}["mlflow.data.context"] == "train"
    tags = trial.data.tags
    assert tags["host_bf16"] in ("native", "emulated") and tags["host_cpu_isa"] and tags["host_torch"]

    p = parent.data.metrics
    assert p["study/n_complete"] == 1 and p["study/n_failed"] == 0 and p["study/n_skipped"] == 1
    assert "best_throughput_img_s" not in p and "throughput_img_s" not in p  # the analyze stage writes it
    assert "weak_efficiency" not in p  # no k >= 2 point measured: undefined, not 0
    assert "best_test_acc" not in p and "worst_mem_imbalance" not in p  # the analyze stage's too, its rule
    assert "parallax.unavailable" not in parent.data.tags

    study = load_study(cfg, "single")
    assert study.metric_names == ["final_test_acc"] and study.direction == optuna.study.StudyDirection.MAXIMIZE
    assert study.user_attrs["space_hash"] == Space(cfg, "single").hash and study.user_attrs["strategy"] == "single"
    (t,) = study.trials
    for k in ("throughput_img_s", "final_test_acc", "peak_mem_mib", "mem_imbalance", "mean_epoch_s"):
        assert isinstance(t.user_attrs[k], float), k
    assert t.user_attrs["final_test_acc"] == t.value and "metrics" in t.user_attrs

    # the analysis run carries summary.json's numbers as metrics
    from pipeline.cli import main

    sweeps = tmp_path / "results" / "sweeps"
    sweeps.mkdir(parents=True)
    (tmp_path / "single.jsonl").rename(sweeps / "single.jsonl")
    (tmp_path / "params.yaml").write_text("profile: views\n")
    assert main(["analyze", "--sweeps", str(sweeps), "--out", str(tmp_path / "analysis")]) == 0
    (analysis,) = tr.find_runs("tags.stage = 'analyze'")
    summary = json.loads((tmp_path / "analysis" / "summary.json").read_text())
    assert analysis.data.metrics["summary/n_complete"] == summary["n_complete"] == 1
    assert analysis.data.metrics["strategy/single/best_throughput_img_s"] == pytest.approx(  # rounded: 4 digits
        summary["strategies"]["single"]["best_throughput_img_s"], rel=1e-3
    )
    parent_metrics = tr.client.get_run(parent.info.run_id).data.metrics  # the study row: the report's figure
    assert parent_metrics["best_throughput_img_s"] == pytest.approx(  # under summary.json's name
        summary["strategies"]["single"]["best_throughput_img_s"], rel=1e-3
    )
    assert "throughput_img_s" not in parent_metrics  # the trials' column holds trials' numbers only
    assert parent_metrics["best_test_acc"] == pytest.approx(trial.data.metrics["final_test_acc"], rel=1e-3)
    # one count of flagged trials and one name for the largest device's peak, on the study row and the analysis run
    assert parent_metrics["study/n_flagged"] == analysis.data.metrics["summary/n_flagged"] == summary["n_flagged"]
    assert parent_metrics["peak_mem_mib.single.k1"] == pytest.approx(m["peak_mem_mib"], rel=1e-3)


def test_the_shared_views_columns_are_all_on_the_study_rows(make_cfg, tmp_path):
    """The link `make ui` prints opens on the study (parent) rows, collapsed: every metric column the view selects is
    one each measured study row carries (a trial-only column would be `-` on all of them), and no column is a
    trial's parameter."""
    from pipeline.cli import main
    from pipeline.tracking import ui_view

    (tmp_path / "experiments").mkdir(exist_ok=True)
    (tmp_path / "experiments" / "rows.yaml").write_text(
        "data: {train_limit: 256, test_limit: 128}\ntrain: {epochs: 1, warmup_steps: 1}\n"
        "sweep: {spaces: {ddp: {devices: [1, 2], batch_size: [64], lr: [0.1]}}}\n"
    )
    cfg = make_cfg(profile="rows")
    sweeps = tmp_path / "results" / "sweeps"
    sweeps.mkdir(parents=True)
    run_sweep(cfg, "ddp", sweeps / "ddp.jsonl")
    (tmp_path / "params.yaml").write_text("profile: rows\n")
    assert main(["analyze", "--sweeps", str(sweeps), "--out", str(tmp_path / "analysis")]) == 0
    tr = client.Tracker(cfg)
    state = ui_view.publish(tr.client, tr.experiment_id)
    columns = state["selectedColumns"]
    assert "metrics.`best_throughput_img_s`" in columns and "metrics.`peak_mem_mib`" in columns, columns
    assert not [c for c in columns if not c.startswith("metrics.")], columns
    (study,) = tr.find_runs("tags.role = 'study'")
    carried = {f"metrics.`{k}`" for k in study.data.metrics}
    assert [c for c in columns if c not in carried] == [], sorted(study.data.metrics)
    summary = json.loads((tmp_path / "analysis" / "summary.json").read_text())
    k = summary["strategies"]["ddp"]["best_throughput_at"]["k"]
    assert study.data.metrics["peak_mem_mib"] == study.data.metrics[f"peak_mem_mib.ddp.k{k}"]  # the best point's


def test_unavailable_study_says_why(views, tmp_path):
    from pipeline.host.devices import probe

    if probe().kind == "cuda":
        pytest.skip("dp is available on CUDA hosts")
    run_sweep(views, "dp", tmp_path / "dp.jsonl")
    (parent,) = client.Tracker(views).find_runs("tags.role = 'study' and tags.strategy = 'dp'")
    why = parent.data.tags["parallax.unavailable"]
    assert "CUDA" in why and why in parent.data.tags["mlflow.note.content"]
    assert parent.info.run_name == f"study dp · {client.pipeline_run()} (unavailable)"
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["study/n_complete"] == 0 and parent.data.metrics["study/n_skipped"] == 1


def test_existing_experiment_gets_the_kind_tag(make_cfg):
    cfg = make_cfg()
    tr = client.Tracker(cfg)
    tr.client.delete_experiment_tag(tr.experiment_id, "mlflow.experimentKind")
    assert "mlflow.experimentKind" not in tr.client.get_experiment(tr.experiment_id).tags
    tr = client.Tracker(cfg)
    assert tr.client.get_experiment(tr.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"


def test_summary_numbers_become_analysis_metrics():
    summary = {
        "n_trials": 4,
        "n_complete": 3,
        "synthetic_data": True,
        "host": "h",
        "target_acc": None,
        "strategies": {
            "ddp": {
                "status": "measured",
                "best_throughput_img_s": 900.5,
                "n_complete": 3,
                "best_throughput_at": {"k": 2},
                "parallel_devices": True,
            }
        },
    }
    assert client.summary_metrics(summary) == {
        "summary/n_complete": 3,
        "summary/n_trials": 4,
        "strategy/ddp/best_throughput_img_s": 900.5,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_optuna_dashboard_reads_the_study_back(tmp_path):
    pytest.importorskip("optuna_dashboard", reason="optuna-dashboard is not installed (pip install optuna-dashboard)")
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="views-single-0123456789", storage=url, direction="maximize")
    study_view.name_study(study, "single", "views", "0123456789")
    trial = study.ask()
    study_view.set_trial_numbers(
        trial,
        TrialRecord(
            throughput_img_s=1234.5,
            test_acc=[0.5, 0.8],
            peak_mem_bytes=[2**21, 2**20],
            mem_imbalance=1.33,
            epoch_s=[1.0, 2.0],
        ),
    )
    study.tell(trial, 0.8)
    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, optuna_dashboard; "
            "optuna_dashboard.run_server(sys.argv[1], host='127.0.0.1', port=int(sys.argv[2]))",
            url,
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline, studies = time.monotonic() + 60, None
        while studies is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as r:
                    studies = json.load(r)["study_summaries"]
            except OSError:
                assert server.poll() is None, server.stderr.read().decode()[-2000:]
                assert time.monotonic() < deadline, "optuna-dashboard did not answer within 60 s"
                time.sleep(0.5)
        (s,) = [s for s in studies if s["study_name"] == study.study_name]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/{s['study_id']}", timeout=10) as r:
            detail = json.load(r)
    finally:
        server.terminate()
        server.wait(10)
    assert detail["objective_names"] == ["final_test_acc"]  # optuna-dashboard serves study.metric_names under this key
    attrs = {a["key"]: a["value"] for a in detail["trials"][0]["user_attrs"]}
    assert float(attrs["throughput_img_s"]) == 1234.5 and float(attrs["peak_mem_mib"]) == 2.0
