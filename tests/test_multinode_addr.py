"""A multi-node trial's advertised address: train.local_addr reaches torch's LaunchConfig, and a host whose name
resolves only to a loopback address is refused at once, naming the cause and the fix, when the nodes are on
separate machines (no hang of a minute with a message that does not say why)."""
from __future__ import annotations

import socket

import pytest


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
    from pipeline.devices import probe
    from pipeline.launch import Infeasible, check_feasible
    _loopback_named_host(monkeypatch)
    cfg = make_cfg("train.strategy=ddp", "train.devices=2", "train.nnodes=2", "train.rdzv_endpoint=10.9.8.7:29400")
    with pytest.raises(Infeasible, match=r"(?s)myhost.*127\.0\.1\.1.*train\.local_addr"):
        check_feasible(cfg, probe())


def test_local_addr_or_loopback_rendezvous_is_accepted(make_cfg, monkeypatch):
    """The same host passes with train.local_addr set, and with every node on this machine (a loopback rendezvous),
    as tests/test_multinode.py runs them."""
    from pipeline.devices import probe
    from pipeline.launch import check_feasible
    _loopback_named_host(monkeypatch)
    host = probe()
    check_feasible(make_cfg("train.strategy=ddp", "train.devices=2", "train.nnodes=2", "train.local_addr=10.9.8.6",
                            "train.rdzv_endpoint=10.9.8.7:29400"), host)
    check_feasible(make_cfg("train.strategy=ddp", "train.devices=2", "train.nnodes=2",
                            "train.rdzv_endpoint=127.0.0.1:29400"), host)


def test_local_addr_reaches_launch_config(make_cfg):
    """train.local_addr is the address torch's elastic agent advertises (LaunchConfig.local_addr); unset, torch's own
    default (the host name) applies."""
    from pipeline.ranks import rendezvous_args
    cfg = make_cfg("train.strategy=ddp", "train.devices=2", "train.nnodes=2", "train.local_addr=10.9.8.6",
                   "train.rdzv_endpoint=10.9.8.7:29400")
    assert rendezvous_args(cfg.train)["local_addr"] == "10.9.8.6"
    cfg = make_cfg("train.strategy=ddp", "train.devices=2", "train.nnodes=2", "train.rdzv_endpoint=10.9.8.7:29400")
    assert rendezvous_args(cfg.train)["local_addr"] is None
