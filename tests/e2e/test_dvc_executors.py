"""Where a stage's paths point under each DVC executor: its checkout for params and results, the parent for stores."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline import paths
from pipeline.config import loader
from pipeline.sweep import claims
from pipeline.tracking import client

REPO = Path(__file__).resolve().parents[2]
DVC = Path(sys.executable).with_name("dvc")


def _executor_checkout(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """A parent repository and a temp checkout of it under .dvc/tmp/exps/, as DVC's --temp and --queue make one,
    with the environment DVC gives the stage there: DVC_ROOT = the parent, cwd = the checkout, DVC_STAGE set."""
    parent = tmp_path / "parent"
    checkout = parent / ".dvc" / "tmp" / "exps" / "tmpabc123"
    for root, epochs in ((parent, 2), (checkout, 3)):
        (root / "experiments").mkdir(parents=True)
        (root / "experiments" / "cpu.yaml").write_text((REPO / "experiments" / "cpu.yaml").read_text())
        (root / "dvc.yaml").write_text("stages: {}\n")
        (root / "params.yaml").write_text(f"profile: cpu\ntrain:\n  epochs: {epochs}\n")
    monkeypatch.setenv("DVC_ROOT", str(parent))
    monkeypatch.setenv("DVC_STAGE", "sweep@single")
    monkeypatch.chdir(checkout)
    return parent.resolve(), checkout.resolve()


def test_executor_stage_reads_its_checkout_and_writes_the_parents_stores(tmp_path, monkeypatch):
    """A stage run in a temp or queued checkout reads that checkout's params.yaml (the experiment's values, not the
    workspace's) and has results/ and runs/ there, while MLflow and Optuna stay in the parent's mlruns/."""
    parent, checkout = _executor_checkout(tmp_path, monkeypatch)
    assert paths.repo_root() == checkout
    cfg = loader.load()
    assert cfg.train.epochs == 3
    assert paths.store_root() == parent
    assert client.tracking_uri(cfg) == f"sqlite:///{parent / 'mlruns' / 'mlflow.db'}"
    assert claims.storage_url(cfg) == f"sqlite:///{parent / 'mlruns' / 'optuna.db'}"


def test_workspace_stage_and_plain_commands_use_one_root(tmp_path, monkeypatch):
    """In the workspace (`dvc repro`, `dvc exp run`) DVC_ROOT is the checkout itself: both roots are it. Outside
    DVC, a DVC_ROOT set by hand names both; without it, the nearest directory holding dvc.yaml does."""
    parent, checkout = _executor_checkout(tmp_path, monkeypatch)
    monkeypatch.chdir(parent)
    assert paths.repo_root() == paths.store_root() == parent
    monkeypatch.delenv("DVC_STAGE")
    monkeypatch.chdir(checkout)
    assert paths.repo_root() == paths.store_root() == parent  # set by hand: it wins over the cwd
    monkeypatch.delenv("DVC_ROOT")
    assert paths.repo_root() == paths.store_root() == checkout


STAGE = """\
import json, sys
sys.path.insert(0, {repo!r})
import yaml
from pipeline import paths
root = paths.repo_root()
store = getattr(paths, "store_root", paths.repo_root)()
p = yaml.safe_load((root / "params.yaml").read_text())["p"]
(root / "results").mkdir(exist_ok=True)
(root / "results" / "out.json").write_text(json.dumps({{"p": p}}))
(store / "mlruns").mkdir(exist_ok=True)
with open(store / "mlruns" / "log.jsonl", "a") as f:
    f.write(json.dumps({{"p": p, "root": str(root)}}) + "\\n")
"""

DVC_YAML = """\
stages:
  run:
    cmd: {python} stage.py
    deps: [stage.py]
    params: [p]
    metrics:
      - results/out.json:
          cache: false
