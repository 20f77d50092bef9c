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
# the queued experiments of docs/usage.md's workflow, one worker: one changes a knob (the DDP gradient hook, on ddp,
# which takes it), one a sweep axis (the learning rate), one the model's code (LeNet's hidden layer, an uncommitted
# edit that `dvc exp run --queue` takes with it). Each must run a study of its own, never report the workspace's
# figures under its name.
QUEUED = {
    "qhook": ["sweep.strategies=[ddp]", "train.devices=1", "train.comm_hook=fp16"],
    "qlr": ["train.lr=0.05"],
    "qmodel": [],
}
MODEL_EDIT = {
    "nn.Linear(50 * 4 * 4, 128),": "nn.Linear(50 * 4 * 4, 64),",
    "nn.Linear(128, num_classes)": "nn.Linear(64, 10)",
}


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
    """{experiment name or "workspace": (params.yaml's train section, metrics.json's values)} from `dvc exp show
    --json`."""
    if isinstance(node, list):
        for v in node:
            _shown(v, out)
    elif isinstance(node, dict):
        data = node.get("data")
        if isinstance(data, dict) and "params" in data:
            train = data["params"]["params.yaml"]["data"]["train"]
            metrics = (data.get("metrics") or {}).get("results/analysis/metrics.json", {}).get("data")
            out[node.get("name") or node.get("rev")] = (train, metrics)
        for v in node.values():
            _shown(v, out)
    return out


@pytest.mark.slow
@pytest.mark.timeout(2400)  # five tiny pipelines, two of them at once: 10 minutes is too short on a busy 2-core host
@pytest.mark.skipif(not (BIN / "dvc").exists() or not shutil.which("git"), reason="needs dvc beside the interpreter")
def test_queued_and_temp_experiments_record_their_own_params_and_results(tmp_path):
    """docs/usage.md's workflow on a fresh copy of the project: its pipeline in the workspace (epochs 1), then three
    queued experiments (one worker: the DDP gradient hook, the learning rate, LeNet's code) and a `--temp` one
    (epochs 4) beside them. Each shows its own settings and its own metrics in `dvc exp show` (metrics.json read
    from the cache, not `-`, five different readings); each one's trials ran with its settings (MLflow params and
    tags: the hook, the rate, the code digest; one study each, in the parent's stores); the workspace's results/,
    dvc.lock, params.yaml and the model's code are byte for byte what its own run left."""
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
    models = repo / "pipeline" / "models.py"
    code = models.read_text()
    for name, sets in QUEUED.items():
        if name == "qmodel":  # an uncommitted edit: the queued experiment takes the workspace as it is
            edited = code
            for old, new in MODEL_EDIT.items():
                assert old in edited, old
                edited = edited.replace(old, new)
            models.write_text(edited)
        _sh(["dvc", "exp", "run", "--queue", "-n", name, *(a for kv in sets for a in ("-S", kv))], repo)
        models.write_text(code)
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
        deadline = time.monotonic() + 1200
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
    settings = {  # what `dvc exp show` lists beside each experiment's figures (params.yaml's null: the profile's)
        "ws": {"epochs": None, "lr": None, "comm_hook": None},
        "qhook": {"comm_hook": "fp16", "devices": 1},
        "qlr": {"lr": 0.05, "comm_hook": None},
        "qmodel": {"lr": None, "comm_hook": None},
        f"t{TEMP}": {"epochs": TEMP},
    }
    for name, want in settings.items():
        assert name in shown, (name, sorted(shown))
        train, metrics = shown[name]
        assert {k: train[k] for k in want} == want, (name, train)
        strategy = "ddp" if name == "qhook" else "single"
        assert metrics and metrics["n_complete"] == 1 and metrics[f"throughput_img_s.{strategy}.k1"] > 0, (name, shown)
    assert len({json.dumps(shown[n][1], sort_keys=True) for n in settings}) == len(settings), shown
    assert _results(repo) == before and models.read_text() == code

    # the trials in the parent's MLflow store: each experiment's ran with its own settings and code, in its own study
    query = (
        "import json, mlflow; mlflow.set_tracking_uri('sqlite:///mlruns/mlflow.db');"
        "r = mlflow.search_runs(search_all_experiments=True, filter_string=\"tags.study != ''\");"
        "r = r[r['params.strategy'].isin(['single', 'ddp'])];"
        "cols = ['params.strategy', 'params.epochs', 'params.lr', 'params.comm_hook', 'tags.code_digest', "
        "'tags.study', 'status'];"
        "print(json.dumps(r[cols].astype(str).values.tolist()))"
    )
    trials = json.loads(_sh([sys.executable, "-c", query], repo).stdout)
    assert len(trials) == 5 and {t[-1] for t in trials} == {"FINISHED"}, trials
    assert len({t[-2] for t in trials}) == 5, trials  # five studies
    hooked = [t for t in trials if t[0] == "ddp"]
    assert len(hooked) == 1 and hooked[0][3] == "fp16", trials
    single = [t for t in trials if t[0] == "single"]
    assert sorted(float(t[2]) for t in single) == sorted([0.05, 0.2, 0.2, 0.2]), trials  # the tiny profile's 0.2
    assert sorted(int(t[1]) for t in single) == sorted([WORKSPACE, WORKSPACE, WORKSPACE, TEMP]), trials
    digests = [t[4] for t in single]
    assert all(digests) and len(set(digests)) == 2, trials  # qmodel's code alone differs
