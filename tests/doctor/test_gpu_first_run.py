"""benchmarks/gpu/gpu_first_run.py without a GPU: the plan (review order, 10-minute budget), the CPU refusal, and the
one
file it writes, from stubbed steps. These check the command's contract (order, budget, per-step timeouts, one row
per finding); what the hardware shows in those rows only a GPU run can say."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from benchmarks.gpu import gpu_first_run as fr

from ..conftest import REPO

SCRIPT = REPO / "benchmarks" / "gpu" / "gpu_first_run.py"


def test_the_plan_follows_the_reviews_order_within_ten_minutes():
    names = [s.name for s in fr.PLAN]
    order = [
        "doctor_breakdown_off",
        "doctor_default",
        "dp_output_device_1",
        "equivalence_tf32_on",
        "memory_single",
        "collectives",
        "overlap",
    ]  # the GPU review's "Proposed order for the first GPU run"
    assert [n for n in names if n in order] == order
    assert sum(s.timeout_s for s in fr.PLAN) <= 600 and all(s.timeout_s > 0 for s in fr.PLAN)
    assert {g for s in fr.PLAN for g in s.findings} | set(fr.UNCOVERED) <= set(fr.FINDINGS)
    assert "--dump-events" in fr.PLAN[names.index("doctor_default")].argv  # G1's replay fixture


def test_dry_run_lists_the_plan_on_any_host():
    run = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert all(s.name in run.stdout for s in fr.PLAN) and "budget" in run.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for hosts without CUDA")
def test_a_cpu_host_is_refused_with_exit_2(tmp_path):
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 2 and "needs CUDA" in run.stderr
    assert not (tmp_path / "first-run.md").exists()


def test_steps_run_in_order_each_under_its_own_timeout_and_the_budget(tmp_path):
    seen = []

    def runner(step, out, timeout_s):
        seen.append((step.name, timeout_s))
        return fr.Result(step.name, "timeout" if step.name == "doctor_default" else "passed", seconds=1.0)

    results = fr.run_plan(fr.PLAN, tmp_path, budget_s=580, gpus=1, runner=runner)
    assert [r.step for r in results] == [s.name for s in fr.PLAN]
    skipped = {r.step for r in results if r.status == "skipped"}
    assert skipped == {s.name for s in fr.PLAN if s.devices > 1}  # one GPU: the k=2 steps say why they did not run
    assert all(t <= s.timeout_s for (_, t), s in zip(seen, [s for s in fr.PLAN if s.devices == 1]))
    assert [r.status for r in results if r.step == "doctor_default"] == ["timeout"]  # and the next steps still ran
    spent = fr.run_plan(fr.PLAN, tmp_path, budget_s=5, gpus=8, runner=runner)
    assert {r.status for r in spent} == {"not run"}


def test_the_report_has_one_row_per_finding_with_figures_or_not_exercised(tmp_path):
    step_dir = tmp_path / "steps" / "memory_single"
    step_dir.mkdir(parents=True)
    (step_dir / "metrics.json").write_text(
        json.dumps({"peak_mem_bytes": [123], "resident_bytes": [45], "epoch_s": [1.5], "unrelated": "x"})
    )
    results = [
        fr.Result("memory_single", "passed", seconds=2.0, exit=0, figures=fr.figures(step_dir)),
        fr.Result("doctor_default", "failed", "RuntimeError: boom", 3.0, 1),
        fr.Result("dp_output_device_1", "skipped", "needs 2 GPUs, this node has 1"),
    ]
    fr.write_report(tmp_path / "first-run.md", fr.PLAN, results, {"gpus": 1})
    text = (tmp_path / "first-run.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("| G")]
    assert [line.split(" | ")[0][2:] for line in table] == list(fr.FINDINGS)  # G1..G22, once each, in order
    report = fr.load(tmp_path / "first-run.md")
    by = {r["finding"]: r for r in report["findings"]}
    assert by["G3"]["exercised"] and by["G3"]["figures"]["memory_single"]["metrics.peak_mem_bytes"] == [123]
    assert "unrelated" not in json.dumps(by["G3"]["figures"])
    assert by["G1"]["exercised"] and "boom" in by["G1"]["showed"]  # ran and failed: said, with the error
    assert not by["G5"]["exercised"] and "needs 2 GPUs" in by["G5"]["showed"]
    assert by["G11"]["showed"].startswith("not exercised: ") and report["facts"] == {"gpus": 1}


def test_a_hanging_step_is_killed_at_its_timeout_and_a_rejected_option_falls_back(tmp_path):
    """run_step itself, on stand-in commands: a sleep past its timeout, and an option this build's CLI rejects."""
    hang = fr.Step("hang", ("G4",), "sleeps", ("-c", "import time; time.sleep(60)"), 1)
    r = fr.run_step(hang, tmp_path / "steps" / "hang", timeout_s=1)
    assert r.status == "timeout" and r.seconds < 30
    cli = (
        "import argparse, json; p = argparse.ArgumentParser(); p.add_argument('--out'); a = p.parse_args(); "
        "open(a.out + '/r.json', 'w').write(json.dumps({'img_s': 5.0}))"
    )
    step = fr.Step(
        "cli",
        ("G1",),
        "a CLI without --dump-events",
        ("-c", cli, "--out", "{out}", "--dump-events", "x"),
        30,
        fallback=("-c", cli, "--out", "{out}"),
    )
    r = fr.run_step(step, tmp_path / "steps" / "cli", timeout_s=30)
    assert r.status == "passed" and "rejects --dump-events" in r.why and r.figures == {"r.img_s": 5.0}
