"""A small TCP proxy on 127.0.0.1 for fault tests: forward, cut, black-hole, restore.

``TcpProxy(port)`` listens on an ephemeral port and forwards every connection to
``127.0.0.1:port``. ``cut()`` closes every connection it carries (both ends), as a
restarted server or a dropped NAT entry would. ``blackhole()`` stops forwarding without
closing anything: connections stay open and acknowledged, requests go unanswered, new
connections are accepted and never forwarded, as behind a stalled load balancer.
``down()`` cuts everything and refuses new connections (accepted, then closed at once),
as a stopped server would. ``restore()`` forwards new connections again (black-holed
ones stay dead: cut them).
One thread, ``selectors``; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from types import TracebackType
from typing import Self

__all__ = ["TcpProxy"]


class TcpProxy:
    """Forwards 127.0.0.1:<ephemeral> to 127.0.0.1:``target_port``."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ)
        self._peers: dict[socket.socket, socket.socket] = {}
        self._held: list[socket.socket] = []  # accepted while black-holed, never forwarded
        self._lock = threading.Lock()
        self._blackholed = False
        self._refusing = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tcp-proxy", daemon=True)
        self.accepted = 0

    def start(self) -> Self:
        """Start forwarding; returns the proxy."""
        self._thread.start()
        return self

    def url(self, scheme_and_auth: str, path: str) -> str:
        """A URL through the proxy, e.g. ``url("redis://", "/14")``."""
        return f"{scheme_and_auth}127.0.0.1:{self.port}{path}"

    def _loop(self) -> None:
        while not self._stop.is_set():
            events = self._sel.select(timeout=0.05)
            with self._lock:
                for key, _ in events:
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock is self._listener:
                        self._accept()
                    elif not self._blackholed and sock in self._peers:
                        self._forward(sock)

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        self.accepted += 1
        if self._refusing:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)
            client.close()
            return
        if self._blackholed:
            self._held.append(client)
            return
        try:
            upstream = socket.create_connection(self.target, timeout=2)
        except OSError:
            client.close()
            return
        for s in (client, upstream):
            s.setblocking(False)
        self._peers[client], self._peers[upstream] = upstream, client
        self._sel.register(client, selectors.EVENT_READ)
        self._sel.register(upstream, selectors.EVENT_READ)

    def _forward(self, sock: socket.socket) -> None:
        other = self._peers[sock]
        try:
            data = sock.recv(65536)
            if data:
                other.setblocking(True)
                other.settimeout(2)
                other.sendall(data)
                other.setblocking(False)
                return
        except OSError:
            pass
        self._close_pair(sock)

    def _close_pair(self, sock: socket.socket) -> None:
        other = self._peers.pop(sock, None)
        for s in (sock, other):
            if s is None:
                continue
            self._peers.pop(s, None)
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(s)
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def cut(self) -> None:
        """Close every connection now (both ends); new ones are forwarded as before."""
        with self._lock:
            for sock in list(self._peers):
                self._close_pair(sock)
            for sock in self._held:
                sock.close()
            self._held.clear()

    def blackhole(self) -> None:
        """Stop forwarding, closing nothing: every request from now on goes unanswered."""
        with self._lock:
            self._blackholed = True
            for sock in self._peers:  # unread sockets would keep the selector spinning
                with contextlib.suppress(KeyError, ValueError):
                    self._sel.unregister(sock)

    def down(self) -> None:
        """Cut every connection and refuse new ones until :meth:`restore`."""
        with self._lock:
            self._refusing = True
        self.cut()

    def restore(self) -> None:
        """Forward again (connections black-holed meanwhile are cut)."""
        with self._lock:
            self._blackholed = False
            self._refusing = False
        self.cut()

    def close(self) -> None:
        """Stop the proxy and close everything."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self.cut()
        self._sel.close()
        self._listener.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
