"""The pipeline's own multi-process stages (`overlap`, `collectives` on a CPU host) start their ranks as trials do:
the rendezvous store and Gloo listen on 127.0.0.1 only, and the launcher leaves nothing in the system temp dir
(no torchelastic_* log folders, no pytorch-errorfile-* files).

    .venv/bin/python -m pytest tests/trial/test_stage_launch.py
"""

from __future__ import annotations

import ipaddress
import os
import tempfile

import psutil
import pytest
import torch.distributed as dist
import torch.distributed.launcher.api as launcher_api

from pipeline.config import loader
from pipeline.host import loopback
from pipeline.host.devices import probe
from pipeline.measure.interference import Monitor
from pipeline.scaling import collectives, overlap

pytestmark = pytest.mark.skipif(probe().kind != "cpu" or probe().n < 2, reason="needs a CPU host with two cores")

_LISTENING = "parallax_test_listening"  # where a rank writes the addresses its process tree listens on


def _listening_addrs(*pids: int) -> set[str]:
    out = set()
    for pid in pids:
        for c in psutil.Process(pid).net_connections(kind="inet"):
            if c.status == psutil.CONN_LISTEN:
                out.add(c.laddr.ip)
    return out


def _report_listening_before_teardown(monkeypatch):
    """In each forked rank, just before the process group goes: write the addresses the rank and its agent (this
    test's process) listen on, to the file named by $parallax_test_listening (one line per rank)."""
    real = dist.destroy_process_group

    def destroy(*args, **kwargs):
        with open(os.environ[_LISTENING], "a") as f:
            f.write(" ".join(sorted(_listening_addrs(os.getpid(), os.getppid()))) + "\n")
        return real(*args, **kwargs)

    monkeypatch.setattr(dist, "destroy_process_group", destroy)


@pytest.fixture
def stage_env(tmp_path, monkeypatch):
    """A private system temp dir, the launch configs the stages build, and the addresses their ranks listened on."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    monkeypatch.setenv(_LISTENING, str(tmp_path / "listening.txt"))
    _report_listening_before_teardown(monkeypatch)
    seen = []
    real = launcher_api.elastic_launch

    def spy(config, entrypoint):
        seen.append((config, os.environ.get("GLOO_SOCKET_IFNAME")))
        return real(config, entrypoint)

    monkeypatch.setattr(launcher_api, "elastic_launch", spy)
    return tmp, seen, tmp_path / "listening.txt"


def _assert_loopback_only_and_nothing_left(tmp, seen, listening):
    addrs = {a for line in listening.read_text().split("\n") for a in line.split()}
    assert addrs and all(ipaddress.ip_address(a).is_loopback for a in addrs), f"listened on {sorted(addrs)}"
    assert sorted(p.name for p in tmp.iterdir()) == [], "left in the system temp dir"
    assert seen, "the stage started no ranks through the elastic launcher"
    for lc, gloo_ifname in seen:
        # the loopback backend's store is on 127.0.0.1 (pipeline/host/loopback.py), as a one-node trial's
        assert lc.rdzv_backend == loopback.BACKEND, lc.rdzv_backend
        assert lc.local_addr == "127.0.0.1", lc.local_addr
        assert gloo_ifname == loopback.interface(), gloo_ifname


def test_the_overlap_stage_listens_on_loopback_only_and_leaves_no_temp_folders(stage_env, tmp_path):
    """`overlap` on a CPU host: its two ranks' rendezvous and Gloo listen on 127.0.0.1 only, and the system temp dir
    is as empty afterwards as before (no torchelastic_* folder)."""
    cfg = loader.override(
        loader.Config(),
        ["overlap.size=16", "overlap.chain=1", "overlap.items=1", "overlap.reps=1", "overlap.warmup=0"],
    )
    res = overlap.run(cfg, tmp_path / "out", watch=Monitor)
    _assert_loopback_only_and_nothing_left(*stage_env)
    # the measurements ran inside the interference monitor: the ranks' CPU time is the stage's own, the rest foreign
    assert isinstance(res["under_load"], bool) and res["interference"]["own_cpu_s"] > 0


def test_the_collectives_stage_listens_on_loopback_only_and_leaves_no_temp_folders(stage_env):
    """`collectives` at k=2 on a CPU host: the same as a trial's ranks (127.0.0.1 only, nothing left in the temp
    dir)."""
    collectives.measure(ks=[2], reps=1, warmup=0, gap_s=0.0, modes=("back_to_back",), fit_bytes=(4096,))
    _assert_loopback_only_and_nothing_left(*stage_env)
