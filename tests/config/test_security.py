"""Hostile or careless input: no value in params.yaml, a profile or --set runs a command or reads a file outside
experiments/; no secret in any output or store; nothing listens beyond loopback for a one-node trial.

    .venv/bin/python -m pytest tests/config/test_security.py            # -m "not slow" for the fast cases only
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import loader
from tests.conftest import REPO
from tests.project import copy_tracked

BIN = Path(sys.executable).parent


def clone_repo(dst: Path) -> Path:
    """The tracked files in a fresh directory, committed (as a fresh clone would be)."""
    copy_tracked(dst)
    for cmd in (
        ["git", "init", "-q"],
        ["git", "add", "-A"],
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "clone"],
    ):
        subprocess.run(cmd, cwd=dst, check=True, capture_output=True)
    return dst


def run_in(root: Path, cmd: list[str], timeout=600, **env) -> subprocess.CompletedProcess:
    e = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **env}
    e.pop("DVC_ROOT", None)
    e.pop("PYTHONPATH", None)  # the clone's own package
    return subprocess.run(cmd, cwd=root, env=e, capture_output=True, text=True, timeout=timeout)


# ----------------------------------------------------------------------------- 1. no command from params


@pytest.mark.parametrize(
    "profile",
    [
        "../params",
        "../../../tmp/p",
        "/etc/passwd",
        "cpu/../cpu",
        "CPU",
        ".cpu",
        "cpu.yaml",
        "-cpu",
        "cpu;id",
        3,
        ["cpu"],
    ],
)
def test_a_profile_is_a_name_under_experiments_never_a_path(profile):
    with pytest.raises(loader.ConfigError, match="Invalid profile") as e:
        loader.load(REPO / "params.yaml", [f"profile={profile}"], root=REPO)
    assert "Valid profiles: cpu" in str(e.value)
    with pytest.raises(loader.ConfigError):  # a config made by override is validated the same way
        loader.override(loader.load(REPO / "params.yaml", root=REPO), [f"profile={profile}"])


def test_profile_file_must_exist_and_profiles_lists_only_valid_names(tmp_path):
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "ok.yaml").write_text("description: fine\n")
    (tmp_path / "experiments" / "Bad Name.yaml").write_text("description: never a profile\n")
    with pytest.raises(loader.ConfigError, match="Unknown profile `nope`.*Valid profiles: ok\\."):
        loader.load(None, ["profile=nope"], root=tmp_path)
    assert [n for n, _ in loader.describe_profiles(tmp_path)] == ["ok"]


# params.yaml as its own profile (every key DVC tracks is present, so DVC runs the stages), with strategy names
# that are shell commands: before the fix, `dvc repro` ran stage sweep@bogus;touch PWNED_1
HOSTILE = """profile: ../params
data: {source: synthetic, dir: data/fashion-mnist, mirror: "", train_limit: 256, test_limit: 64}
train: {epochs: 1}
sweep:
  strategies: [single, "bogus;touch PWNED_1", "$(touch PWNED_2)"]
  storage: ""
  sampler: grid
  repeats: 1                 # dvc.yaml tracks these keys of a profile: it must define them
  remeasure_interfered: 0
  emulated_max_steps: 0
  spaces:
    single: {devices: [1], batch_size: [64], lr: [0.1]}
    "bogus;touch PWNED_1": {devices: [1]}
    "$(touch PWNED_2)": {devices: [1]}
