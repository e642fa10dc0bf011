"""Recorder and AsyncRecorder: hand work to a slow sink without waiting for it.

Two failures shape it: a crash loses what was only queued in memory (here an optional
outbox makes the queue durable), and a flush at exit that delivers what is queued while
the worker is still running delivers items twice (here only the worker ever delivers).

Theory of operation:

* ``enqueue(item)`` returns at once. Blank items and enqueues after ``close`` are ignored
  and counted as dropped. The item gets a dedup key (:func:`~demote.capture.dedup_key`);
  with an outbox it is serialised and written durably first. The first ``enqueue`` starts
  the worker if ``start`` was not called.
* One worker (a daemon thread for :class:`Recorder`, an asyncio task for
  :class:`AsyncRecorder`) takes items in order and gives each to the sink. A sink failure
  is caught and logged at WARNING; it never stops the worker nor reaches the caller.
  Without an outbox the failed item is counted failed and dropped; with one it is retried
  with exponential backoff, then dead-lettered. Every decision is made by the sans-I/O
  :class:`~demote.capture.dispatch.Dispatcher`, shared by both workers.
* ``close`` pushes a STOP sentinel behind everything already queued and waits up to
  ``flush_timeout`` for the worker to reach it. It never delivers anything itself, so it
  cannot race the worker into a double delivery. What is still unfinished then is counted
  as abandoned and logged: lost without an outbox, left in the outbox with one. A
  :class:`Recorder` also closes itself at interpreter exit (bounded the same way); its
  thread is a daemon, so it never holds the process open.
* On ``start`` with an outbox, items a previous process left there are delivered first.

A Recorder is a demotion hook (``deliver``/``adeliver`` enqueue the batch) and a capture
sink (``capture`` enqueues the turn), so ``Demoter(hook=Recorder(SQLiteArchive(...)))``
takes the archive write off the request path. What that does to the watermark guarantee:

* Without an outbox the engine's watermark advances as soon as the batch is *queued*. A
  crash before the sink has run loses that batch from the long tail (the messages have
  left the active window already): the window trades durability for latency.
* With an outbox the batch is durable once queued: a crash at any point re-delivers it
  on the next start. Delivery becomes at-least-once; the sink sees the same dedup key
  (:func:`current_key`) for a repeat, and the built-in hooks are idempotent on it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import inspect
import queue
import threading
from collections.abc import Awaitable
from types import TracebackType
from typing import Any, Self

from demote._closing import Closing
from demote.capture.base import CURRENT_KEY, MAX_QUEUED, RecorderBase, current_key
from demote.capture.dispatch import Wait
from demote.capture.outbox import SQLiteOutbox
from demote.records import Demotion

__all__ = ["AsyncRecorder", "Recorder", "current_key"]


async def _awaited(result: Awaitable[Any]) -> Any:
    """``result`` awaited: ``Runner.run`` takes coroutines only, a sink may return futures."""
    return await result


class Recorder(RecorderBase, Closing):
    """Delivers items to a sink from one background thread, off the caller's path.

    Args:
        sink: A callable taking one item, or an object with ``deliver(item)`` (preferred)
            or ``async adeliver(item)`` (run on the worker thread's own event loop).
        flush_timeout: Seconds ``close`` waits for queued items to drain.
        outbox: Makes queued items durable, retried and dead-lettered (see
            :class:`~demote.capture.SQLiteOutbox`).
        max_queued: At most this many items wait for the sink (queued, in backoff, in
            flight); past it ``enqueue`` raises :class:`~demote.errors.HookBusy` and
            queues nothing, so a stalled sink cannot grow the process without bound.

    Raises:
        ConfigError: ``sink``, ``flush_timeout``, ``outbox`` or ``max_queued`` is invalid.
    """

    def __init__(
        self,
        sink: object,
        flush_timeout: float = 10,
        outbox: SQLiteOutbox | None = None,
        *,
        max_queued: int = MAX_QUEUED,
    ) -> None:
        super().__init__(sink, flush_timeout, outbox, max_queued)
        self._queue: queue.SimpleQueue[None] = queue.SimpleQueue()  # wake-ups
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def start(self) -> None:
        """Start the worker thread (idempotent; a no-op after close).

        Raises:
            StoreError: The outbox's leftovers cannot be read.
        """
        with self._lock:
            if self._started or self._closed:
                return
            self._admit_leftovers()
            self._started = True
            self._thread = threading.Thread(target=self._run, name="demote-recorder", daemon=True)
            self._thread.start()
        atexit.register(self.close)

    def deliver(self, batch: Demotion) -> None:
        """Demotion hook protocol: queue ``batch`` and return at once (see :meth:`enqueue`)."""
        self.enqueue(batch)

    def close(self) -> None:
        """Drain what was queued, waiting at most ``flush_timeout``; idempotent."""
        if not self._begin_close():
            return
        atexit.unregister(self.close)
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return  # closed from inside the sink: the worker drains after this item
        thread.join(self.flush_timeout)
        self._finish_close(timed_out=thread.is_alive())

    def _wake(self) -> None:
        self._queue.put(None)

    def _ensure_started(self) -> None:
        if not self._started:
            self.start()

    def _run(self) -> None:
        with asyncio.Runner() as runner:  # only used by an async-only sink
            while (step := self._step()) is not None:
                if isinstance(step, Wait):
                    with contextlib.suppress(queue.Empty):
                        self._queue.get(timeout=step.timeout)
                    continue
                error: BaseException | None = None
                token = CURRENT_KEY.set(step.envelope.key)
                try:
                    call = self._sync_call if self._sync_call is not None else self._async_call
                    assert call is not None
                    result = call(step.envelope.item)
                    if inspect.isawaitable(result):  # an async sink, or a sync shell of one
                        runner.run(_awaited(result))
                except BaseException as exc:  # nothing a sink raises kills the worker
                    error = exc
                finally:
                    CURRENT_KEY.reset(token)
                self._settle(step.envelope, error)


class AsyncRecorder(RecorderBase):
    """The asyncio twin of :class:`Recorder`: the worker is a task on the running loop.

    Use it as ``async with AsyncRecorder(sink) as r:``. Call ``enqueue``/``capture``/
    ``adeliver`` from the loop's thread. An async sink (``adeliver`` or an async callable)
    is awaited; a sync-only one runs in a thread (``asyncio.to_thread``). On a timed-out
    close the task is cancelled.

    Args:
        sink: A callable taking one item (sync or async), or an object with
            ``async adeliver(item)`` (preferred) or ``deliver(item)``.
        flush_timeout: Seconds ``aclose`` waits for queued items to drain.
        outbox: Makes queued items durable, retried and dead-lettered.
        max_queued: At most this many items wait for the sink (see :class:`Recorder`).

    Raises:
        ConfigError: ``sink``, ``flush_timeout``, ``outbox`` or ``max_queued`` is invalid.
    """

    def __init__(
        self,
        sink: object,
        flush_timeout: float = 10,
        outbox: SQLiteOutbox | None = None,
        *,
        max_queued: int = MAX_QUEUED,
    ) -> None:
        super().__init__(sink, flush_timeout, outbox, max_queued)
        self._queue: asyncio.Queue[None] = asyncio.Queue()  # wake-ups
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncRecorder:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def start(self) -> None:
        """Start the worker task on the running loop (idempotent; a no-op after close).

        Raises:
            RuntimeError: No event loop is running in this thread.
            StoreError: The outbox's leftovers cannot be read.
        """
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._started or self._closed:
                return
            self._admit_leftovers()
            self._started = True
            self._task = loop.create_task(self._run(), name="demote-recorder")

    async def adeliver(self, batch: Demotion) -> None:
        """Demotion hook protocol: queue ``batch`` and return at once (see :meth:`enqueue`)."""
        self.enqueue(batch)

    async def aclose(self) -> None:
        """Drain what was queued, waiting at most ``flush_timeout``; idempotent."""
        task = self._task
        if not self._begin_close() or task is None or task is asyncio.current_task():
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), self.flush_timeout)
        except TimeoutError:
            self._finish_close(timed_out=True)
            task.cancel()  # the item in flight stays in the outbox, if any
            await asyncio.gather(task, return_exceptions=True)
        else:
            self._finish_close(timed_out=False)

    def _wake(self) -> None:
        self._queue.put_nowait(None)

    def _ensure_started(self) -> None:
        if not self._started:
            self.start()

    async def _run(self) -> None:
        while (step := self._step()) is not None:
            if isinstance(step, Wait):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._queue.get(), step.timeout)
                continue
            error: BaseException | None = None
            token = CURRENT_KEY.set(step.envelope.key)
            try:
                result: object
                if self._async_call is not None:
                    result = self._async_call(step.envelope.item)
                else:
                    assert self._sync_call is not None
                    result = await asyncio.to_thread(self._sync_call, step.envelope.item)
                if inspect.isawaitable(result):
                    await result
            except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
                raise  # the loop's own business (a timed-out close cancels this task)
            except BaseException as exc:  # nothing else a sink raises kills the worker
                error = exc
            finally:
                CURRENT_KEY.reset(token)
            self._settle(step.envelope, error)
