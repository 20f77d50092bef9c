"""The collectives of a multi-node trial on the interface of train.local_addr, the address this node advertises.

Gloo and NCCL bind the address of the host name unless GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME name an interface; on
a host whose name resolves to a loopback address (Debian's `127.0.1.1 myhost` line) that is an address no other node
reaches. With train.local_addr set, the interface holding that address is named for them, unless the user named one.
"""

from __future__ import annotations

import contextlib
import os
import socket

_SIOCGIFADDR = 0x8915
KEYS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def interface_of(addr: str) -> str | None:
    """The name of the interface holding IPv4 address `addr`, or None (another address, or not Linux)."""
    try:
        import fcntl
        import struct

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _, name in socket.if_nameindex():
                req = struct.pack("256s", name.encode()[:15])
                with contextlib.suppress(OSError):
                    if socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, req)[20:24]) == addr:
                        return name
    except (ImportError, OSError):
        pass
    return None


@contextlib.contextmanager
def collectives_on(addr: str):
    """For the ranks started inside (they inherit the environment): Gloo's and NCCL's sockets on the interface of
    `addr`, for each of the two variables the user left unset; the previous settings come back afterwards."""
    name = interface_of(addr) if addr else None
    unset = [k for k in KEYS if not os.environ.get(k)] if name else []
    os.environ.update(dict.fromkeys(unset, name))
    try:
        yield
    finally:
        for k in unset:
            os.environ.pop(k, None)
