"""Client-side deadlines for a database round trip, and a zero-cost liveness check.

PostgreSQL's ``statement_timeout`` only helps while the server hears us; keepalives and
``tcp_user_timeout`` only while the peer's kernel stops acknowledging. A connection that
is accepted and acknowledged but never answered (a stalled proxy, a frozen server) needs a
deadline on the client. psycopg has none for a query, so when one passes we shut the
socket down (``shutdown(2)`` on a duplicate of its descriptor: the waiting call sees the
connection end and raises, and no descriptor is ever closed under it). The connection is
then broken and its pool replaces it.

The sync path arms the deadline on one shared watchdog thread; the async path on the
event loop (``call_later``). Disarming happens before the connection goes back to its
pool, under the same lock as firing, so a late alarm never touches a reused descriptor.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["Deadline", "idle_socket_has_data", "loop_deadline", "thread_deadline"]


@dataclass(eq=False, slots=True)
class Deadline:
    """One armed deadline; ``fired`` says whether it shut the socket down."""

    at: float
    fd: int
    fired: bool = False
    cancelled: bool = False


def _shutdown(fd: int) -> None:
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


class _Watchdog:
    """One daemon thread firing the sync path's deadlines."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Deadline]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, fd: int, seconds: float) -> Deadline:
        alarm = Deadline(time.monotonic() + seconds, fd)
        with self._cond:
            heap = self._heap
            while heap and heap[0][2].cancelled:
                heapq.heappop(heap)
            heapq.heappush(heap, (alarm.at, next(self._seq), alarm))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="demote-deadlines", daemon=True
                )
                self._thread.start()
            elif heap[0][2] is alarm:
                self._cond.notify()
        return alarm

    def disarm(self, alarm: Deadline) -> None:
        with self._cond:
            alarm.cancelled = True

    def _loop(self) -> None:
        with self._cond:
            while True:
                heap = self._heap
                while heap and heap[0][2].cancelled:
                    heapq.heappop(heap)
                if not heap:
                    self._cond.wait()
                    continue
                wait = heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                alarm = heapq.heappop(heap)[2]
                alarm.fired = True
                _shutdown(alarm.fd)


_WATCHDOG = _Watchdog()


@contextmanager
def thread_deadline(fd: int, seconds: float) -> Iterator[Deadline]:
    """Shut ``fd`` down if the block is still running after ``seconds`` (sync code)."""
    alarm = _WATCHDOG.arm(fd, seconds)
    try:
        yield alarm
    finally:
        _WATCHDOG.disarm(alarm)


@contextmanager
def loop_deadline(fd: int, seconds: float) -> Iterator[Deadline]:
    """Shut ``fd`` down if the block is still running after ``seconds`` (in a coroutine)."""
    alarm = Deadline(0.0, fd)

    def fire() -> None:
        alarm.fired = True
        _shutdown(fd)

    handle = asyncio.get_running_loop().call_later(seconds, fire)
    try:
        yield alarm
    finally:
        handle.cancel()


def idle_socket_has_data(fd: int) -> bool:
    """Whether an idle connection's socket is readable (its server left, or spoke unasked).

    A terminated backend sends its FATAL error, then EOF: either makes the socket readable.
    """
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)  # pragma: no cover - Windows
    return bool(readable)
