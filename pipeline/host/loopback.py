"""One-node trials listen on the loopback interface only.

PyTorch's static rendezvous creates its TCPStore server (unauthenticated) listening on every interface, IPv4 and
IPv6, whatever address it is given: TCPStore has no bind-address option. It does take `master_listen_fd`, a socket
already bound and listening, and owns it from then on (closes it when the store goes). So the `parallax-loopback`
rendezvous backend, registered in PyTorch's handler registry, is the static one with a store on a socket bound to
127.0.0.1 (an ephemeral port: no race for a "free" port either). Gloo and NCCL bind the address of the host name
unless GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME name an interface: the loopback interface for a one-node trial.
Multi-node trials keep torchrun's c10d rendezvous on the endpoint the user names.
"""

from __future__ import annotations

import contextlib
import os
import socket

BACKEND = "parallax-loopback"
_IFF_LOOPBACK, _SIOCGIFFLAGS = 0x8, 0x8913


def _create_handler(params):
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

    class LoopbackRendezvous(StaticTCPRendezvous):
        def get_backend(self) -> str:
            return BACKEND

        def next_rendezvous(self):
            if not self._store:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.bind(("127.0.0.1", 0))
                sock.listen(128)
                self.master_addr, self.master_port = sock.getsockname()
                self._store = TCPStore(
                    self.master_addr,
                    self.master_port,
                    self.world_size,
                    True,
                    self.timeout,
                    multi_tenant=True,
                    master_listen_fd=sock.detach(),
                )  # the store owns it
            return super().next_rendezvous()

    timeout = int(params.config.get("timeout", 600))
    return LoopbackRendezvous("127.0.0.1", 0, 0, 1, params.run_id, timeout)


def register() -> str:
    """Register the backend once per process; returns its name for LaunchConfig.rdzv_backend."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(BACKEND, _create_handler)  # the same creator again is a no-op
    return BACKEND


def interface() -> str:
    """The name of the loopback interface ("lo" on Linux, "lo0" on macOS)."""
    names = [name for _, name in socket.if_nameindex()]
    try:
        import fcntl
        import struct

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for name in names:
                req = struct.pack("16sH14s", name.encode()[:15], 0, b"")
                flags = struct.unpack("16sH14s", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, req))[1]
                if flags & _IFF_LOOPBACK:
                    return name
    except (ImportError, OSError):
        pass
    return next((n for n in names if n.startswith("lo")), "lo")


@contextlib.contextmanager
def collectives_on_loopback():
    """Gloo's and NCCL's sockets on the loopback interface for the ranks started inside (they inherit the
    environment); the previous settings come back afterwards."""
    name = interface()
    keys = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(dict.fromkeys(keys, name))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
