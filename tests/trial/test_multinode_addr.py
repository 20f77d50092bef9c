"""A multi-node trial's advertised address: train.local_addr reaches torch's LaunchConfig, and a host whose name
resolves only to a loopback address is refused at once, naming the cause and the fix, when the nodes are on
separate machines (no hang of a minute with a message that does not say why)."""

from __future__ import annotations

import socket

import pytest

from tests.trial.tiny_args import tiny_synthetic_sets


def _loopback_named_host(monkeypatch, addr="127.0.1.1"):
    """Debian's `127.0.1.1 myhost` line: this host's name resolves to a loopback address only."""
    real = socket.getaddrinfo

    def fake(host, *a, **k):
        if host == "myhost":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (addr, 0))]
        return real(host, *a, **k)

    monkeypatch.setattr(socket, "getfqdn", lambda name="": "myhost")
    monkeypatch.setattr(socket, "gethostname", lambda: "myhost")
    monkeypatch.setattr(socket, "getaddrinfo", fake)


def test_loopback_host_name_refused_for_separate_machines(make_cfg, monkeypatch):
    """nnodes=2, a rendezvous on another machine, no local_addr, and a host name that resolves to 127.0.1.1: refused
    up front with the cause (the name's loopback address) and the fix (train.local_addr)."""
    from pipeline.host.devices import probe
    from pipeline.trial.launch import Infeasible, check_feasible

    _loopback_named_host(monkeypatch)
    cfg = make_cfg("train.strategy=ddp", "train.devices=2", "train.nnodes=2", "train.rdzv_endpoint=10.9.8.7:29400")
    with pytest.raises(Infeasible, match=r"(?s)myhost.*127\.0\.1\.1.*train\.local_addr"):
        check_feasible(cfg, probe())


def test_local_addr_or_loopback_rendezvous_is_accepted(make_cfg, monkeypatch):
    """The same host passes with train.local_addr set, and with every node on this machine (a loopback rendezvous),
    as tests/trial/test_multinode.py runs them."""
    from pipeline.host.devices import probe
    from pipeline.trial.launch import check_feasible

    _loopback_named_host(monkeypatch)
    host = probe()
    check_feasible(
        make_cfg(
            "train.strategy=ddp",
            "train.devices=2",
            "train.nnodes=2",
            "train.local_addr=10.9.8.6",
            "train.rdzv_endpoint=10.9.8.7:29400",
        ),
        host,
    )
    check_feasible(
        make_cfg("train.strategy=ddp", "train.devices=2", "train.nnodes=2", "train.rdzv_endpoint=127.0.0.1:29400"), host
    )


def test_local_addr_reaches_launch_config(make_cfg):
    """train.local_addr is the address torch's elastic agent advertises (LaunchConfig.local_addr); unset, torch's own
    default (the host name) applies."""
    from pipeline.trial.ranks import rendezvous_args

    cfg = make_cfg(
        "train.strategy=ddp",
        "train.devices=2",
        "train.nnodes=2",
        "train.local_addr=10.9.8.6",
        "train.rdzv_endpoint=10.9.8.7:29400",
    )
    assert rendezvous_args(cfg.train)["local_addr"] == "10.9.8.6"
    cfg = make_cfg("train.strategy=ddp", "train.devices=2", "train.nnodes=2", "train.rdzv_endpoint=10.9.8.7:29400")
    assert rendezvous_args(cfg.train)["local_addr"] is None


def _own_routable_address() -> str | None:
    """An address of this host that is not loopback (the one a default route would use), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: only picks the outgoing address
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") else addr


@pytest.mark.slow
def test_two_nodes_on_this_host_advertising_local_addr(tmp_path, synthetic_root):
    """On this real host: with the rendezvous on its routable address, the documented two-node command is refused at
    once when the host name resolves to loopback only, and runs to the end with train.local_addr set to that
    address (the agent's store and Gloo on it)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from pipeline.trial.launch import _addresses, _loopback_only

    addr = _own_routable_address()
    if addr is None:
        pytest.skip("this host has no routable IPv4 address")
    repo = Path(__file__).resolve().parents[2]
    with socket.socket() as s:
        s.bind((addr, 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "DVC_ROOT": str(tmp_path)}

    def node(n, *extra):
        return subprocess.Popen(
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
                "--max-steps",
                "1",
                "--no-track",
                "--quiet",
                *tiny_synthetic_sets(synthetic_root),
                "--set",
                "train.nnodes=2",
                "--set",
                f"train.node_rank={n}",
                "--set",
                f"train.rdzv_endpoint={addr}:{port}",
                "--set",
                "train.rdzv_id=addr-test",
                "--out",
                str(tmp_path / f"node{n}"),
                *extra,
            ],
            cwd=repo,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    if _loopback_only(_addresses(socket.getfqdn())):
        out = node(1).communicate(timeout=120)[0]  # alone: only the up-front check can end it with this message
        assert "train.local_addr" in out and "loopback" in out, out[-2000:]
    procs = [node(n, "--set", f"train.local_addr={addr}") for n in (0, 1)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
