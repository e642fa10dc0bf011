"""What both Recorders share: admission, the sink's calling shape, outbox bookkeeping.

:class:`RecorderBase` turns ``enqueue`` into an :class:`~demote.capture.dispatch.Envelope`
(blank check, dedup key, durable write), acts on the dispatcher's decisions (ack, retry,
bury, drop, with their log lines) and reports what ``close`` left behind. The two drivers
in :mod:`demote.capture.recorder` only add how the worker waits and calls the sink.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import threading
import time
from collections.abc import Callable, Coroutine
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
from demote.records import CapturedTurn

__all__ = ["CURRENT_KEY", "AsyncCall", "RecorderBase", "SyncCall", "current_key", "logger"]

logger = logging.getLogger("demote.capture")

CURRENT_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "demote_capture_key", default=None
)

SyncCall = Callable[[Any], object]
AsyncCall = Callable[[Any], Coroutine[Any, Any, object]]


def current_key() -> str | None:
    """The dedup key of the item the sink is being called with (``None`` outside a sink).

    Delivery through an outbox is at-least-once; a sink that must see each item once keeps
    the keys it has stored and skips a repeat.
    """
    return CURRENT_KEY.get()


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


class RecorderBase:
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
