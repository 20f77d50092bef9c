"""A command run by DVC (DVC_STAGE set) ends as on SIGTERM once the process that ran it is gone; outside DVC it
outlives its parent (nohup). The parent here is a small stand-in that runs the command, directly or through a
shell that stays between, and is killed alone.

    .venv/bin/python -m pytest tests/cli/test_lifeline.py -q
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import REPO

# a stage command in short: user_errors turns SIGTERM into exit 143, lifeline watches whoever ran it
COMMAND = (
    "import sys, time; from pipeline.lifeline import lifeline; from pipeline.user_errors import user_errors\n"
    "with user_errors() as status, lifeline(poll_s=0.2):\n"
    "    print('ready', flush=True); time.sleep(30)\n"
    "sys.exit(status.code)"
)
RUNNER = "import subprocess, sys; sys.exit(subprocess.Popen(sys.argv[1:]).wait())"


def _start(tmp_path, between: str, dvc: bool) -> tuple[subprocess.Popen, psutil.Process]:
    cmd = [sys.executable, "-c", COMMAND]
    if between == "a shell":
        cmd = ["sh", "-c", f'{sys.executable} -c "$0"; echo exited', COMMAND]
    env = {k: v for k, v in os.environ.items() if k != "DVC_STAGE"}
    env["PYTHONPATH"] = str(REPO)
    if dvc:
        env["DVC_STAGE"] = "sweep@single"
    log = tmp_path / "out.log"
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER, *cmd],
        env=env,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while "ready" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    procs = psutil.Process(runner.pid).children(recursive=True)
    (child,) = [p for p in procs if p.cmdline()[:2] == [sys.executable, "-c"]]  # not the shell between
    return runner, child


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("between, sig", [("nothing", signal.SIGTERM), ("a shell", signal.SIGKILL)])
def test_a_command_run_by_dvc_ends_with_the_process_that_ran_it(tmp_path, between, sig):
    runner, child = _start(tmp_path, between, dvc=True)
    os.kill(runner.pid, sig)
    runner.wait(10)
    deadline = time.monotonic() + 15  # well under the command's own 30 s sleep; generous on a loaded host
    while _alive(child):
        assert time.monotonic() < deadline, "the command outlived the process that ran it"
        time.sleep(0.05)
    text = (tmp_path / "out.log").read_text()
    assert "is gone: stopping as on SIGTERM" in text and "interrupted (SIGTERM)" in text, text


def test_a_command_outside_dvc_outlives_its_parent(tmp_path):
    runner, child = _start(tmp_path, "nothing", dvc=False)
    try:
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait(10)
        time.sleep(1.0)  # five polls of a lifeline, were there one
        assert _alive(child)
    finally:
        child.kill()
