"""Shared fixtures: a synthetic data directory made once per session, and configs that point at it."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from pipeline.config import loader

REPO = Path(__file__).resolve().parents[1]


def pytest_report_header(config):
    """Free disk where the tests write: a full disk fails every fixture that writes, far from its cause."""
    tmp = tempfile.gettempdir()
    return f"temporary files: {tmp}, {shutil.disk_usage(tmp).free / 2**30:.1f} GiB free"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA GPUs (none on this host)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _keep_excepthook():
    """torch's init_process_group wraps sys.excepthook in a "[rankN]: " prefix and never unwraps it
    (distributed_c10d.py): restored after each test, so the in-process fake worlds do not prefix every later
    traceback of the session with ten "[rankN]: " layers."""
    hook = sys.excepthook
    yield
    sys.excepthook = hook


@pytest.fixture(autouse=True)
def _keep_tracking_env():
    """mlflow.set_tracking_uri (every in-process Tracker) also sets MLFLOW_TRACKING_URI in os.environ: restored after
    each test, so a later test's subprocesses do not inherit another test's store (and warn about it)."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before


@pytest.fixture(scope="session")
def synthetic_root(tmp_path_factory) -> Path:
    from pipeline.data import store

    root = tmp_path_factory.mktemp("data") / "fashion-mnist"
    store.prepare(root, "synthetic", progress=False)
    return root


@pytest.fixture
def toy_model(tmp_path_factory, monkeypatch) -> str:
    """The name of a model a throwaway installed package registers through the entry point (tests/toy_package.py),
    found by this process and the processes it starts (PYTHONPATH)."""
    from . import toy_package

    where = str(toy_package.install(tmp_path_factory.mktemp("site")))
    monkeypatch.syspath_prepend(where)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (where, os.environ.get("PYTHONPATH")) if p))
    return toy_package.NAME


@pytest.fixture
def make_cfg(synthetic_root, tmp_path, monkeypatch):
    """make_cfg('train.strategy=ddp', ...) -> a Config on the session's synthetic data, stores under tmp_path."""
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))  # anchors mlruns/ (MLflow, Optuna) and runs/ in tmp_path
    (tmp_path / "experiments").mkdir(exist_ok=True)

    def make(*sets, profile=""):
        if profile and not (tmp_path / "experiments" / f"{profile}.yaml").exists():
            (tmp_path / "experiments" / f"{profile}.yaml").write_text(
                (REPO / "experiments" / f"{profile}.yaml").read_text()
            )
        base = [
            f"profile={profile}",
            "data.source=synthetic",
            f"data.dir={synthetic_root}",
            "train.warmup_steps=1",
            "train.timeout_s=60",
            # the tests' own host may be busy (other suites, a developer's work): trials are not flagged as
            # measured under interference unless a test asks for it (tests/measure/test_interference.py)
            "train.interference_threshold=1e6",
            "sweep.quiet_wait_s=0",
        ]
        return loader.load(None, [*base, *sets], root=tmp_path)  # tmp_path/params.yaml if any

    return make


@pytest.fixture(autouse=True)
def default_sigint():
    """Every test starts with Python's own SIGINT and SIGTERM handling (SIGINT raises KeyboardInterrupt, SIGTERM
    ends the process), whatever an earlier test's launcher left installed: torch's elastic agent installs its own
    handlers in the process that launches and never removes them, which made Ctrl-C tests depend on their order in
    the full suite. The handlers found before are put back after."""
    import signal

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for s, h in before.items():
        signal.signal(s, signal.SIG_DFL if h is None else h)
