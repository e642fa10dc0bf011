"""The tests' network guard: a connection to any non-loopback address fails at once.

``tests/conftest.py`` puts it in place for every test; processes a test starts to run
documentation or helper scripts call :func:`guard` themselves.
"""

from __future__ import annotations

import socket
from typing import Any

__all__ = ["guard", "guarded_connect"]

_real_connect = socket.socket.connect


def _is_local(address: Any) -> bool:
    if isinstance(address, tuple) and address:
        host = str(address[0])
        return host in ("localhost", "::1") or host.startswith("127.")
    return True  # unix sockets


def guarded_connect(self: socket.socket, address: Any) -> Any:
    """``socket.connect``, refusing any address that is not on this machine."""
    if not _is_local(address):
        raise ConnectionRefusedError(f"test tried to reach the network: {address!r}")
    return _real_connect(self, address)


def guard() -> None:
    """Refuse non-loopback connections in this whole process from now on."""
    socket.socket.connect = guarded_connect  # type: ignore[method-assign]
