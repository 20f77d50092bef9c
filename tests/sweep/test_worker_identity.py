"""A worker's identity (host, pid, start) in a claim, and the lifeline's view of the process that ran a stage, come
from psutil, not from /proc read by hand: they hold where the project's modules cannot open /proc (as on macOS), and a
claim in an existing store, whose start is the `starttime` of /proc/<pid>/stat, still names its live worker.

    .venv/bin/python -m pytest tests/sweep/test_worker_identity.py -q
"""

from __future__ import annotations

import builtins
import os
import socket
import subprocess
import sys
import time

import pytest

from pipeline import lifeline, processes
from pipeline.measure import interference
from pipeline.sweep import claims

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="compares with /proc/<pid>/stat")


def _no_proc(monkeypatch, *modules):
    """The modules' own open() refuses /proc, as a host without it would; psutil reads the system its own way."""

    def refuse(path, *args, **kwargs):
        if str(path).startswith("/proc"):
            raise FileNotFoundError(path)
        return builtins.open(path, *args, **kwargs)

    for m in modules:
        monkeypatch.setattr(m, "open", refuse, raising=False)


def _raw_start(pid: int) -> str:
    """The start a claim in an existing store holds: /proc/<pid>/stat's 22nd field (clock ticks after boot)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


@pytest.fixture
def sleeper():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p
    p.kill()
    p.wait()


@linux
def test_a_claim_in_an_existing_store_names_its_live_worker(sleeper):
    """The start is stored in the form /proc/<pid>/stat gives: a claim written with it is this worker's, and a live
    worker's trial is not taken over."""
    assert claims.me()["start"] == _raw_start(os.getpid())
    owner = {"host": socket.gethostname(), "pid": sleeper.pid, "start": _raw_start(sleeper.pid)}
    assert claims.is_alive_here(owner)
    assert processes.same_start(processes.started(sleeper.pid), _raw_start(sleeper.pid))


def test_a_reused_pid_is_not_the_worker_without_proc(monkeypatch, sleeper):
    _no_proc(monkeypatch, claims, processes)
    start = claims.start_time(sleeper.pid)
    assert start is not None
    here = {"host": socket.gethostname(), "pid": sleeper.pid}
    assert claims.is_alive_here({**here, "start": start})
    reused = str(int(start) - 10 * processes.HZ)  # the pid's earlier owner started 10 s before this process
    assert not claims.is_alive_here({**here, "start": reused})
    assert claims.me()["start"] is not None


def test_an_exited_worker_not_yet_reaped_is_dead(monkeypatch):
    _no_proc(monkeypatch, claims, processes)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while processes.running(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # exits, and stays a zombie until wait()
        start = claims.start_time(child.pid)
        assert not claims.is_alive_here({"host": socket.gethostname(), "pid": child.pid, "start": start})
    finally:
        child.wait()


def test_starts_a_second_apart_are_one_process_and_further_apart_two():
    hz = processes.HZ
    assert processes.same_start("1000", str(1000 + hz))
    assert not processes.same_start("1000", str(1000 + hz + 1))
    assert processes.same_start(None, None) and not processes.same_start("1000", None)


def test_the_lifeline_sees_the_process_that_ran_the_stage_without_proc(monkeypatch, sleeper):
    _no_proc(monkeypatch, lifeline, processes)
    monkeypatch.setenv("DVC_STAGE", "sweep@single")
    pid, name, start = lifeline.runner()
    assert start is not None and name != "its parent", (pid, name)  # the nearest ancestor that is not a shell
    assert name not in lifeline._SHELLS and start == processes.started(pid)
    parent = os.getppid()
    assert not lifeline._is_gone(sleeper.pid, processes.started(sleeper.pid), parent)
    assert lifeline._is_gone(sleeper.pid, str(int(processes.started(sleeper.pid)) - 10 * processes.HZ), parent)
    sleeper.kill()
    sleeper.wait()
    assert lifeline._is_gone(sleeper.pid, start, parent)


def test_the_interference_monitor_measures_the_host_without_proc(monkeypatch):
    _no_proc(monkeypatch, interference)
    with interference.Monitor(devices_used=1, threshold=0.5) as m:
        t = time.process_time()
        while time.process_time() - t < 0.3:  # 0.3 s spun, 0.2 asked: the monitor reads CPU time in clock ticks
            pass
    r = m.result()
    assert r["foreign_cpu_s"] is not None and r["host_busy_cpu_s"] >= 0.0, r
    assert r["own_cpu_s"] >= 0.2
    helper = subprocess.Popen([sys.executable, "-c", "import time\nwhile time.process_time() < 0.3: pass"])
    try:
        assert interference._children(os.getpid()) >= {helper.pid}
        deadline = time.monotonic() + 30
        while interference._process_cpu(helper.pid) < 0.2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert interference._process_cpu(helper.pid) >= 0.2
    finally:
        helper.wait()
