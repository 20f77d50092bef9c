"""benchmarks/gpu/gpu_first_run.py without a GPU: the plan (what it tells first, limits sized on a calibrated trial,
the 10-minute budget), the CPU refusal and the CPU rehearsal, the project root it finds from any folder, and the one
file it writes. These check the command's contract (order, sizing, budget, one row per finding); what the hardware
shows in those rows only a GPU run can say."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from benchmarks.gpu import gpu_first_run as fr
from pipeline.doctor import bundle
from pipeline.doctor.checks import plan as doctor_plan
from pipeline.host.devices import Host

from ..conftest import REPO

SCRIPT = REPO / "benchmarks" / "gpu" / "gpu_first_run.py"
ONE_GPU = Host("cuda", 1, "NVIDIA H200", "node", torch.__version__, "13.0")
TWO_CPUS = Host("cpu", 2, "a CPU", "host", torch.__version__, "")


def _by(plan) -> dict:
    return {s.name: s for s in plan}


def test_the_plan_tells_the_most_first_one_gpu_then_two_then_oversubscribed():
    names = [s.name for s in fr.PLAN]
    assert names[:3] == ["host", "data", "calibration"]  # the trial cost is measured before any sized step
    two = [i for i, s in enumerate(fr.PLAN) if s.devices > 1]
    one = [i for i, s in enumerate(fr.PLAN) if s.devices == 1 and i > 2 and s.name != "doctor_default"]
    assert max(one) < min(two) and names[-1] == "doctor_default"  # the only step with oversubscribed rows: last
    by = _by(fr.PLAN)
    assert by["doctor_breakdown_off"].doctor[1] == 1 and by["doctor_default"].doctor[1] == 2
    assert names.index("doctor_breakdown_off") < names.index("equivalence_tf32_on") < names.index("memory_single")
    assert {g for s in fr.PLAN for g in s.findings} | set(fr.UNCOVERED) <= set(fr.FINDINGS)
    assert "--dump-events" in by["doctor_default"].argv  # G1's replay fixture


def test_each_step_is_sized_on_its_trials_and_a_doctor_run_counts_from_doctors_own_plan():
    by = _by(fr.PLAN)
    for name in ("doctor_breakdown_off", "equivalence_tf32_on", "doctor_default"):
        step = by[name]
        strategies, max_devices = step.doctor
        argv = " ".join(step.argv)  # the command runs the strategies and k its count was read from
        assert f"--strategies {','.join(strategies)} --max-devices {max_devices}" in argv
        n = fr.trials(step, ONE_GPU)
        assert n == 1 + 2 * len(doctor_plan(ONE_GPU, strategies, max_devices))  # reference + 2 per case
        assert fr.limit_s(step, ONE_GPU, 7.0) == n * 7.0 * fr.SAFETY + fr.MARGIN_S
    # the H200 run: doctor rows of 15 to 21 s, two trials each (8 to 10 s a trial); the k=1 doctor's 7 rows
    # (~150 s with its reference) fit a limit sized on 8 s a trial, unlike the guessed 115 s
    assert fr.trials(by["doctor_breakdown_off"], ONE_GPU) == 15
    assert fr.limit_s(by["doctor_breakdown_off"], ONE_GPU, 8.0) > 7 * 21 + 10
    assert fr.limit_s(by["equivalence_tf32_on"], ONE_GPU, 8.0) > 2 * 21 + 10
    assert all(fr.limit_s(s, ONE_GPU, 8.0) == s.fixed_s for s in fr.PLAN if s.fixed_s)
    # within ten minutes on one GPU at the stated default cost per trial
    expected = sum(fr.trials(s, ONE_GPU) for s in fr.PLAN if s.devices == 1) * fr.DEFAULT_TRIAL_S
    assert expected <= 580


def test_dry_run_prints_each_steps_trials_and_sized_limit_on_any_host(tmp_path):
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--gpus", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert f"per-trial cost: {fr.DEFAULT_TRIAL_S:g} s, the stated default" in run.stdout and "budget" in run.stdout
    assert all(s.name in run.stdout for s in fr.PLAN)
    assert "doctor_breakdown_off [G2, G4, G13, G19, G21, G22] 15 trials, limit 320 s" in run.stdout
    assert "skipped here: needs 2 GPUs" in run.stdout
    given = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--gpus", "1", "--trial-s", "4"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "per-trial cost: 4 s, given (--trial-s)" in given.stdout and "15 trials, limit 140 s" in given.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for hosts without CUDA")
def test_a_cpu_host_is_refused_with_exit_2_unless_allowed(tmp_path):
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 2 and "needs CUDA" in run.stderr and "--allow-cpu" in run.stderr
    assert not (tmp_path / "first-run.md").exists()


def test_steps_are_sized_on_the_calibration_and_run_within_the_budget(tmp_path):
    seen = []

    def runner(step, out, timeout_s):
        seen.append((step.name, timeout_s))
        if step.calibrates:
            return fr.Result(step.name, "passed", seconds=3.0)
        return fr.Result(step.name, "timeout" if step.name == "memory_single" else "passed", seconds=1.0)

    results, cost = fr.run_plan(fr.PLAN, tmp_path, budget_s=580, host=ONE_GPU, runner=runner)
    assert [r.step for r in results] == [s.name for s in fr.PLAN]
    assert cost["trial_s"] == 3.0 and "calibration" in cost["from"]
    by = _by(fr.PLAN)
    for name, timeout_s in seen:  # the later steps' limits come from the measured 3 s
        assert timeout_s == fr.limit_s(by[name], ONE_GPU, 3.0 if fr.PLAN.index(by[name]) > 2 else fr.DEFAULT_TRIAL_S)
    skipped = {r.step for r in results if r.status == "skipped"}
    assert skipped == {s.name for s in fr.PLAN if s.devices > 1}  # one GPU: the k=2 steps say why they did not run
    assert all("needs 2 GPUs, this node has 1" == r.why for r in results if r.status == "skipped")
    assert [r.status for r in results if r.step == "memory_single"] == ["timeout"]  # and the next steps still ran
    assert results[-1].status == "passed" and results[-1].trials == fr.trials(by["doctor_default"], ONE_GPU)

    spent, _ = fr.run_plan(fr.PLAN, tmp_path, budget_s=5, host=Host("cuda", 8, "", "", "", ""), runner=runner)
    assert {r.status for r in spent} == {"not run"} and "budget was spent" in spent[0].why

    # a step whose trials need more than is left is not started: here every doctor run, at 30 s a trial
    tight, _ = fr.run_plan(fr.PLAN, tmp_path, budget_s=200, host=ONE_GPU, runner=runner, trial_s=30)
    status = {r.step: r for r in tight}
    assert status["calibration"].status == "skipped" and "--trial-s" in status["calibration"].why
    assert status["doctor_breakdown_off"].status == "not run" and "15 trials need about 450 s" in (
        status["doctor_breakdown_off"].why
    )
    assert status["memory_single"].status == "timeout" and status["memory_single"].limit_s == 80  # 30 x 2 + 20


def test_a_cpu_rehearsal_skips_each_cuda_only_step_with_its_reason(tmp_path):
    plan = fr.build_plan("cpu")
    assert [s.name for s in plan] == [s.name for s in fr.PLAN]  # the same plan, smaller
    assert _by(plan)["doctor_default"].doctor == (fr.CPU_DOCTOR, 2) and "--steps" in _by(plan)["doctor_default"].argv
    results, _ = fr.run_plan(plan, tmp_path, 580, TWO_CPUS, runner=lambda s, o, t: fr.Result(s.name, "passed"))
    for r, s in zip(results, plan):
        assert (r.status, bool(r.why)) == (("skipped", True) if s.cuda_only else ("passed", False))
        assert not s.cuda_only or r.why == f"needs CUDA: {s.cuda_only}"
    assert {r.step for r in results if r.status == "skipped"} == {
        "equivalence_tf32_on",
        "equivalence_tf32_off",
        "dp_output_device_1",
        "memory_dp_k2",
        "collectives",
    }


def test_the_root_is_found_from_the_files_place_in_a_checkout_or_a_bundle(tmp_path):
    """The steps' configuration comes from the checkout or bundle the script is in, never from the current folder
    (the H200 run, outside a checkout, failed its data step on that)."""
    assert fr.project_root() == REPO
    assert fr.project_root(tmp_path) is None
    bundle.carry(tmp_path / "gpu-bundle", None)  # what `make gpu-bundle` carries beside the wheels
    assert fr.project_root(tmp_path / "gpu-bundle") == tmp_path / "gpu-bundle"
    assert (tmp_path / "gpu-bundle" / "params.yaml").exists()
    sets = fr.config(tmp_path / "out", REPO)
    assert sets == ["--set", "data.source=synthetic", "--set", f"data.dir={tmp_path / 'out' / 'data'}"]
    assert fr.config(tmp_path / "out", None)[-2:] == ["--set", "profile="]  # no profiles: the built-in defaults


def test_the_report_has_one_row_per_finding_with_figures_or_not_exercised(tmp_path):
    step_dir = tmp_path / "steps" / "memory_single"
    step_dir.mkdir(parents=True)
    (step_dir / "metrics.json").write_text(
        json.dumps({"peak_mem_bytes": [123], "resident_bytes": [45], "epoch_s": [1.5], "unrelated": "x"})
    )
    results = [
        fr.Result("memory_single", "passed", seconds=2.0, exit=0, figures=fr.figures(step_dir), trials=1, limit_s=40),
        fr.Result("doctor_default", "failed", "RuntimeError: boom", 3.0, 1),
        fr.Result("dp_output_device_1", "skipped", "needs 2 GPUs, this node has 1"),
    ]
    fr.write_report(tmp_path / "first-run.md", fr.PLAN, results, {"gpus": 1})
    text = (tmp_path / "first-run.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("| G")]
    assert [line.split(" | ")[0][2:] for line in table] == list(fr.FINDINGS)  # G1..G22, once each, in order
    assert "| memory_single | passed | 1 | 40 | 2.0 | - |" in text  # trials and the limit it ran under
    report = fr.load(tmp_path / "first-run.md")
    by = {r["finding"]: r for r in report["findings"]}
    assert by["G3"]["exercised"] and by["G3"]["figures"]["memory_single"]["metrics.peak_mem_bytes"] == [123]
    assert "unrelated" not in json.dumps(by["G3"]["figures"])
    assert by["G1"]["exercised"] and "boom" in by["G1"]["showed"]  # ran and failed: said, with the error
    assert not by["G5"]["exercised"] and "needs 2 GPUs" in by["G5"]["showed"]
    assert by["G11"]["showed"].startswith("not exercised: ") and report["facts"] == {"gpus": 1}


class _Killed(BaseException):
    """An outer limit ending the run mid-step (a kill, not an error the run could catch and report)."""


def test_the_report_is_on_disk_after_every_step_and_a_killed_run_leaves_the_steps_done(tmp_path, monkeypatch):
    """first-run.md is rewritten after each step: when step i starts, steps 1..i-1 are in it with their outcome and
    the rest are "not run" because the check stopped before them; a run killed in its fourth step leaves that."""
    out, seen = tmp_path / "first-run", []

    def spawn(cmd, step_out, base, env, timeout_s):
        on_disk = fr.load(out / "first-run.md") if (out / "first-run.md").exists() else None
        seen.append((step_out.name, on_disk and [(s["step"], s["status"], s["why"]) for s in on_disk["steps"]]))
        if len(seen) == 4:
            raise _Killed
        return 0, "", ""

    monkeypatch.setattr(fr, "_spawn", spawn)
    with pytest.raises(_Killed):
        fr.main(["--allow-cpu", "--out", str(out), "--trial-s", "1"])
    plan = [s.name for s in fr.build_plan("cuda" if torch.cuda.is_available() else "cpu")]
    ran = [name for name, _ in seen]
    for i, (name, steps) in enumerate(seen):
        before = plan[: plan.index(name)]
        assert steps is not None and [s[0] for s in steps] == plan, f"no whole report when {name} started"
        done = [(n, st) for n, st, _ in steps if n in before]
        assert [n for n, st in done if st == "passed"] == ran[:i]  # each step run so far, with its outcome
        assert all(st in ("passed", "skipped") for _, st in done)
        assert all((st, why) == ("not run", fr.STOPPED) for n, st, why in steps if n not in before)
    last = fr.load(out / "first-run.md")  # what the killed run leaves: three steps run, the rest not reached
    assert [s["step"] for s in last["steps"] if s["status"] == "passed"] == ran[:3]
    assert {s["why"] for s in last["steps"][plan.index(ran[3]) :]} == {fr.STOPPED}
    assert "trial_s" in last["facts"]


def test_a_hanging_step_is_killed_at_its_timeout_and_a_rejected_option_falls_back(tmp_path):
    """run_step itself, on stand-in commands: a sleep past its timeout (its child too), and an option this build's
    CLI rejects."""
    hang = fr.Step(
        "hang",
        ("G4",),
        "sleeps, and so does its child",
        ("-c", "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"),
    )
    r = fr.run_step(hang, tmp_path / "steps" / "hang", timeout_s=1)
    assert r.status == "timeout" and r.seconds < 30  # a child holding the output open does not hold the step
    cli = (
        "import argparse, json; p = argparse.ArgumentParser(); p.add_argument('--out'); a = p.parse_args(); "
        "open(a.out + '/r.json', 'w').write(json.dumps({'img_s': 5.0}))"
    )
    step = fr.Step(
        "cli",
        ("G1",),
        "a CLI without --dump-events",
        ("-c", cli, "--out", "{out}", "--dump-events", "x"),
        fallback=("-c", cli, "--out", "{out}"),
    )
    r = fr.run_step(step, tmp_path / "steps" / "cli", timeout_s=30)
    assert r.status == "passed" and "rejects --dump-events" in r.why and r.figures == {"r.img_s": 5.0}
    assert "--dump-events" not in (tmp_path / "steps" / "cli" / "log.txt").read_text().splitlines()[0]


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU rehearsal; a CUDA host runs the real check")
def test_the_cpu_rehearsal_runs_end_to_end_from_a_folder_outside_the_checkout(tmp_path):
    """The whole plan on this CPU, started as run.sh starts it (the code on PYTHONPATH, the current folder
    elsewhere, no DVC_ROOT): every step that runs on a CPU passes within its sized limit and the budget, and each
    CUDA-only step says why it was skipped. The H200 run failed its data step on the current folder and timed out
    four steps on guessed limits; this proves neither can recur, not what a GPU shows."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DVC_ROOT", "DVC_STAGE", "TORCHINDUCTOR_CACHE_DIR")}
    env["PYTHONPATH"] = str(REPO)
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu.gpu_first_run", "--allow-cpu", "--out", str(tmp_path / "first-run")],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = fr.load(tmp_path / "first-run" / "first-run.md")
    steps = {s["step"]: s for s in report["steps"]}
    plan = _by(fr.build_plan("cpu"))
    for name, s in steps.items():
        logs = tmp_path / "first-run" / "steps" / name / "log.txt"
        detail = f"{name}: {s}\n" + (logs.read_text()[-2000:] if logs.exists() else "")
        if plan[name].cuda_only:
            assert s["status"] == "skipped" and s["why"] == f"needs CUDA: {plan[name].cuda_only}", detail
        else:
            assert s["status"] == "passed" and s["why"] == "", detail  # no path, limit or budget failure
            assert s["limit_s"] and s["seconds"] < s["limit_s"], detail
    assert "calibration step" in report["facts"]["trial_s_from"] and report["facts"]["trial_s"] > 0
    assert report["facts"]["configuration"].startswith(str(REPO))
    assert (tmp_path / "first-run" / "data" / "manifest.json").exists()  # the data in OUT, not in a checkout
    assert not list(elsewhere.iterdir())  # nothing in the current folder
