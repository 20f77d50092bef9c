"""What DVC shows: metrics.json is flat numbers and a few flat labels (`dvc metrics show`, `dvc exp show`
columns), dvc.yaml declares it and the plots so that each experiment keeps its own copy, and every declared plot
names columns its CSV has."""

from __future__ import annotations

import csv
import json
import numbers

import pytest
import yaml

from pipeline.analysis.stage import analyze
from pipeline.records.trial import PROVENANCE

from ..analysis.test_analyze import row, write
from ..conftest import REPO


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    base = tmp_path_factory.mktemp("dvcviews")
    sweeps = base / "sweeps"
    sweeps.mkdir()
    rows = {
        "single": [row("single", k=1, B=128, thr=1000)],
        "ddp": [
            row("ddp", k=1, B=128, thr=1000, peaks=[100 * 2**20]),
            row("ddp", k=2, B=256, thr=1800, peaks=[300 * 2**20, 100 * 2**20]),
            row("ddp", k=2, B=256, lr=0.2, thr=1600, peaks=[300 * 2**20, 100 * 2**20]),
        ],
        "dp": [row("dp", k=1, B=128, state="skipped", trial="", reason="unavailable: needs CUDA")],
    }
    for s, rs in rows.items():
        write(rs, sweeps / f"{s}.jsonl")
    summary = analyze(sweeps, base / "analysis", expected=("single", "ddp", "dp"))
    return summary, base / "analysis"


def is_label(key: str) -> bool:
    """The string keys metrics.json documents (summary.flat_metrics): the data the figures are of, and per strategy
    the code, data and torch they were measured with. `dvc metrics diff` lists them without a difference."""
    return key == "data_source" or key.split(".")[0] in PROVENANCE


def test_metrics_file_is_flat_numbers(analysed):
    summary, out = analysed
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics, "metrics.json is empty"
    for key, value in metrics.items():
        if is_label(key):
            assert isinstance(value, str) and value, (key, value)
        else:
            assert isinstance(value, numbers.Number) and not isinstance(value, bool), (key, value)
        assert key and " " not in key, key
    assert metrics["data_source"] == "fashion-mnist"  # the rows' data, a label beside the numbers
    # the numbers are the analysis's: T(2)/(2 T(1)) with T(2) the median over lrs
    t1, t2 = 1000, (1800 + 1600) / 2
    assert metrics["throughput_img_s.ddp.k1"] == t1 and metrics["throughput_img_s.ddp.k2"] == t2
    assert metrics["weak_efficiency.ddp.k2"] == pytest.approx(t2 / (2 * t1))
    assert metrics["peak_mem_mib.ddp.k2"] == pytest.approx(300)
    assert metrics["n_trials"] == summary["n_trials"] == 5 and metrics["n_complete"] == 4
    assert metrics["n_measured"] == 4 and metrics["n_flagged"] == 0  # what a `-` in a result column comes from
    keys = list(metrics)  # dvc exp show's column order: the counts, then the results grouped by what they are
    assert keys[:4] == ["n_trials", "n_complete", "n_measured", "n_flagged"]
    groups = [k.split(".")[0] for k in keys[4:] if k != "under_load" and not is_label(k)]
    order = [
        "throughput_img_s",
        "weak_efficiency",
        "strong_efficiency",
        "peak_mem_mib",
        "final_test_acc",
        "best_test_acc",
        "load_cores",
    ]
    assert groups == sorted(groups, key=order.index)
    assert metrics["best_test_acc.ddp"] == pytest.approx(summary["strategies"]["ddp"]["best_test_acc"], rel=1e-3)
    # fewer columns: imbalance and per-strategy counts stay in summary.json
    assert not any(k.startswith(("mem_imbalance.", "n_complete.")) for k in metrics)
    # each key starts with the measurement's own name (the table's column or summary.json's), never a short alias
    assert not any(k.startswith(("eff.", "strong_eff.", "peak_mib.", "acc.", "under_load.")) for k in metrics)
    # undefined stays absent (no k=1 weak reference for single's k=2: single has no k=2; dp measured nothing)
    assert "weak_efficiency.ddp.k1" not in metrics and not any(k.startswith("throughput_img_s.dp.") for k in metrics)
    # summary.json keeps the structure (objects, sentences) and is no DVC metric
    assert isinstance(json.loads((out / "summary.json").read_text())["strategies"]["dp"]["reason"], str)


def test_metric_values_are_rounded_and_flagged_trials_counted(tmp_path):
    """metrics.json rounds (3 significant digits for efficiency, 4 for img/s) and counts a trial measured under
    interference as flagged, leaving its throughput out."""
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    write(
        [
            row("ddp", k=1, B=128, thr=1000.123),
            row("ddp", k=2, B=256, thr=1234.5678),
            {**row("ddp", k=2, B=256, lr=0.2, thr=9999), "interfered": True},
        ],
        sweeps / "ddp.jsonl",
    )
    analyze(sweeps, tmp_path / "analysis", expected=("ddp",))
    metrics = json.loads((tmp_path / "analysis" / "metrics.json").read_text())
    assert metrics["n_measured"] == 2 and metrics["n_flagged"] == 1
    assert metrics["throughput_img_s.ddp.k2"] == 1235 and metrics["weak_efficiency.ddp.k2"] == 0.617


def test_metric_keys_name_the_model_only_when_there_are_several(tmp_path):
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    write([row("ddp", k=1, B=128, thr=1000), row("ddp", k=1, B=128, thr=200, model="resnet18")], sweeps / "ddp.jsonl")
    analyze(sweeps, tmp_path / "analysis", expected=("ddp",))
    metrics = json.loads((tmp_path / "analysis" / "metrics.json").read_text())
    assert metrics["throughput_img_s.ddp.lenet.k1"] == 1000 and metrics["throughput_img_s.ddp.resnet18.k1"] == 200


def _analyze_stage():
    return yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["analyze"]


def _entries(items):
    return {
        path: (opts or {})
        for item in items
        for path, opts in (item.items() if isinstance(item, dict) else [(item, {})])
    }


def test_dvc_metric_is_the_flat_file_and_experiments_keep_it():
    stage = _analyze_stage()
    metrics = _entries(stage["metrics"])
    assert list(metrics) == ["results/analysis/metrics.json"]
    # cached: `dvc exp show` reads each experiment's copy from DVC's cache (results/ is not in git)
    assert metrics["results/analysis/metrics.json"].get("cache", True) is True
    outs = _entries(stage["outs"])
    assert "results/analysis/summary.json" in outs and "results/analysis/metrics.json" not in outs


def test_declared_plots_are_readable(analysed):
    _, out = analysed
    plots = _entries(_analyze_stage()["plots"])
    assert {p.rsplit("/", 1)[-1] for p in plots} == {"efficiency.csv", "throughput.csv", "memory.csv"}
    for path, opts in plots.items():
        assert opts.get("cache", True) is True, path
        assert opts.get("title") and opts.get("x_label") and opts.get("y_label"), path
        template = json.loads((REPO / ".dvc" / "plots" / f"{opts['template']}.json").read_text())
        assert template["data"] == {"values": "<DVC_METRIC_DATA>"} and "<DVC_METRIC_TITLE>" in json.dumps(template)
        with open(out / path.rsplit("/", 1)[-1], newline="") as f:
            header = next(csv.reader(f))
        assert opts["x"] in header and opts["y"] in header, (path, header)
