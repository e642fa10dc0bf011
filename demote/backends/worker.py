"""A store's own worker threads, where the async twins of blocking calls run.

Not the event loop's default executor: a slow or stuck store then cannot starve the
application's own ``asyncio.to_thread`` calls, and a store with one connection (SQLite)
gets one thread, so its calls never queue behind each other's locks.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from demote.errors import StoreError

__all__ = ["Worker"]

T = TypeVar("T")


class Worker:
    """Runs blocking calls on ``threads`` threads of its own, started on first use."""

    def __init__(self, name: str, threads: int = 1) -> None:
        self._name = name
        self._threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False

    def _start(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._closed:
                raise StoreError(f"{self._name} is closed")
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix=self._name)
            return self._executor

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Await ``fn(*args)`` run on the worker's threads."""
        executor = self._executor if self._executor is not None else self._start()
        try:
            future = executor.submit(fn, *args)
        except RuntimeError as exc:  # shut down meanwhile
            raise StoreError(f"{self._name} is closed") from exc
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        """Stop the threads once their queued calls are done (idempotent, never waits)."""
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)