tracking: {}
analyze: {}
overlap: {}
slurm: {}
"""


@pytest.mark.slow
def test_params_cannot_make_dvc_or_the_cli_run_a_command(tmp_path, synthetic_root):
    root = clone_repo(tmp_path / "clone")
    shutil.copytree(synthetic_root, root / "data" / "fashion-mnist")  # every stage's dependencies are there
    (root / "params.yaml").write_text(HOSTILE)
    stages = [line.split()[0] for line in run_in(root, ["dvc", "stage", "list"]).stdout.splitlines()]
    assert [s for s in stages if s.startswith("sweep@")] == [f"sweep@{s}" for s in loader.STRATEGY_NAMES]
    outputs = [run_in(root, ["dvc", "repro", "--keep-going"])]
    outputs += [run_in(root, ["dvc", "repro", "-s", stage]) for stage in stages]
    for p in outputs:
        assert p.returncode != 0 and "Traceback" not in p.stderr, p.stdout[-3000:] + p.stderr[-3000:]
    p = run_in(root, [sys.executable, "-m", "pipeline", "sweep", "--strategy", "single"])
    assert p.returncode == 2 and "Invalid profile '../params'" in " ".join(p.stderr.split()), p.stderr
    pwned = [str(f) for d in (root, tmp_path) for f in d.rglob("PWNED_*")]
    assert not pwned and not list(Path.cwd().glob("PWNED_*")), pwned


# ----------------------------------------------------------------------------- 2. no secret shown or stored

SECRET = "PW_s3cret-4711"


def test_redact_hides_the_password_of_every_url():
    from pipeline.redact import redact

    cases = {
        f"postgresql://user:{SECRET}@host:1/db": "postgresql://***@host:1/db",
        f"postgresql+psycopg://u:{SECRET}@h/db?sslmode=require": "postgresql+psycopg://***@h/db?sslmode=require",
        # ambiguous (a password may hold `@h/a`): the secret runs to the last `@` a host follows, hiding more
        f"x 'http://user:{SECRET}@h/a@b' and https://v:{SECRET}@k/": "x 'http://***@b' and https://***@k/",
        f"postgresql://h/db?password={SECRET}&user=x": "postgresql://h/db?password=***&user=x",
        "postgresql://user@host/db": "postgresql://***@host/db",  # a user alone may be a token
        "sqlite:////abs/mlruns/optuna.db": "sqlite:////abs/mlruns/optuna.db",
    }
    for given, shown in cases.items():
        assert redact(given) == shown
    assert redact(f"postgresql://user:p@ss{SECRET}@host/db") == "postgresql://***@host/db"


@pytest.fixture
def repo(make_cfg, tmp_path, synthetic_root, monkeypatch):
    make_cfg()  # DVC_ROOT=tmp_path
    shutil.copy(REPO / "experiments" / "cpu.yaml", tmp_path / "experiments")
    (tmp_path / "params.yaml").write_text(f"profile: cpu\ndata: {{source: synthetic, dir: {synthetic_root}}}\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


UNREACHABLE = [  # port 1 on loopback: refused at once
    (["sweep", "--strategy", "single"], f"sweep.storage=postgresql://user:{SECRET}@127.0.0.1:1/optuna"),
    (["train", "--out", "o", "--max-steps", "2"], f"tracking.uri=http://user:{SECRET}@127.0.0.1:1/"),
    (["train", "--out", "o", "--max-steps", "2"], f"tracking.uri=postgresql://user:{SECRET}@127.0.0.1:1/mlflow"),
    (["sweep", "--strategy", "single"], f"tracking.uri=https://user:{SECRET}@127.0.0.1:1/"),
    (["download"], f"data.mirror=http://user:{SECRET}@127.0.0.1:1/fmnist/"),
]


@pytest.mark.parametrize("argv,setting", UNREACHABLE, ids=[s.split("=")[0] + " " + a[0] for a, s in UNREACHABLE])
def test_unreachable_store_or_mirror_is_named_without_its_password(repo, argv, setting, capsys):
    from pipeline.cli import main

    extra = ["--set", "data.source=fashion-mnist", "--set", f"data.dir={repo}/fm"] if argv == ["download"] else []
    code = main([*argv, "--set", setting, *extra])
    err = " ".join(capsys.readouterr().err.split())
    assert code != 0 and "Traceback" not in err, err
    assert SECRET not in err and "://***@127.0.0.1:1" in err, err
    assert ("carries a user name or password" if argv == ["download"] else "Cannot reach") in err, err
    assert not (repo / "mlruns" / "mlflow.db").exists() and not (repo / "mlruns" / "optuna.db").exists()


def test_advice_never_suggests_a_password_in_a_url():
    for path in [*(REPO / "pipeline").rglob("*.py"), *(REPO / "docs").glob("*.md"), REPO / "README.md"]:
        assert "user:pass@" not in path.read_text(), path


# ----------------------------------------------------------------------------- 3. nothing beyond loopback


@pytest.mark.slow
def test_a_two_rank_trial_listens_on_loopback_only(tmp_path, synthetic_root):
    import time

    import psutil

    (tmp_path / "experiments").mkdir()
    env = {**os.environ, "DVC_ROOT": str(tmp_path), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline",
            "train",
            "--strategy",
            "ddp",
            "--devices",
            "2",
            "--batch-size",
            "64",
            "--epochs",
            "3",
            "--no-track",
            "--quiet",
            "--out",
            str(tmp_path / "o"),
            "--set",
            "profile=",
            "--set",
            "data.source=synthetic",
            "--set",
            f"data.dir={synthetic_root}",
            "--set",
            "data.train_limit=4096",
            "--set",
            "train.comm_hook=none",
        ],  # Gloo's own sockets too
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    listening, ranks = set(), set()
    while proc.poll() is None:
        try:
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        for p in tree:
            try:
                for c in p.net_connections(kind="inet"):
                    if c.status == psutil.CONN_LISTEN:
                        listening.add((p.pid, c.laddr.ip, c.laddr.port))
                        if p.pid != proc.pid:
                            ranks.add(p.pid)
            except psutil.Error:
                pass
        time.sleep(0.05)
    out = proc.communicate()[0]
    assert proc.returncode == 0, out[-3000:]
    assert any(pid == proc.pid for pid, _, _ in listening) and len(ranks) == 2, listening  # store, both ranks' Gloo
    beyond = [s for s in listening if s[1] not in ("127.0.0.1", "::1")]
    assert not beyond, f"listening beyond loopback: {beyond}"


def test_multi_node_trials_keep_the_endpoint_the_user_names(make_cfg, monkeypatch):
    """The loopback backend is for one-node trials only: nnodes > 1 uses torchrun's c10d on rdzv_endpoint."""
    from pipeline.trial import ranks

    seen = {}

    def fake_launch(lc, entry):
        seen.update(backend=lc.rdzv_backend, endpoint=lc.rdzv_endpoint, gloo=os.environ.get("GLOO_SOCKET_IFNAME"))
        return lambda *a: {0: {}}

    monkeypatch.setattr("torch.distributed.launcher.api.elastic_launch", fake_launch)
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    cfg = make_cfg(
        "train.strategy=ddp",
        "train.devices=2",
        "train.nnodes=2",
        "train.rdzv_endpoint=10.1.2.3:29400",
        "train.oversubscribe=true",
        "train.batch_size=64",
    )
    ranks._launch(cfg, ranks.probe(), Path("/nonexistent-out"), None, False, None)
    assert seen == {"backend": "c10d", "endpoint": "10.1.2.3:29400", "gloo": None}
    cfg = make_cfg("train.strategy=ddp", "train.devices=2", "train.batch_size=64", "train.oversubscribe=true")
    ranks._launch(cfg, ranks.probe(), Path("/nonexistent-out"), None, False, None)
    assert seen["backend"] == "parallax-loopback" and seen["gloo"] and seen["gloo"].startswith("lo")


