"""One async client per event loop.

An asyncio client (a ``redis.asyncio`` connection pool, a psycopg ``AsyncConnectionPool``)
belongs to the loop it first ran on. A store used from several loops (each test's own
loop, LlamaIndex's sync API running a fresh loop per call) gets one per loop, made on
first use there and dropped with the loop.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

__all__ = ["PerLoop"]

T = TypeVar("T")


class PerLoop(Generic[T]):
    """Makes, keeps and closes one ``T`` per running event loop.

    Args:
        make: Builds the client; awaited once per loop (concurrent first calls on one
            loop share the same build).
        close: Closes a client, awaited on its own loop.
    """

    def __init__(
        self,
        make: Callable[[], Coroutine[Any, Any, T]],
        close: Callable[[T], Coroutine[Any, Any, None]],
    ) -> None:
        self._make = make
        self._close = close
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[T]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        self._closing: set[asyncio.Task[None]] = set()

    async def get(self) -> T:
        """This loop's client, made on first use."""
        loop = asyncio.get_running_loop()
        task = self._by_loop.get(loop)
        if task is None:
            with self._lock:
                task = self._by_loop.get(loop)
                if task is None:
                    task = self._by_loop[loop] = loop.create_task(self._make())
        try:
            return await asyncio.shield(task) if not task.done() else task.result()
        except BaseException:
            if task.done() and (task.cancelled() or task.exception() is not None):
                with self._lock:
                    if self._by_loop.get(loop) is task:
                        del self._by_loop[loop]  # the next call tries again
            raise

    async def close_current(self) -> None:
        """Close this loop's client, if it has one."""
        with self._lock:
            task = self._by_loop.pop(asyncio.get_running_loop(), None)
        if task is not None:
            try:
                client = await task
            except Exception:
                return  # it never opened
            await self._close(client)

    def close_all(self) -> None:
        """Close every loop's client from sync code: scheduled on loops still open."""
        with self._lock:
            tasks = list(self._by_loop.values())
            self._by_loop.clear()
        for task in tasks:
            loop = task.get_loop()
            if loop.is_closed():
                continue  # its sockets went with it
            try:
                loop.call_soon_threadsafe(self._close_later, task)
            except RuntimeError:  # closed meanwhile
                continue

    def _close_later(self, task: asyncio.Task[T]) -> None:
        if not task.done():
            task.cancel()
        elif not task.cancelled() and task.exception() is None:
            closing = task.get_loop().create_task(self._close(task.result()))
            self._closing.add(closing)  # a task nobody references may be collected
            closing.add_done_callback(self._closing.discard)
