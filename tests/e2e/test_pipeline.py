"""`dvc repro` end to end on a tiny profile, in a temporary copy of the repository (as a fresh clone would)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.project import copy_tracked

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

TINY = """description: |
  Test profile: the smallest sweep that exercises every stage.
data: {train_limit: 1024, test_limit: 256}
# on a busy host (CI beside other work) trials are flagged as measured under interference: the figures stay, labelled
# under load (tests/analysis/test_under_load.py); the wait for a quiet moment is kept short
train: {epochs: 1, warmup_steps: 1}
sweep:
  sampler: grid
  quiet_wait_s: 2
  repeats: 1                 # dvc.yaml tracks these keys of a profile: it must define them
  remeasure_interfered: 0
  emulated_max_steps: 0
  spaces:
    default: {devices: [1, 2], batch_size: [128], lr: [0.2]}
    single: {devices: [1], batch_size: [128], lr: [0.2]}
analyze: {target_acc: 0.5}
slurm: {}
"""


# the overlap and collectives stages at their smallest sizes and repeats: every stage runs, in seconds
SMALL_MEASUREMENTS = {
    "overlap: {}": "overlap: {size: 16, chain: 1, items: 1, reps: 3, warmup: 0}",
    "collectives: {}": "collectives: {reps: 2, warmup: 0, fit_sizes: 2}",
}


def small_measurements(params: str) -> str:
    """params.yaml's text with SMALL_MEASUREMENTS' sections; fails where one is no longer there to replace."""
    for old, new in SMALL_MEASUREMENTS.items():
        assert old in params, f"params.yaml has no line {old!r} to replace"
        params = params.replace(old, new)
    return params


def run(cmd, cwd, unset=(), **kw):
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    for key in ("DVC_ROOT", *unset):
        env.pop(key, None)
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, **kw)
    assert p.returncode == 0, f"{cmd} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    dst = tmp_path_factory.mktemp("clone")
    copy_tracked(dst, extra=("pipeline/data/store.py", "pipeline/analysis/stage.py"))
    (dst / "experiments" / "tiny.yaml").write_text(TINY)
    params = (
        (dst / "params.yaml")
        .read_text()
        .replace("profile: cpu", "profile: tiny")
        .replace("source: fashion-mnist", "source: synthetic")
    )
    (dst / "params.yaml").write_text(small_measurements(params))
    for cmd in (
        ["git", "init", "-q"],
        ["git", "add", "-A"],
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "clone"],
    ):
        run(cmd, dst)
    return dst


@pytest.mark.slow
def test_dvc_repro_runs_every_stage(clone):
    run(["dvc", "repro"], clone)
    strategies = yaml.safe_load((clone / "dvc.yaml").read_text())["stages"]["sweep"]["foreach"]
    assert "single" in strategies and "fsdp" in strategies
    for s in strategies:
        assert (clone / "results" / "sweeps" / f"{s}.jsonl").exists()
    out = clone / "results" / "analysis"
    for f in ("summary.json", "report.md", "efficiency.csv", "memory.csv", "efficiency.png", "memory.png"):
        assert (out / f).exists(), f
    report = (out / "report.md").read_text()
    assert "synthetic" in report.lower()
    shown = json.loads(run(["dvc", "metrics", "show", "--json"], clone).stdout)
    # {rev: {"data": {path: {"data": {...}}}}}; a file DVC could not read carries "error" instead of "data"
    files = next(iter(shown.values()))["data"]
    metrics = files["results/analysis/metrics.json"]
    assert "error" not in metrics, metrics
    assert metrics["data"]["n_complete"] > 0 and metrics["data"]["throughput_img_s.single.k1"] > 0
    # a busy host's figures are labelled, never dropped; a quiet host's carry no label
    assert "under_load" in metrics["data"]
    if metrics["data"]["under_load"]:
        assert "**Measured under load**" in report
    # nothing left to do after a repro; rerunning one stage works
    assert "up to date" in run(["dvc", "status"], clone).stdout.lower()
    run(["dvc", "repro", "-s", "analyze", "-f"], clone)
    # MLflow: one parent run per study plus the analysis run, no run left RUNNING
    code = (
        "import mlflow; mlflow.set_tracking_uri('sqlite:///mlruns/mlflow.db');"
        "r = mlflow.search_runs(search_all_experiments=True);"
        "print(len(r), (r['status'] == 'RUNNING').sum(), (r['tags.role'] == 'study').sum(),"
        " (r['tags.mlflow.runName'] == 'analysis').sum())"
    )
    total, running, studies, analysis = map(int, run([sys.executable, "-c", code], clone).stdout.split())
    assert running == 0 and studies == len(strategies) and analysis >= 1 and total > studies + 5


@pytest.mark.slow
def test_every_figure_the_answer_shows_has_one_value_in_report_metrics_mlflow_and_optuna(clone):
    """One offline run: the answer's throughput, accuracy and peak memory for its strategy and k are the values of
    metrics.json (`dvc metrics show`) and of the MLflow analysis run; the strategy's MLflow study row carries the
    report's best throughput under summary.json's name; the Optuna study names its objective and why its best trial
    is another quantity."""
    import re

    if not (clone / "results" / "analysis" / "report.md").exists():
        run(["dvc", "repro"], clone)
    out = clone / "results" / "analysis"
    report = (out / "report.md").read_text()
    answer = report.split("## Answer", 1)[1].split("\n## ", 1)[0]
    train = yaml.safe_load((out / "best.yaml").read_text())["train"]
    s, k = train["strategy"], train["devices"]
    metrics = json.loads((out / "metrics.json").read_text())
    speed = float(re.search(r"([\d,]+) (?:\([^)]*\) )?images/s", answer).group(1).replace(",", ""))
    assert metrics[f"throughput_img_s.{s}.k{k}"] == pytest.approx(speed, rel=1e-3, abs=1), (answer, metrics)
    acc = re.search(r"test accuracy (\d\.\d{4})", answer)
    assert acc, answer  # the answer always states it: a format change must not silence the check
    assert metrics[f"final_test_acc.{s}.k{k}"] == pytest.approx(float(acc.group(1)), abs=1e-4), (answer, metrics)
    peaks = re.search(r"peak memory ([\d.,/ ]+) MiB per device", answer)
    assert peaks, answer  # CPU trials measure it (MemTracker)
    top = max(float(v.replace(",", "")) for v in peaks.group(1).split("/"))
    assert metrics[f"peak_mem_mib.{s}.k{k}"] == pytest.approx(top, abs=0.06), (answer, metrics)
    code = (
        "import json, mlflow, optuna; mlflow.set_tracking_uri('sqlite:///mlruns/mlflow.db');"
        "r = mlflow.search_runs(search_all_experiments=True);"
        f"study = r[(r['tags.role'] == 'study') & (r['tags.strategy'] == '{s}')].iloc[0];"
        "ana = r[r['tags.mlflow.runName'] == 'analysis'].iloc[0];"
        f"st = [x for x in optuna.get_all_study_summaries('sqlite:///mlruns/optuna.db') if '-{s}-' in x.study_name][0];"
        "print(json.dumps({'row': study['metrics.best_throughput_img_s'],"
        f" 'analysis': ana['metrics.strategy/{s}/best_throughput_img_s'],"
        " 'objective': st.user_attrs.get('objective', '')}))"
    )
    seen = json.loads(run([sys.executable, "-c", code], clone).stdout)
    best = json.loads((out / "summary.json").read_text())["strategies"][s]["best_throughput_img_s"]
    assert seen["row"] == pytest.approx(best, rel=1e-3) and seen["analysis"] == pytest.approx(best, rel=1e-3), seen
    assert "final_test_acc" in seen["objective"] and "differ by design" in seen["objective"], seen


def _commands(block: str) -> list[str]:
    """The shell commands of a README code block or a `Next:` line, each without its comment."""
    return [c.split("  #")[0].strip() for c in block.splitlines() if c.strip() and not c.startswith("#")]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the pipeline's run when this test runs alone, on a busy 2-core host
def test_every_command_the_readme_and_the_last_stage_print_shows_its_figures(clone):
    """The README's "What you get" commands (read from README.md) and the end-of-run `Next:` commands, run in a
    finished pipeline at 120 columns: `head -n 40` shows the answer; `compare` every scaling efficiency of
    metrics.json with its value, in lines no wider than 120 columns. `make ui` is a server (tests/tracking)."""
    import re

    from pipeline.analysis.tables.summary import STRONG_EFFICIENCY, WEAK_EFFICIENCY
    from pipeline.cli.commands import answer_screen

    if not (clone / "results" / "analysis" / "report.md").exists():
        run(["dvc", "repro"], clone)
    out = clone / "results" / "analysis"
    metrics = json.loads((out / "metrics.json").read_text())
    kinds = (f"{WEAK_EFFICIENCY}.", f"{STRONG_EFFICIENCY}.")
    efficiencies = {k: v for k, v in metrics.items() if k.startswith(kinds)}
    assert efficiencies, metrics  # the tiny profile measures k=2 at one global batch: strong scaling
    readme = (REPO / "README.md").read_text().split("## What you get", 1)[1].split("```bash\n", 1)[1]
    given = _commands(readme.split("```", 1)[0])
    nxt = answer_screen((out / "report.md").read_text(), "results/analysis", "mlflow ui").rsplit("Next: ", 1)[1]
    printed = [c.split(" (")[0].strip() for c in nxt.split(" · ")]
    assert len(given) == 3 and len(printed) == 3, (given, printed)
    for cmd in [*given, *printed]:
        if cmd.startswith("make ui"):
            continue
        shown = run(["bash", "-c", "COLUMNS=120 " + cmd.replace(".venv/bin/", f"{BIN}/")], clone).stdout
        if cmd.startswith("head -n 40"):  # prose: the terminal wraps its paragraphs
            # an answer, or on a busy host the answer's plain "no like-for-like answer" and why (docs/metrics.md)
            answered = r"\*\*(Use|Tie|No like-for-like answer|No answer on this host)"
            assert "## Answer" in shown and re.search(answered, shown), (cmd, shown)
        else:
            assert "pipeline compare" in cmd, cmd  # the other command each list gives: a table, 120 columns at most
            wide = [line for line in shown.splitlines() if len(line) > 120]
            assert not wide, (cmd, wide)
            for key, value in efficiencies.items():
                assert re.search(rf"^{re.escape(key)} +{value:g}\b", shown, re.M), (cmd, key, value, shown)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the pipeline's run when this test runs alone, doctor's cases, on a busy 2-core host
def test_what_hand_run_commands_leave_behind_changes_no_stage(clone):
    """A finished pipeline, then what running things by hand in a normal terminal leaves in the checkout: bytecode in
    every package folder (Python writes it unless PYTHONDONTWRITEBYTECODE is set), the test and lint tools' caches,
    the memory model's counts (`fit`) and doctor's report. None of it is a change of what a stage reads: `dvc status`
    stays up to date, so the next `dvc repro` (`make pipeline-offline`) reruns no stage (.dvcignore)."""
    if not (clone / "results" / "analysis" / "report.md").exists():
        run(["dvc", "repro"], clone)
    assert "up to date" in run(["dvc", "status"], clone).stdout.lower()
    by_hand = dict(cwd=clone, unset=("PYTHONDONTWRITEBYTECODE",))
    run([sys.executable, "-m", "compileall", "-q", "pipeline", "tests", "tools"], **by_hand)
    run([sys.executable, "-m", "pipeline", "fit", "--model", "lenet", "--batch-size", "128"], **by_hand)
    run([sys.executable, "-m", "pipeline", "doctor", "--max-devices", "1", "--strategies", "single"], **by_hand)
    for folder in ("pipeline/sweep", "pipeline/strategies", "pipeline/analysis/report"):
        for cache in (".pytest_cache", ".mypy_cache", ".ruff_cache"):
            (clone / folder / cache).mkdir(exist_ok=True)
            (clone / folder / cache / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n")
    # the writes happened where the stages' code deps are (whole folders in dvc.yaml), and the caches exist
    assert list((clone / "pipeline" / "sweep" / "__pycache__").glob("*.pyc"))
    assert (clone / "runs" / "memory_model.json").is_file() and (clone / "results" / "doctor" / "doctor.json").is_file()
    status = run(["dvc", "status"], clone).stdout
    assert "up to date" in status.lower(), status
