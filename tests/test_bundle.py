"""The air-gapped GPU bundle: what it carries, and its install + run on a simulated node that has its own PyTorch
and no registry (a fresh venv that sees this environment's packages, Parallax excluded)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from pipeline import bundle

from .conftest import REPO


def test_only_what_the_node_lacks_is_carried():
    node = bundle.node_packages(["torch==2.11.0+cu130", "numpy==2.5.2", "PyYAML==6.0.2", "# comment", "-e x"])
    assert node == {"torch": "2.11.0", "numpy": "2.5.2", "pyyaml": "6.0.2"}
    assert bundle.missing(["torch>=2.11", "numpy>=1.24", "pyyaml>=6", "tqdm>=4.66"], node) == ["tqdm>=4.66"]
    assert bundle.missing(["torch>=2.12"], node) == ["torch>=2.12"]  # an older torch than supported is named
    assert bundle.missing(bundle.core_requirements(), bundle.node_packages(bundle.DOCUMENTED_NODE)) == []


def _node(tmp: Path) -> Path:
    """A venv standing for the GPU node: this environment's packages visible, as a node's system site would be."""
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True, timeout=120)
    site = Path(sysconfig.get_paths()["purelib"])
    shared = tmp / "node-site"
    shared.mkdir()
    for entry in site.iterdir():  # everything but Parallax itself
        if not entry.name.lower().startswith(("parallax", "__editable__", "_parallax")):
            (shared / entry.name).symlink_to(entry)
    venv_site = next((tmp / "venv" / "lib").glob("python*/site-packages"))
    (venv_site / "node-packages.pth").write_text(f"{shared}\n")
    return tmp / "venv"


@pytest.mark.slow
def test_bundle_installs_offline_keeps_torch_and_runs_the_checks(tmp_path):
    built = subprocess.run([sys.executable, "-m", "pipeline.bundle", "--out", str(tmp_path / "gpu-bundle")],
                           cwd=REPO, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr + built.stdout
    assert "MiB" in built.stdout and (tmp_path / "gpu-bundle.tar.gz").exists()
    assert bundle.size(tmp_path / "gpu-bundle") <= bundle.LIMIT
    venv = _node(tmp_path)
    site = tmp_path / "parallax-site"
    env = {**os.environ, "QUICK": "1", "PARALLAX_SITE": str(site), "PYTHON": str(venv / "bin" / "python"),
           "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""}  # no registry, no local wheel folder: only the bundle
    env.pop("PYTHONPATH", None)
    run = subprocess.run(["bash", str(tmp_path / "gpu-bundle" / "run.sh"), str(tmp_path / "out")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    before, after = (tmp_path / "out" / "install.txt").read_text().split("before install: ")[1].split(", after: ")
    assert before.strip() == after.strip()
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import pipeline; print(pipeline.__file__)"],
                           cwd=tmp_path, env={**env, "PYTHONPATH": str(site)}, capture_output=True, text=True,
                           check=True).stdout
    assert where.startswith(str(site))  # the bundled wheel, not this checkout
    assert not list(venv.glob("lib/python*/site-packages/pipeline"))  # the node's environment untouched
    doc = json.loads((tmp_path / "out" / "doctor" / "doctor.json").read_text())
    assert doc["counts"]["failed"] == 0 and doc["counts"]["passed"] >= 2
    assert (tmp_path / "out" / "gpu_epoch.json").exists()
