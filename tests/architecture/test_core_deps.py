"""The training core and `doctor` run where MLflow, Optuna, DVC, pandas, matplotlib and torchvision are absent (a
GPU node with only its own PyTorch); the pipeline's commands then say which extra to install."""

from __future__ import annotations

import json
import subprocess
import sys

from ..conftest import REPO

ABSENT = ("mlflow", "optuna", "dvc", "pandas", "matplotlib", "torchvision")

# every import finder wrapped so that the optional packages are not found (as if not installed: `import` raises
# ModuleNotFoundError, importlib.util.find_spec returns None), then `python -m pipeline ARGS`
RUNNER = f"""
import runpy, sys
class Absent:
    def __init__(self, inner):
        self.inner = inner
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {ABSENT!r}:
            return None
        return self.inner.find_spec(name, path, target)
    def __getattr__(self, attr):
        return getattr(self.inner, attr)
sys.meta_path[:] = [Absent(f) if hasattr(f, "find_spec") else f for f in sys.meta_path]
sys.argv = ["pipeline", *sys.argv[1:]]
runpy.run_module("pipeline", run_name="__main__")
"""


def _pipeline(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-c", RUNNER, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_doctor_and_a_trial_run_without_the_pipeline_extras(synthetic_root, tmp_path):
    data = ["--set", f"data.dir={synthetic_root}", "--set", "data.source=synthetic"]
    doc = _pipeline(
        "doctor",
        "--strategies",
        "single,scratch",
        "--max-devices",
        "1",
        "--steps",
        "2",
        "--out",
        str(tmp_path / "doc"),
        *data,
    )
    assert doc.returncode == 0, doc.stderr + doc.stdout
    rows = json.loads((tmp_path / "doc" / "doctor.json").read_text())["rows"]
    assert [r["status"] for r in rows] == ["passed", "passed"]
    train = _pipeline(
        "train",
        "--strategy",
        "single",
        "--max-steps",
        "2",
        "--no-track",
        "--quiet",
        "--out",
        str(tmp_path / "run"),
        *data,
    )
    assert train.returncode == 0, train.stderr + train.stdout
    assert (tmp_path / "run" / "metrics.json").exists()


def test_pipeline_commands_name_the_missing_extra():
    proc = _pipeline("sweep", "--strategy", "single")
    assert proc.returncode == 2
    assert "needs optuna" in proc.stderr and "'.[pipeline]'" in proc.stderr and "Traceback" not in proc.stderr
