"""The MLflow `analysis` run carries the figures (keyed images and artifacts); trial runs carry MLflow's system
metrics only when tracking.system_metrics is on."""

from __future__ import annotations

import socket

import pytest

from pipeline.cli import main
from pipeline.tracking import analysis_run, client

from ..analysis.test_analyze import row, write


def _params(tmp_path, synthetic_root):
    (tmp_path / "params.yaml").write_text(
        f"profile: ''\ndata: {{source: synthetic, dir: {synthetic_root}, "
        f"train_limit: 512, test_limit: 256}}\ntrain: {{warmup_steps: 1}}\n"
    )


def _analyzed(make_cfg, tmp_path, synthetic_root):
    """`analyze` over a two-point ddp sweep (k=1 at 1000 img/s, k=2 at 1800); (its tracker, its output folder)."""
    cfg = make_cfg()
    _params(tmp_path, synthetic_root)
    sweeps = tmp_path / "results" / "sweeps"
    sweeps.mkdir(parents=True)
    write([row("ddp", k=1, B=128, thr=1000), row("ddp", k=2, B=256, thr=1800)], sweeps / "ddp.jsonl")
    out = tmp_path / "analysis"
    assert main(["analyze", "--sweeps", str(sweeps), "--out", str(out)]) == 0
    return client.Tracker(cfg), out


def test_analysis_run_carries_figures_and_numbers(make_cfg, tmp_path, synthetic_root):
    tr, out = _analyzed(make_cfg, tmp_path, synthetic_root)
    (run,) = tr.find_runs("tags.stage = 'analyze'")
    assert run.info.status == "FINISHED" and run.data.metrics["strategy/ddp/best_throughput_img_s"] == 1800
    figures = sorted(p.stem for p in out.glob("*.png"))
    assert "efficiency" in figures and "memory" in figures
    images = {f.path for f in tr.client.list_artifacts(run.info.run_id, "images")}
    assert {"efficiency", "throughput", "memory", "accuracy"} <= set(analysis_run.CHARTS) & set(figures)
    for name in set(analysis_run.CHARTS) & set(figures):  # a keyed image per chart (the run page), and every PNG
        assert any(p.startswith(f"images/figures~{name}+step") for p in images), (name, sorted(images))
    top = {f.path for f in tr.client.list_artifacts(run.info.run_id)}
    assert {f"{name}.png" for name in figures} <= top and "metrics.json" in top
    # the run's description is the report's opening, up to and including its reading of the results
    note, report = run.data.tags["mlflow.note.content"], (out / "report.md").read_text()
    assert "## Host" in note and "## Reading" in note and len(note) < len(report)


def test_the_analysis_runs_description_opens_on_the_answer(make_cfg, tmp_path, synthetic_root):
    """MLflow shows a description's first lines and hides the rest behind "Show more": they are the answer's, the
    recommendation first, not the report's title and warning."""
    tr, out = _analyzed(make_cfg, tmp_path, synthetic_root)
    (run,) = tr.find_runs("tags.stage = 'analyze'")
    note, report = run.data.tags["mlflow.note.content"], (out / "report.md").read_text()
    answer = report.split("## Answer\n", 1)[1].split("\n## ", 1)[0].strip()
    assert answer.startswith("**") and note.startswith(answer.split("\n")[0]), note[:300]
    assert note.startswith(answer) and note.count(answer.split("\n")[0]) == 1  # once, and whole
    assert "## Answer" not in note and "# Parallax analysis report" not in note


def test_report_head_puts_the_answer_first_and_stops_after_the_reading():
    text = (
        "# R\n\n> warning\n\n## Answer\n\n**Use ddp at k=2**\n- Why: w\n\n## Host\nh\n\n"
        "## Reading\n- best: ddp\n\n## Strategies\n| table |\n"
    )
    head = analysis_run.report_head(text)
    assert head.startswith("**Use ddp at k=2**\n- Why: w\n\n> warning\n\n## Host"), head
    assert "- best: ddp" in head and "| table |" not in head and "# R\n" not in head
    assert analysis_run.report_head("# R\n\n> warning\n\n## Reading\n- r\n").startswith("> warning\n\n## Reading")
    assert analysis_run.report_head("x" * 50, limit=10).startswith("x" * 10 + "\n")


def _trial(make_cfg, tmp_path, synthetic_root, *sets):
    cfg = make_cfg(*sets)
    _params(tmp_path, synthetic_root)
    out = tmp_path / "t"
    assert (
        main(
            [
                "train",
                "--strategy",
                "single",
                "--devices",
                "1",
                "--epochs",
                "1",
                "--max-steps",
                "4",
                "--batch-size",
                "64",
                "--out",
                str(out),
                "--quiet",
                *[x for s in sets for x in ("--set", s)],
            ]
        )
        == 0
    )
    (run,) = client.Tracker(cfg).find_runs("tags.dvc_stage = 'train'")
    return run


def test_system_metrics_are_off_by_default(make_cfg, tmp_path, synthetic_root):
    run = _trial(make_cfg, tmp_path, synthetic_root)
    assert not any(k.startswith("system/") for k in run.data.metrics)
    assert "peak_mem_mib_dev0" in run.data.metrics


def test_system_metrics_when_asked(make_cfg, tmp_path, synthetic_root):
    pytest.importorskip("psutil", reason="MLflow's system metrics need psutil")
    run = _trial(
        make_cfg, tmp_path, synthetic_root, "tracking.system_metrics=true", "tracking.system_metrics_interval_s=0.1"
    )
    m = run.data.metrics
    node = socket.gethostname()  # the trial's ranks ran on this host: its metrics carry its name (MLflow's node_id)
    assert f"system/{node}/cpu_utilization_percentage" in m and f"system/{node}/system_memory_usage_megabytes" in m
    assert not [k for k in m if k.startswith("system/") and not k.startswith(f"system/{node}/")]
    assert "peak_mem_mib_dev0" in m  # beside the allocator's per-device peaks, never instead
