"""The MLflow runs-table view Parallax shares (pipeline/tracking/ui_view.py): written as MLflow's own share tag on a
real
store, with the columns the store has, and still matching what the installed MLflow UI reads."""

import json
import re
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")
from mlflow import MlflowClient  # noqa: E402

from pipeline.tracking import ui_view  # noqa: E402

BUNDLE = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"


def _store(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.create_experiment("parallax", artifact_location=(tmp_path / "artifacts").as_uri())
    parent = client.create_run(exp, run_name="study ddp")
    client.log_metric(parent.info.run_id, "best_throughput_img_s", 5000.0)
    for k in (1, 2):
        run = client.create_run(exp, run_name=f"trial k={k}", tags={"mlflow.parentRunId": parent.info.run_id})
        client.log_param(run.info.run_id, "devices", k)
        client.log_param(run.info.run_id, "batch_size", 128)
        client.log_metric(run.info.run_id, "throughput_img_s", 2500.0 * k)
    return client, exp, parent.info.run_id


def test_publish_writes_mlflows_share_tag_with_the_columns_the_store_has(tmp_path):
    client, exp, _ = _store(tmp_path)
    route = ui_view.publish_view(client, exp)
    tag = client.get_experiment(exp).tags["mlflow.sharedViewState.parallax"]
    state = json.loads(tag)
    # the study rows' numbers only: a trial's parameters and img/s are `-` on every study row
    assert state["selectedColumns"] == ["metrics.`best_throughput_img_s`"]
    assert state["orderByKey"] == "attributes.start_time"  # the one order under which MLflow nests trials
    assert state["columnOrder"] == ["attributes.`Run Name`", "runDateAndNestInfo", "metrics.`best_throughput_img_s`"]
    assert set(state["columnWidths"]) == set(state["columnOrder"])
    assert state["runsExpanded"] == {}  # MLflow does not share expanded rows: the studies show their summaries
    assert state["lifecycleFilter"] == "Active" and state["runsPinned"] == [] and state["groupBy"] is None
    assert route == f"#/experiments/{exp}/runs?workflowType=machine_learning&viewStateShareKey=parallax"


def test_publishing_again_follows_new_runs(tmp_path):
    client, exp, _ = _store(tmp_path)
    ui_view.publish(client, exp)
    run = client.create_run(exp, run_name="study zero1")
    client.log_metric(run.info.run_id, "weak_efficiency", 0.8)
    state = ui_view.publish(client, exp)
    assert "metrics.`weak_efficiency`" in state["selectedColumns"]
    assert json.loads(client.get_experiment(exp).tags["mlflow.sharedViewState.parallax"]) == state


def test_a_refused_tag_is_a_warning_not_a_failure(capsys):
    class ReadOnly:
        def search_runs(self, *a, **k):
            return []

        def set_experiment_tag(self, *a):
            raise PermissionError("read-only store")

    assert ui_view.publish_view(ReadOnly(), "1") is None
    assert "runs-table view was not written (PermissionError: read-only store)" in capsys.readouterr().err


def _bundle() -> str:
    files = sorted(BUNDLE.glob("main.*.js"))
    if not files:
        pytest.skip(f"the installed MLflow has no UI bundle under {BUNDLE}")
    return files[0].read_text(errors="replace")


def test_the_installed_mlflow_ui_reads_this_tag_link_and_state():
    """If an MLflow upgrade renames the share tag, the URL parameters or the page-state fields, this fails: the view
    would silently stop applying."""
    js = _bundle()
    assert f'"{ui_view.SHARE_TAG_PREFIX}"' in js and '"viewStateShareKey"' in js
    assert '"workflowType"' in js and '"machine_learning"' in js
    fields = re.search(r'\["selectedColumns","columnOrder",[^\]]*\]', js)
    assert fields, "MLflow's list of page-state fields was not found in its bundle"
    ui_fields = set(json.loads(fields.group(0)))
    ours = set(ui_view.UI_DEFAULTS) | {"selectedColumns", "runsExpanded"}
    # every field the UI keeps is set (it replaces its state with the shared one); charts' own config may be unset
    assert ui_fields - ours <= {"compareRunCharts", "compareRunSections", "chartsSearchFilter"}, ui_fields - ours
    assert ours <= ui_fields, ours - ui_fields  # nothing the UI does not know
    facets = re.search(
        r'\["searchFilter","orderByKey",[^\]]*\]', "".join(p.read_text(errors="replace") for p in BUNDLE.glob("*.js"))
    )
    assert facets and set(json.loads(facets.group(0))) == set(ui_view.FACETS)
    # the runs table's column ids the view sets widths for: Run Name's and Created's (its grid's field name)
    table = "".join(
        p.read_text(errors="replace")
        for p in BUNDLE.glob("*.js")
        if "RunNameCellRenderer" in p.read_text(errors="replace")
    )
    assert '"Run Name"' in table and f'field:"{ui_view.CREATED}"' in table


def test_the_view_shows_the_latest_pipeline_run_with_columns_in_reading_order(tmp_path):
    """Runs of two pipeline runs (DVC experiments): the view filters to the newer one's runs by the
    parallax.pipeline_run tag, and orders the columns the answer first: best img/s and weak efficiency, then peak
    MiB, best accuracy, largest k, flagged, worst imbalance; every column under its source's own name, none a
    trial's parameter or a trial-only number."""
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.create_experiment("parallax", artifact_location=(tmp_path / "artifacts").as_uri())
    for n, group in enumerate(("exp-old", "exp-new")):
        parent = client.create_run(
            exp, run_name=f"{group} · study ddp", start_time=1000 * (n + 1), tags={"parallax.pipeline_run": group}
        )
        study_row = {
            "best_throughput_img_s": 20.0,
            "weak_efficiency": 0.9,
            "largest_k": 2,
            "best_test_acc": 0.5,
            "worst_mem_imbalance": 1.1,
        }
        for k, v in study_row.items():
            client.log_metric(parent.info.run_id, k, v)
        run = client.create_run(
            exp,
            run_name="ddp k=2",
            start_time=1000 * (n + 1) + 1,
            tags={"mlflow.parentRunId": parent.info.run_id, "parallax.pipeline_run": group},
        )
        for k, v in {"strategy": "ddp", "devices": 2, "batch_size": 64, "lr": 0.1}.items():
            client.log_param(run.info.run_id, k, v)
        trial_row = {
            "flagged": 1.0,
            "final_test_acc": 0.5,
            "peak_mem_mib": 12.0,
            "throughput_img_s": 10.0,
            "mem_imbalance": 1.1,
        }
        for k, v in trial_row.items():
            client.log_metric(run.info.run_id, k, v)
    state = ui_view.publish(client, exp)
    assert state["searchFilter"] == "tags.`parallax.pipeline_run` = 'exp-new'"
    assert state["selectedColumns"] == [
        "metrics.`best_throughput_img_s`",
        "metrics.`weak_efficiency`",
        "metrics.`peak_mem_mib`",
        "metrics.`best_test_acc`",
        "metrics.`largest_k`",
        "metrics.`flagged`",
        "metrics.`worst_mem_imbalance`",
    ]
    assert state["selectedColumns"] == list(ui_view.COLUMNS)  # every column, in COLUMNS' order
    shown = client.search_runs([exp], filter_string=state["searchFilter"])
    assert {r.info.run_name for r in shown} == {"exp-new · study ddp", "ddp k=2"} and len(shown) == 2


def test_a_standalone_train_run_after_the_sweep_does_not_hide_it(tmp_path):
    """The report's own `python -m pipeline train ...`, run after the pipeline, is the newest run with a pipeline_run
    tag of its own; the view still shows the sweep's runs (those of the newest study run)."""
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.create_experiment("parallax", artifact_location=(tmp_path / "artifacts").as_uri())
    client.create_run(
        exp, run_name="pr1 · study ddp", start_time=1000, tags={"parallax.pipeline_run": "pr1", "role": "study"}
    )
    client.create_run(exp, run_name="single k=1", start_time=5000, tags={"parallax.pipeline_run": "train-later"})
    assert ui_view.publish(client, exp)["searchFilter"] == "tags.`parallax.pipeline_run` = 'pr1'"
