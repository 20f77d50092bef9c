"""Watch the rendezvous host of a multi-node trial from a node that does not host it, so that a partition ends the
trial within a bound instead of hanging it.

torch's elastic agent polls the rendezvous store (node 0's TCPStore) from its main loop, and a store call to a host
that keeps its connections open but never answers (stopped, or cut off by the network) blocks for as long as that
lasts, whatever the store's timeout. A probe thread asks the store for a counter every few seconds; when no answer
has come for `bound_s`, the watch marks the host lost and shuts down this process's sockets to it, so the agent's
blocked call fails at once, the agent stops this node's ranks, and the caller raises the reason (`lost`). From then
until the watch ends, this process's stderr goes to /dev/null: what torch prints while it gives up (a C++ frame dump
for every failed store call) says nothing the caller's message does not."""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import sys
import threading
import time


def _peer_addresses(host: str, port: int) -> set[tuple[str, int]]:
    try:
        return {(info[4][0], port) for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    except OSError:
        return set()


def _normal(addr: str) -> str:
    return addr[7:] if addr.startswith("::ffff:") else addr


def cut_connections(host: str, port: int) -> int:
    """Shut down every socket of this process connected to host:port; how many. A call blocked on one returns."""
    peers = {(_normal(a), p) for a, p in _peer_addresses(host, port)}
    fd_dir = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    cut = 0
    for name in os.listdir(fd_dir):
        try:
            s = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue
        with s, contextlib.suppress(OSError):
            peer = s.getpeername()
            if isinstance(peer, tuple) and (_normal(peer[0]), peer[1]) in peers:
                s.shutdown(socket.SHUT_RDWR)
                cut += 1
    return cut


class RendezvousWatch:
    """A context manager: while inside, `lost` turns True once the store at `endpoint` (HOST:PORT) has not answered
    for `bound_s` seconds, and from then on every connection to it is cut."""

    def __init__(self, endpoint: str, bound_s: float):
        host, _, port = endpoint.rpartition(":")
        self.host, self.port, self.bound_s = host.strip("[]"), int(port), bound_s
        self.interval_s = max(min(5.0, bound_s / 4), 0.5)
        self.lost = False
        self._last_ok = time.monotonic()
        self._stop = threading.Event()
        self._stderr: int | None = None

    def _probe(self) -> None:
        from torch.distributed import TCPStore

        store = None
        while not self._stop.is_set() and not self.lost:
            try:
                if store is None:  # not up yet, or unreachable: asked in Python first (torch prints a C++ dump)
                    socket.create_connection((self.host, self.port), timeout=self.interval_s).close()
                    store = TCPStore(
                        self.host,
                        self.port,
                        is_master=False,
                        wait_for_workers=False,
                        timeout=datetime.timedelta(seconds=self.interval_s * 2),
                    )
                store.add("parallax/rdzv_watch", 1)
                self._last_ok = time.monotonic()
            except Exception:  # no answer, or a broken connection: try again with a new one
                store = None
            self._stop.wait(self.interval_s)

    def _judge(self) -> None:
        while not self._stop.wait(1.0):
            if not self.lost and time.monotonic() - self._last_ok > self.bound_s and not self._stop.is_set():
                print(
                    f"the rendezvous host {self.host}:{self.port} has not answered for {self.bound_s:.0f} s: "
                    f"stopping this node's ranks",
                    file=sys.stderr,
                    flush=True,
                )
                self._quiet()
                self.lost = True
            if self.lost:  # again every second: a retry may have opened a new connection
                cut_connections(self.host, self.port)

    def _quiet(self) -> None:
        sys.stderr.flush()
        self._stderr = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)

    def __enter__(self):
        for target in (self._probe, self._judge):
            threading.Thread(target=target, daemon=True, name=f"rdzv-watch-{target.__name__}").start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._stderr is not None:
            sys.stderr.flush()
            os.dup2(self._stderr, 2)
            os.close(self._stderr)
            self._stderr = None
        return False
