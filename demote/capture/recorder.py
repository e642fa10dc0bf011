"""Recorder and AsyncRecorder: hand work to a slow sink without waiting for it.

The Python counterpart of pikuri's ``Pikuri::Memory::Recorder``, made safe against the
failure it accepts (a crash loses queued work: here an optional outbox makes the queue
durable) and the race others hit (hermes-agent #92458: an exit-time flush racing the
worker stored every turn twice: here only the worker ever delivers).

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
import contextvars
import inspect
import logging
import queue
import threading
import time
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any

from demote.capture.codec import decode, dedup_key, encode, is_blank
from demote.capture.dispatch import (
    STOP,
    Decision,
    Deliver,
    Dispatcher,
    Envelope,
    RecorderStats,
    Verdict,
    Wait,
    _Stop,
)
from demote.capture.outbox import OutboxRow, SQLiteOutbox
from demote.errors import ConfigError, StoreError
from demote.records import CapturedTurn, Demotion

__all__ = ["AsyncRecorder", "Recorder", "current_key"]

logger = logging.getLogger("demote.capture")

_CURRENT_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "demote_capture_key", default=None
)

SyncCall = Callable[[Any], object]
AsyncCall = Callable[[Any], Coroutine[Any, Any, object]]


def current_key() -> str | None:
    """The dedup key of the item the sink is being called with (``None`` outside a sink).

    Delivery through an outbox is at-least-once; a sink that must see each item once keeps
    the keys it has stored and skips a repeat.
    """
    return _CURRENT_KEY.get()


def _resolve(sink: object) -> tuple[SyncCall | None, AsyncCall | None]:
    sync_call: SyncCall | None = getattr(sink, "deliver", None)
    async_call: AsyncCall | None = getattr(sink, "adeliver", None)
    if sync_call is None and async_call is None:
        if not callable(sink):
            raise ConfigError(
                f"sink must be callable or have deliver()/adeliver(), got {type(sink).__name__}"
            )
        if inspect.iscoroutinefunction(sink) or inspect.iscoroutinefunction(type(sink).__call__):
            async_call = sink
        else:
            sync_call = sink
    return sync_call, async_call


class _RecorderBase:
    """What both Recorders share: admission, bookkeeping, outbox actions, reporting."""

    def __init__(
        self, sink: object, flush_timeout: float = 10, outbox: SQLiteOutbox | None = None
    ) -> None:
        if isinstance(flush_timeout, bool) or not isinstance(flush_timeout, int | float):
            raise ConfigError(f"flush_timeout must be a number, got {flush_timeout!r}")
        if not flush_timeout >= 0:
            raise ConfigError(f"flush_timeout must be >= 0, got {flush_timeout}")
        self._sync_call, self._async_call = _resolve(sink)
        self.flush_timeout = float(flush_timeout)
        self.outbox = outbox
        self._dispatcher = Dispatcher(outbox.retry if outbox is not None else None)
        self._lock = threading.Lock()
        self._started = False
        self._closed = False

    @property
    def stats(self) -> RecorderStats:
        """A snapshot of the counters (see :class:`~demote.capture.RecorderStats`)."""
        with self._lock:
            return self._dispatcher.stats

    def enqueue(self, item: Any, *, key: str | None = None) -> None:
        """Queue ``item`` for the sink and return at once (starting the worker if needed).

        Args:
            item: A ``Demotion``, a ``CapturedTurn`` or a JSON-serialisable value. Blank
                items (``None``, a blank str, an empty batch, a turn with blank text) are
                ignored and counted as dropped, and so is anything enqueued after close.
            key: Dedup key for a plain value (records bring their own); a uuid if omitted.

        Raises:
            ConfigError: With an outbox, ``item`` cannot be serialised; or ``key`` is not
                a non-empty str.
            StoreError: With an outbox, the durable write failed (nothing was queued, so
                a demotion hook's caller keeps its watermark and retries).
        """
        if is_blank(item) or self._closed:
            with self._lock:
                self._dispatcher.dropped()
            return
        item_key = dedup_key(item, key)
        payload = encode(item) if self.outbox is not None else None
        self._ensure_started()
        with self._lock:
            if self._closed:
                self._dispatcher.dropped()
                return
            row = None
            if self.outbox is not None and payload is not None:
                row = self.outbox.put(item_key, payload)
            self._dispatcher.accepted()
            self._push(Envelope(item_key, item, row))

    def capture(self, turn: CapturedTurn) -> None:
        """Capture sink protocol: queue ``turn`` (see :meth:`enqueue`)."""
        self.enqueue(turn)

    def replay_dead_letters(self) -> int:
        """Put the outbox's dead letters back in line, delivered by this Recorder if running.

        Returns:
            How many items were put back.

        Raises:
            ConfigError: The Recorder has no outbox.
        """
        if self.outbox is None:
            raise ConfigError("replay_dead_letters needs an outbox")
        with self._lock:
            rows = self.outbox.revive()
            if self._started and not self._closed:
                for envelope in self._envelopes(rows):
                    self._dispatcher.accepted()
                    self._push(envelope)
        return len(rows)

    # -- for the drivers -------------------------------------------------------------

    def _push(self, message: Envelope | _Stop) -> None:
        raise NotImplementedError

    def _ensure_started(self) -> None:
        raise NotImplementedError

    def _admit_leftovers(self) -> None:
        """Hand a previous process's undelivered outbox rows to the dispatcher (locked)."""
        if self.outbox is None:
            return
        leftovers = self._envelopes(self.outbox.load())
        if leftovers:
            logger.info("delivering %d item(s) left in the outbox", len(leftovers))
        for envelope in leftovers:
            self._dispatcher.accepted()
            self._dispatcher.receive(envelope)

    def _envelopes(self, rows: list[OutboxRow]) -> list[Envelope]:
        assert self.outbox is not None
        envelopes = []
        for row in rows:
            try:
                envelopes.append(Envelope(row.key, decode(row.payload), row.id, row.attempts))
            except StoreError as exc:
                logger.error("outbox row %d (key %s) is unreadable: %s", row.id, row.key, exc)
                self.outbox.bury(row.id, row.attempts, str(exc))
        return envelopes

    def _step(self) -> Deliver | Wait | None:
        with self._lock:
            return self._dispatcher.next_step(time.monotonic())

    def _receive(self, message: Envelope | _Stop) -> None:
        with self._lock:
            self._dispatcher.receive(message)

    def _settle(self, envelope: Envelope, error: BaseException | None) -> None:
        with self._lock:
            decision = self._dispatcher.settle(envelope, error, time.monotonic())
        try:
            self._apply(decision)
        except StoreError as exc:  # the item stays in the outbox: redelivered next start
            logger.error("outbox update for key %s failed: %s", envelope.key, exc)

    def _apply(self, decision: Decision) -> None:
        envelope, row, outbox = decision.envelope, decision.envelope.row, self.outbox
        if decision.verdict is Verdict.ACK:
            if outbox is not None and row is not None:
                outbox.ack(row)
        elif decision.verdict is Verdict.DROP:
            logger.warning("sink failed on key %s; item dropped: %s", envelope.key, decision.error)
        elif decision.verdict is Verdict.RETRY:
            logger.warning(
                "sink failed on key %s (attempt %d); retrying in %.3g s: %s",
                envelope.key,
                envelope.attempts,
                decision.delay,
                decision.error,
            )
            if outbox is not None and row is not None:
                outbox.fail(row, envelope.attempts, decision.error)
        else:
            logger.warning(
                "sink failed on key %s %d times; moved to the dead letters: %s",
                envelope.key,
                envelope.attempts,
                decision.error,
            )
            if outbox is not None and row is not None:
                outbox.bury(row, envelope.attempts, decision.error)

    def _begin_close(self) -> bool:
        """Mark closed and push STOP; True if this call must wait for the worker."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            if self._started:
                self._push(STOP)
            return self._started

    def _finish_close(self, timed_out: bool) -> None:
        with self._lock:
            left = self._dispatcher.abandon()
        if not left:
            return
        why = "waiting for a retry"
        if timed_out:
            why = f"not delivered within flush_timeout={self.flush_timeout:g} s"
        if self.outbox is not None:
            logger.warning(
                "recorder closed with %d item(s) %s; left in the outbox %s for the next start",
                left,
                why,
                self.outbox.path,
            )
        else:
            logger.warning("recorder closed with %d item(s) %s; abandoned", left, why)


class Recorder(_RecorderBase):
    """Delivers items to a sink from one background thread, off the caller's path.

    Args:
        sink: A callable taking one item, or an object with ``deliver(item)`` (preferred)
            or ``async adeliver(item)`` (run on the worker thread's own event loop).
        flush_timeout: Seconds ``close`` waits for queued items to drain.
        outbox: Makes queued items durable, retried and dead-lettered (see
            :class:`~demote.capture.SQLiteOutbox`).

    Raises:
        ConfigError: ``sink`` is not usable or ``flush_timeout`` is negative.
    """

    def __init__(
        self, sink: object, flush_timeout: float = 10, outbox: SQLiteOutbox | None = None
    ) -> None:
        super().__init__(sink, flush_timeout, outbox)
        self._queue: queue.SimpleQueue[Envelope | _Stop] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Recorder:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

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

    def _push(self, message: Envelope | _Stop) -> None:
        self._queue.put(message)

    def _ensure_started(self) -> None:
        if not self._started:
            self.start()

    def _run(self) -> None:
        with asyncio.Runner() as runner:  # only used by an async-only sink
            while (step := self._step()) is not None:
                if isinstance(step, Wait):
                    with contextlib.suppress(queue.Empty):
                        self._receive(self._queue.get(timeout=step.timeout))
                    continue
                error: Exception | None = None
                token = _CURRENT_KEY.set(step.envelope.key)
                try:
                    if self._sync_call is not None:
                        self._sync_call(step.envelope.item)
                    elif self._async_call is not None:
                        runner.run(self._async_call(step.envelope.item))
                except Exception as exc:  # a sink failure never kills the worker
                    error = exc
                finally:
                    _CURRENT_KEY.reset(token)
                self._settle(step.envelope, error)


class AsyncRecorder(_RecorderBase):
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

    Raises:
        ConfigError: ``sink`` is not usable or ``flush_timeout`` is negative.
    """

    def __init__(
        self, sink: object, flush_timeout: float = 10, outbox: SQLiteOutbox | None = None
    ) -> None:
        super().__init__(sink, flush_timeout, outbox)
        self._queue: asyncio.Queue[Envelope | _Stop] = asyncio.Queue()
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

    def _push(self, message: Envelope | _Stop) -> None:
        self._queue.put_nowait(message)

    def _ensure_started(self) -> None:
        if not self._started:
            self.start()

    async def _run(self) -> None:
        while (step := self._step()) is not None:
            if isinstance(step, Wait):
                with contextlib.suppress(TimeoutError):
                    self._receive(await asyncio.wait_for(self._queue.get(), step.timeout))
                continue
            error: Exception | None = None
            token = _CURRENT_KEY.set(step.envelope.key)
            try:
                if self._async_call is not None:
                    await self._async_call(step.envelope.item)
                elif self._sync_call is not None:
                    await asyncio.to_thread(self._sync_call, step.envelope.item)
            except Exception as exc:  # a sink failure never kills the worker
                error = exc
            finally:
                _CURRENT_KEY.reset(token)
            self._settle(step.envelope, error)