"""


def _sh(cmd, cwd: Path, env: dict, timeout: float = 180) -> str:
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{cmd}: {r.stdout}\n{r.stderr}"
    return r.stdout


def _experiments(show) -> list[tuple[int, int | None]]:
    """(param p, metric p) of every revision `dvc exp show --json` lists."""
    out = []
    if isinstance(show, dict):
        data = show.get("data")
        if isinstance(data, dict) and "params" in data:
            p = data["params"]["params.yaml"]["data"]["p"]
            m = (data.get("metrics") or {}).get("results/out.json", {}).get("data", {}).get("p")
            out.append((p, m))
        for v in show.values():
            out += _experiments(v)
    elif isinstance(show, list):
        for v in show:
            out += _experiments(v)
    return out


@pytest.mark.slow
@pytest.mark.skipif(not DVC.exists() or not shutil.which("git"), reason="needs dvc beside the interpreter, and git")
def test_every_executor_records_its_own_params_and_results(tmp_path):
    """End to end with the real dvc (about a minute): the workspace, `dvc exp run --temp` and two queued
    experiments run by two workers each record their own parameter and results; the workspace's results stay
    its own; every experiment's store entry lands in the parent's mlruns/."""
    repo = tmp_path / "proj"
    repo.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DVC_ROOT", "DVC_STAGE", "PYTHONPATH")}
    env.update(
        PATH=f"{DVC.parent}{os.pathsep}{env.get('PATH', '')}",
        DVC_NO_ANALYTICS="1",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
    )
    (repo / "stage.py").write_text(STAGE.format(repo=str(REPO)))
    (repo / "dvc.yaml").write_text(DVC_YAML.format(python=sys.executable))
    (repo / "params.yaml").write_text("p: 1\n")
    (repo / ".gitignore").write_text("/mlruns/\n")
    for cmd in (
        ["git", "init", "-q"],
        ["git", "config", "user.name", "t"],
        ["git", "config", "user.email", "t@t"],
        [str(DVC), "init", "-q"],
        ["git", "add", "-A"],
        ["git", "commit", "-qm", "init"],
    ):
        _sh(cmd, repo, env)
    _sh([str(DVC), "exp", "run"], repo, env)  # the workspace executor
    _sh([str(DVC), "exp", "run", "--temp", "-S", "p=2"], repo, env)
    for p in (3, 4):
        _sh([str(DVC), "exp", "run", "--queue", "-S", f"p={p}"], repo, env)
    try:
        # its output to a file, not a pipe: the queue's workers, detached, inherit the command's streams, and a
        # pipe would stay open (the command "unfinished") until they exit; the loop below waits for them
        with open(tmp_path / "queue-start.log", "w") as log:
            subprocess.run(
                [str(DVC), "queue", "start", "-j", "2"],
                cwd=repo,
                env=env,
                stdout=log,
                stderr=log,
                timeout=180,
                check=True,
            )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            status = _sh([str(DVC), "queue", "status"], repo, env)
            if not any(w in status for w in ("Queued", "Running")):
                break
            time.sleep(3)
        assert "Failed" not in status, status
    finally:
        subprocess.run([str(DVC), "queue", "stop", "--kill"], cwd=repo, env=env, capture_output=True, timeout=60)
    runs = _experiments(json.loads(_sh([str(DVC), "exp", "show", "--json"], repo, env)))
    for p in (1, 2, 3, 4):
        assert (p, p) in runs, runs
    assert not [r for r in runs if r[1] is not None and r[0] != r[1]], runs
    assert json.loads((repo / "results" / "out.json").read_text()) == {"p": 1}
    assert (repo / "params.yaml").read_text() == "p: 1\n"
    logged = [json.loads(line) for line in (repo / "mlruns" / "log.jsonl").read_text().splitlines()]
    assert sorted(e["p"] for e in logged) == [1, 2, 3, 4]
    assert sum(e["root"] == str(repo.resolve()) for e in logged) == 1  # the others ran in checkouts of their own
