"""A command run by an interpreter without the project's packages (outside .venv, the report's printed command in a
new shell) says in one line how to set up, never "unexpected ModuleNotFoundError ... report it"."""

from __future__ import annotations

import subprocess
import sys

from tests.project import REPO

# torch made unimportable in this interpreter, as in a Python where it is not installed
NO_TORCH = "import sys; sys.modules['torch'] = None; from pipeline.cli import exit_now, main; exit_now(main())"


def test_a_missing_package_is_a_set_up_step_with_the_fix(tmp_path):
    args = ["train", "--strategy", "single", "--max-steps", "1", "--no-track", "--set", "data.source=synthetic"]
    args += ["--out", str(tmp_path / "run")]
    p = subprocess.run([sys.executable, "-c", NO_TORCH, *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    assert "torch is not installed for this interpreter" in p.stderr and "make setup" in p.stderr, p.stderr
    assert "unexpected" not in p.stderr and "report it" not in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert "\n\n" not in p.stderr.strip(), p.stderr  # one paragraph
