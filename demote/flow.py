"""Sans-I/O flows: the operations a flow yields, the flow type, two drivers, run_sync.

The one place that speaks of flows; every part that does I/O imports it. Logic that does
I/O is written once, as a generator (sans-I/O, like httpx's ``auth_flow``): it yields an
operation (:class:`Op`) when it needs I/O and receives its result, or its exception, back.
Such a generator is a :data:`Flow`. The sync driver (:func:`drive_sync`) performs each
operation with blocking calls, the async driver (:func:`drive_async`) awaits it;
everything else is shared. Cancelling an async driver closes the flow, so its ``finally``
blocks run.

The operations here are the general ones: a method call by name with its ``a``-twin
(:class:`Call`), a function with its async twin (:class:`Twin`), a pause
(:class:`Sleep`), a flow run in the background (:class:`Spawn`). A part with I/O of its
own declares operations of its own (anything with ``run_sync`` and ``run_async``): the
engine's hook and summary (:mod:`demote.engine._flow`), the PostgreSQL archive's pooled
connections, mem0's calls. :func:`run_sync` runs a coroutine to completion from sync code,
with or without a running loop.

This module imports nothing of demote: it is the ground floor, below the engine, the
stores, the long tail and the adapters.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

__all__ = [
    "Call",
    "Flow",
    "Op",
    "Sleep",
    "Spawn",
    "Twin",
    "drive_async",
    "drive_sync",
    "run_sync",
]

R = TypeVar("R")
T = TypeVar("T")


class Op(Protocol):
    """One I/O operation: performed blocking or awaited, with the same result."""

    def run_sync(self) -> Any:
        """Perform the operation with blocking calls."""

    async def run_async(self) -> Any:
        """Perform the operation without blocking the event loop."""


#: A flow: yields operations, is sent their results, returns an ``R``.
Flow = Generator[Op, Any, R]


@dataclass(slots=True)
class Call:
    """Call ``target.<name>(*args, **kwargs)``; the async path awaits ``a<name>``.

    A target without that async twin runs the sync method in a worker thread, unless it
    declares ``nonblocking = True`` (no I/O at all): then the sync method is called.
    """

    target: object
    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def run_sync(self) -> Any:
        """Call the method (an async-only target's twin runs to its end here)."""
        method = getattr(self.target, self.name, None)
        if method is None:  # an async-only target, from sync code
            return run_sync(getattr(self.target, "a" + self.name)(*self.args, **self.kwargs))
        return method(*self.args, **self.kwargs)

    async def run_async(self) -> Any:
        """Await the async twin, else call the method in a thread (or here, if nonblocking)."""
        twin = getattr(self.target, "a" + self.name, None)
        if twin is not None:
            return await twin(*self.args, **self.kwargs)
        method = getattr(self.target, self.name)
        if getattr(self.target, "nonblocking", False):
            return method(*self.args, **self.kwargs)
        return await asyncio.to_thread(method, *self.args, **self.kwargs)


@dataclass(slots=True)
class Twin:
    """Call ``sync(*args)`` blocking, or await ``asynchronous(*args)``.

    For a pair of functions that are not a target's ``name`` / ``aname`` methods (a chat
    store's ``get_all`` / ``aget_all`` bound elsewhere, two closures); else :class:`Call`.
    """

    sync: Callable[..., Any]
    asynchronous: Callable[..., Awaitable[Any]]
    args: tuple[Any, ...] = ()

    def run_sync(self) -> Any:
        """``sync(*args)``."""
        return self.sync(*self.args)

    async def run_async(self) -> Any:
        """``await asynchronous(*args)``."""
        return await self.asynchronous(*self.args)


@dataclass(slots=True)
class Sleep:
    """Pause the flow (``time.sleep`` or ``asyncio.sleep``)."""

    seconds: float

    def run_sync(self) -> None:
        """``time.sleep``."""
        time.sleep(self.seconds)

    async def run_async(self) -> None:
        """``asyncio.sleep``."""
        await asyncio.sleep(self.seconds)


@dataclass(slots=True)
class Spawn:
    """Run another flow in the background: a thread for sync callers, a task for async."""

    flow: Flow[Any]
    tracker: set[Any]
    lock: threading.Lock

    def run_sync(self) -> None:
        """Start the flow on a daemon thread, tracked until it ends."""
        thread = threading.Thread(target=self._run_thread, name="demote-background", daemon=True)
        with self.lock:
            self.tracker.add(thread)
        thread.start()

    def _run_thread(self) -> None:
        try:
            drive_sync(self.flow)
        finally:
            with self.lock:
                self.tracker.discard(threading.current_thread())

    async def run_async(self) -> None:
        """Start the flow as a task on the running loop, tracked until it ends."""
        task = asyncio.get_running_loop().create_task(drive_async(self.flow))
        with self.lock:
            self.tracker.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            with self.lock:
                self.tracker.discard(t)

        task.add_done_callback(done)


def drive_sync(flow: Flow[R]) -> R:
    """Run ``flow`` to its end, performing each operation with blocking calls."""
    result: Any = None
    error: Exception | None = None
    while True:
        try:
            op = flow.throw(error) if error is not None else flow.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        try:
            result, error = op.run_sync(), None
        except Exception as exc:  # handed back to the flow, which decides
            result, error = None, exc
        except BaseException:
            flow.close()
            raise


async def drive_async(flow: Flow[R]) -> R:
    """Run ``flow`` to its end, awaiting each operation (cancellation closes the flow)."""
    result: Any = None
    error: Exception | None = None
    while True:
        try:
            op = flow.throw(error) if error is not None else flow.send(result)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        try:
            result, error = await op.run_async(), None
        except Exception as exc:
            result, error = None, exc
        except BaseException:
            flow.close()
            raise


def run_sync(awaitable: Awaitable[T]) -> T:
    """Run ``awaitable`` to completion and return its result.

    In a thread without an event loop this is ``asyncio.run``; inside a running loop (a
    sync API called from async code) it runs on a fresh loop in a helper thread, so the
    caller's loop is never re-entered.
    """

    async def main() -> T:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(main())
        except BaseException as exc:  # handed to the calling thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="demote-run-sync", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]
