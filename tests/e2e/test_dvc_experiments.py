"""DVC's experiment executors on the real pipeline: queued (`dvc queue start -j 1`) and `--temp` experiments each run
with their own parameters, record their own results, and leave the workspace's results as they were."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.project import copy_tracked

from .test_pipeline import TINY, small_measurements

REPO = next(p for p in Path(__file__).resolve().parents if (p / "dvc.yaml").is_file())  # in tests/ or a folder of it
BIN = Path(sys.executable).parent
# one strategy with one trial, the overlap and collectives stages at their smallest: the cheapest full pipeline
PARAMS = {
    "profile: cpu": "profile: tiny",
    "source: fashion-mnist": "source: synthetic",
    "strategies: null": "strategies: [single]",
}
WORKSPACE, TEMP = 1, 4  # train.epochs of the workspace's run (the tiny profile's) and of the --temp experiment
# the queued experiments: one with more epochs, one whose settings change a result outside the sweep's points (d2l's
# init, channels_last off) and must run its own trials, not report the workspace's under its name
QUEUED = {"q2": ["train.epochs=2"], "qinit": ["train.init=d2l", "train.channels_last=false"]}
QUEUED_EPOCHS = {"q2": 2, "qinit": None}  # None: params.yaml's null (the profile's 1)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DVC_ROOT", "DVC_STAGE", "PYTHONPATH")}
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        DVC_NO_ANALYTICS="1",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
    )
    return env


def _sh(cmd: list, cwd: Path, timeout: float = 400, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert not check or p.returncode == 0, f"{cmd} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def _results(repo: Path) -> dict[str, str]:
    """sha256 of every file the workspace's results are: results/ (sweep tables, report, metrics) and dvc.lock."""
    files = [p for p in (repo / "results").rglob("*") if p.is_file()] + [repo / "dvc.lock", repo / "params.yaml"]
    return {str(p.relative_to(repo)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _shown(node, out: dict) -> dict:
    """{experiment name or "workspace": (train.epochs, metrics.json's values)} from `dvc exp show --json`."""
    if isinstance(node, list):
        for v in node:
            _shown(v, out)
    elif isinstance(node, dict):
        data = node.get("data")
        if isinstance(data, dict) and "params" in data:
            epochs = data["params"]["params.yaml"]["data"]["train"]["epochs"]
            metrics = (data.get("metrics") or {}).get("results/analysis/metrics.json", {}).get("data")
            out[node.get("name") or node.get("rev")] = (epochs, metrics)
        for v in node.values():
            _shown(v, out)
    return out


@pytest.mark.slow
@pytest.mark.timeout(1800)  # four tiny pipelines, two of them at once: 10 minutes is too short on a busy 2-core host
@pytest.mark.skipif(not (BIN / "dvc").exists() or not shutil.which("git"), reason="needs dvc beside the interpreter")
def test_queued_and_temp_experiments_record_their_own_params_and_results(tmp_path):
    """A fresh copy of the project runs its pipeline in the workspace (epochs 1), then two queued experiments
    (epochs 2 and 3, one worker) and a `--temp` one (epochs 4) beside them. Each shows its own train.epochs and its
    own metrics in `dvc exp show` (metrics.json read from the cache, not `-`, four different readings: the queued
    experiment that changes only train.init and channels_last runs a study of its own); each one's
    trials ran with its epochs (MLflow params, one study each, in the parent's stores); the workspace's results/,
    dvc.lock and params.yaml are byte for byte what its own run left."""
    repo = tmp_path / "proj"
    copy_tracked(repo)
    (repo / "experiments" / "tiny.yaml").write_text(TINY)
    params = (repo / "params.yaml").read_text()
    for old, new in PARAMS.items():
        assert old in params, old
        params = params.replace(old, new)
    (repo / "params.yaml").write_text(small_measurements(params))
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "clone"]):
        _sh(cmd, repo)

    _sh(["dvc", "exp", "run", "-n", "ws"], repo)
    before = _results(repo)
    assert "results/sweeps/single.jsonl" in before and "results/analysis/report.md" in before
    for name, sets in QUEUED.items():
        _sh(["dvc", "exp", "run", "--queue", "-n", name, *(a for kv in sets for a in ("-S", kv))], repo)
    try:
        # its output to a file, not a pipe, which the queue's detached workers would hold open until they exit
        with open(tmp_path / "queue-start.log", "w") as log:
            subprocess.run(
                ["dvc", "queue", "start", "-j", "1"],
                cwd=repo,
                env=_env(),
                stdout=log,
                stderr=log,
                timeout=400,
                check=True,
            )
        _sh(["dvc", "exp", "run", "--temp", "-n", f"t{TEMP}", "-S", f"train.epochs={TEMP}"], repo)
        deadline = time.monotonic() + 400
        while (status := _sh(["dvc", "queue", "status"], repo).stdout) and time.monotonic() < deadline:
            if not any(w in status for w in ("Queued", "Running")):
                break
            time.sleep(2)
        failed = [n for n in QUEUED if n not in status or "Success" not in status.split(n)[1]]
        logs = "".join(_sh(["dvc", "queue", "logs", n], repo, check=False).stdout[-3000:] for n in failed)
        assert not failed, f"{status}\n{logs}"
    finally:
        _sh(["dvc", "queue", "stop", "--kill"], repo, timeout=60, check=False)

    shown = _shown(json.loads(_sh(["dvc", "exp", "show", "--json"], repo).stdout), {})
    expected = {"ws": None, **QUEUED_EPOCHS, f"t{TEMP}": TEMP}
    for name, epochs in expected.items():
        assert name in shown and shown[name][0] == epochs, (name, shown)
        metrics = shown[name][1]
        assert metrics and metrics["n_complete"] == 1 and metrics["throughput_img_s.single.k1"] > 0, (name, shown)
    assert len({json.dumps(shown[n][1], sort_keys=True) for n in expected}) == len(expected), shown
    assert _results(repo) == before

    code = (
        "import json, mlflow; mlflow.set_tracking_uri('sqlite:///mlruns/mlflow.db');"
        "r = mlflow.search_runs(search_all_experiments=True, filter_string=\"params.strategy = 'single'\");"
        "print(json.dumps([[e, s, st] for e, s, st in zip(r['params.epochs'], r['tags.study'], r['status'])]))"
    )
    trials = json.loads(_sh([sys.executable, "-c", code], repo).stdout)
    assert sorted(int(e) for e, _, _ in trials) == sorted([WORKSPACE, 2, WORKSPACE, TEMP]), trials
    assert len({s for _, s, _ in trials}) == 4 and {st for _, _, st in trials} == {"FINISHED"}, trials