# a real PostgreSQL study and MLflow server (tests/sweep/test_scaleout.py's fixtures), reached through URLs that carry
# the password: nothing the sweep and the analysis print or store may contain it
from tests.sweep.scaleout_services import mlflow_server, postgres  # noqa: E402,F401  (fixtures)


@pytest.mark.slow
def test_passwords_in_store_urls_appear_in_no_output_or_store(
    postgres,  # noqa: F811  (the fixture imported above)
    mlflow_server,  # noqa: F811
    tmp_path,
    synthetic_root,
):
    import json

    import optuna
    from mlflow.tracking import MlflowClient

    secret = str(postgres["PGPASSWORD"])
    db = f"{postgres['DB_HOST']}:{postgres['DB_PORT']}"
    storage = f"postgresql://parallax:{secret}@{db}/optuna"
    tracking_uri = f"http://parallax:{secret}@{mlflow_server['MLFLOW_HOST']}:{mlflow_server['MLFLOW_PORT']}"
    root = tmp_path / "repo"
    (root / "experiments").mkdir(parents=True)
    (root / "experiments" / "s.yaml").write_text(
        "data: {train_limit: 512, test_limit: 128}\ntrain: {epochs: 1, warmup_steps: 1}\n"
        "sweep: {spaces: {single: {devices: [1], batch_size: [64], lr: [0.1, 100.0]}}}\n"
    )
    (root / "params.yaml").write_text(
        f"profile: s\ndata: {{source: synthetic, dir: {synthetic_root}, "
        f"mirror: 'http://mirror:{secret}@127.0.0.1:1/fm/'}}\n"
    )
    env = {**os.environ, "DVC_ROOT": str(root), "PYTHONPATH": str(REPO)}
    env.pop("PGPASSWORD", None)  # the URL's password is the only one there is
    sets = [
        "--set",
        f"sweep.storage={storage}",
        "--set",
        f"tracking.uri={tracking_uri}",
        "--set",
        "tracking.experiment=secrets",
    ]
    outputs = []
    for argv in (
        ["sweep", "--strategy", "single", *sets],
        ["analyze", *sets],
        ["download", "--set", "data.source=fashion-mnist", "--set", f"data.dir={root}/fm"],
    ):
        p = subprocess.run(
            [sys.executable, "-m", "pipeline", *argv], cwd=root, env=env, capture_output=True, text=True, timeout=600
        )
        outputs.append(p.stdout + p.stderr)
        assert p.returncode == (2 if argv[0] == "download" else 0), outputs[-1][-3000:]
    assert "://***@" in outputs[0] or "***" in outputs[2], outputs
    found = [i for i, text in enumerate(outputs) if secret in text]
    assert not found, [outputs[i][-2000:] for i in found]
    files = [
        f for f in root.rglob("*") if f.is_file() and f.name != "params.yaml" and secret.encode() in f.read_bytes()
    ]
    assert not files, files
    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name("secrets")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    assert len(runs) >= 3  # parent, two trials, the analysis
    stored = json.dumps([[r.data.params, r.data.tags, r.info.run_name, r.info.artifact_uri] for r in runs])
    assert secret not in stored and secret not in json.dumps(exp.tags)
    for summary in optuna.get_all_study_summaries(storage):
        s = optuna.load_study(study_name=summary.study_name, storage=storage)
        trials = [[t.params, t.user_attrs, t.system_attrs] for t in s.trials]
        stored = json.dumps([s.user_attrs, s._storage.get_study_system_attrs(s._study_id), trials], default=str)
        assert secret not in stored
