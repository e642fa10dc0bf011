"""The I/O operations a demotion flow yields, and the two drivers that perform them.

The engine's logic lives in generators (sans-I/O, like httpx's ``auth_flow``): they yield
an operation when they need I/O and receive its result, or its exception, back. The sync
driver performs an operation with blocking calls, the async driver awaits it; everything
else is shared. Cancelling an async driver closes the flow, so its ``finally`` blocks run
(the in-flight gate is always released).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from demote.errors import HookTimeout, SummarizerError
from demote.hooks.simple import deliver_async, deliver_sync
from demote.records import Demotion, MessageRecord
from demote.sync import run_sync

R = TypeVar("R")


class Op(Protocol):
    """One I/O operation: performed blocking or awaited, with the same result."""

    def run_sync(self) -> Any:
        """Perform the operation with blocking calls."""

    async def run_async(self) -> Any:
        """Perform the operation without blocking the event loop."""


Flow = Generator[Op, Any, R]


async def _bounded(awaitable: Any, timeout: float | None, what: str) -> Any:
    if timeout is None:
        return await awaitable
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except TimeoutError as exc:
        raise HookTimeout(f"{what} did not finish within {timeout} s") from exc


@dataclass(slots=True)
class Deliver:
    """Hand a batch to the hook."""

    hook: object
    batch: Demotion
    timeout: float | None = None

    def run_sync(self) -> None:
        deliver_sync(self.hook, self.batch)

    async def run_async(self) -> None:
        await _bounded(deliver_async(self.hook, self.batch), self.timeout, "hook")


@dataclass(slots=True)
class Summarize:
    """Fold messages into the running summary; the result is the new summary text."""

    summarizer: object
    previous: str | None
    messages: Sequence[MessageRecord]

    def run_sync(self) -> str:
        fn = getattr(self.summarizer, "summarize", None)
        if fn is not None:
            return _text(fn(self.previous, self.messages))
        return _text(run_sync(self.summarizer.asummarize(self.previous, self.messages)))  # type: ignore[attr-defined]

    async def run_async(self) -> str:
        fn = getattr(self.summarizer, "asummarize", None)
        if fn is not None:
            return _text(await fn(self.previous, self.messages))
        summarize = self.summarizer.summarize  # type: ignore[attr-defined]
        return _text(await asyncio.to_thread(summarize, self.previous, self.messages))


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise SummarizerError(f"summarizer returned {type(value).__name__}, not str")
    return value


@dataclass(slots=True)
class Sleep:
    """Pause the flow (``time.sleep`` or ``asyncio.sleep``)."""

    seconds: float

    def run_sync(self) -> None:
        time.sleep(self.seconds)

    async def run_async(self) -> None:
        await asyncio.sleep(self.seconds)


@dataclass(slots=True)
class Spawn:
    """Run another flow in the background: a thread for sync callers, a task for async."""

    flow: Flow[Any]
    tracker: set[Any]
    lock: threading.Lock

    def run_sync(self) -> None:
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
