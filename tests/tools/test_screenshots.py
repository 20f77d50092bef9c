"""tools/screenshots.py without a browser: its arguments, and the errors it gives when a requirement is missing."""

import subprocess
import sys

from ..conftest import REPO

SCRIPT = REPO / "tools" / "screenshots.py"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def test_help_describes_every_flag_with_its_default():
    r = run("--help")
    assert r.returncode == 0, r.stderr
    for flag in ("--out", "--port", "--chromium", "--timeout", "--set"):
        assert flag in r.stdout
    assert "docs/screenshots" in r.stdout and "/usr/bin/chromium" in r.stdout and "a free one" in r.stdout


def test_missing_chromium_is_a_clear_error_before_anything_starts(tmp_path):
    r = run("--chromium", str(tmp_path / "no-chromium"), "--out", str(tmp_path / "shots"))
    assert r.returncode == 2
    assert "Chromium was not found" in r.stderr and "apt-get install -y chromium" in r.stderr
    assert not (tmp_path / "shots").exists()  # no UI started, nothing written


def test_bad_arguments_are_refused():
    r = run("--port", "not-a-port")
    assert r.returncode == 2 and "invalid int value" in r.stderr
