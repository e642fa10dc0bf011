"""One async client per event loop.

An asyncio client (a ``redis.asyncio`` connection pool, a psycopg ``AsyncConnectionPool``)
belongs to the loop it first ran on. A store used from several loops (each test's own
loop, LlamaIndex's sync API running a fresh loop per call) gets one per loop, made on
first use there.

Each client made here has a *keeper*: a task of its loop that only waits, and closes the
client when it is cancelled. ``asyncio.run`` cancels every task when its main coroutine
ends, so a loop that ends without anybody closing the store still closes the client on
that loop, before the loop is gone. Without it a psycopg pool caught mid-connect at that
moment hangs ``asyncio.run``: its connect turns the cancellation into a connection error,
and its worker goes back to waiting for work nobody sends. Closing the pool sends it the
stop it waits for. Closing the store (``close``, ``aclose``) cancels the keepers.
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
        close: Closes a client, awaited on its own loop (by its keeper: see the module).
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
        self._keepers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    async def get(self) -> T:
        """This loop's client, made on first use."""
        loop = asyncio.get_running_loop()
        task = self._by_loop.get(loop)
        if task is None:
            with self._lock:
                task = self._by_loop.get(loop)
                if task is None:
                    task = self._by_loop[loop] = loop.create_task(self._start(loop))
        try:
            return await asyncio.shield(task) if not task.done() else task.result()
        except BaseException:
            if task.done() and (task.cancelled() or task.exception() is not None):
                with self._lock:
                    if self._by_loop.get(loop) is task:
                        del self._by_loop[loop]  # the next call tries again
            raise

    async def _start(self, loop: asyncio.AbstractEventLoop) -> T:
        client = await self._make()
        keeper = loop.create_task(self._keep(client), name="demote-client-keeper")
        with self._lock:
            self._keepers[loop] = keeper
        return client

    async def _keep(self, client: T) -> None:
        """Wait until cancelled (the store closed, or the loop ending), then close."""
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            await self._close(client)

    async def close_current(self) -> None:
        """Close this loop's client, if it has one."""
        loop = asyncio.get_running_loop()
        with self._lock:
            task = self._by_loop.pop(loop, None)
            keeper = self._keepers.pop(loop, None)
        if task is not None and not task.done():
            try:
                await task
            except Exception:
                return  # it never opened
            with self._lock:
                keeper = self._keepers.pop(loop, keeper)
        if keeper is not None and not keeper.done():
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)

    def close_all(self) -> None:
        """Close every loop's client from sync code: scheduled on loops still open."""
        with self._lock:
            tasks = list(self._by_loop.items())
            keepers = dict(self._keepers)
            self._by_loop.clear()
            self._keepers.clear()
        for loop, task in tasks:
            if loop.is_closed():
                continue  # its sockets went with it
            keeper = keepers.get(loop)
            try:
                loop.call_soon_threadsafe(self._close_later, task, keeper)
            except RuntimeError:  # closed meanwhile
                continue

    def _close_later(self, task: asyncio.Task[T], keeper: asyncio.Task[None] | None) -> None:
        if not task.done():
            task.cancel()  # a client made after this is closed by its keeper at loop end
        if keeper is not None and not keeper.done():
            keeper.cancel()
