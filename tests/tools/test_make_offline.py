"""`make pipeline-offline` leaves params.yaml as it found it: `dvc exp run -S data.source=synthetic` writes the value
into the workspace's params.yaml, and the recipe puts the file back byte for byte, after a run that succeeds and after
one that fails, so the README's next command (`make test`) and a later `make pipeline` see the project's settings.
DVC is a stand-in here that rewrites params.yaml as DVC does; the whole pipeline runs in tests/e2e."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.project import REPO

FAKE_DVC = """#!/bin/sh
# stands in for `dvc exp run -S data.source=synthetic`: the value lands in params.yaml, as DVC writes it
sed -i 's/source: fashion-mnist/source: synthetic/' params.yaml
exit {rc}
"""


@pytest.mark.skipif(not shutil.which("make"), reason="needs make")
@pytest.mark.parametrize("rc", [0, 1])
def test_the_offline_recipe_puts_params_yaml_back_as_it_was(tmp_path, rc):
    for f in ("Makefile", "params.yaml"):
        shutil.copy2(REPO / f, tmp_path / f)
    before = (tmp_path / "params.yaml").read_bytes()
    assert b"source: fashion-mnist" in before
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    (bin_dir / "dvc").write_text(FAKE_DVC.format(rc=rc))
    (bin_dir / "dvc").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    p = subprocess.run(
        ["make", "-o", "setup", "-o", ".venv/.installed", "pipeline-offline"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (p.returncode == 0) == (rc == 0), p.stdout + p.stderr
    assert (tmp_path / "params.yaml").read_bytes() == before
    if rc == 0:
        assert "params.yaml is as it was" in p.stdout
