"""What both Recorders share: admission, the sink's calling shape, outbox bookkeeping.

:class:`RecorderBase` turns ``enqueue`` into an :class:`~demote.capture.dispatch.Envelope`
(blank check, dedup key, durable write), acts on the dispatcher's decisions (ack, retry,
bury, drop, with their log lines), erases a conversation's items, and reports what
``close`` left behind. The two drivers in :mod:`demote.capture.recorder` only add how the
worker waits and calls the sink.

Erase (:meth:`RecorderBase.erase`): under the Recorder's lock, so no enqueue interleaves,
the conversation's rows leave the outbox (queued and dead letters, with the erase's fence
recorded) and its items leave the dispatcher; the worker can no longer start one. An item
of the conversation already in the sink cannot be recalled: erase waits for it to end (up
to ``flush_timeout``; if it fails it is not retried), so that the sink's own erase, which
:meth:`demote.Demoter.erase` runs next (the sink is the Recorder's part), comes after it.
If it does not end in time erase raises :class:`~demote.errors.HookTimeout`: the item may
still land in the sink after the sink was erased, and the report says the tier failed.

:class:`Capture` is the protocol of what takes each new user turn off the request path:
a Recorder is one (:meth:`RecorderBase.capture`), and so is ``Mem0Capture``.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol, runtime_checkable

from demote._validate import count, seconds
from demote.capture.codec import conversation_of, decode, dedup_key, encode, is_blank
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
from demote.errors import ArgumentTypeError, ConfigError, HookBusy, HookTimeout, StoreError
from demote.flow import Call, Flow, Sleep, drive_async, drive_sync
from demote.records import CapturedTurn, Demotion, storable_text
from demote.state.base import validate_conversation_id

__all__ = [
    "CURRENT_KEY",
    "MAX_QUEUED",
    "AsyncCall",
    "Capture",
    "RecorderBase",
    "SyncCall",
    "current_key",
    "logger",
]

logger = logging.getLogger("demote.capture")

#: Default bound on the items a Recorder holds for its sink (queued, retried, in flight).
MAX_QUEUED = 100_000

_POLL_SECONDS = 0.01  # how often erase looks whether the sink has finished an item

CURRENT_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "demote_capture_key", default=None
)

SyncCall = Callable[[Any], object]
AsyncCall = Callable[[Any], Coroutine[Any, Any, object]]


@runtime_checkable
class Capture(Protocol):
    """Takes each new user turn off the request path (``Mem0Capture``): never blocks."""

    def capture(self, turn: CapturedTurn) -> None:
        """Queue ``turn`` for extraction; must return at once."""


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
        self,
        sink: object,
        flush_timeout: float = 10,
        outbox: SQLiteOutbox | None = None,
        max_queued: int = MAX_QUEUED,
    ) -> None:
        self.flush_timeout = seconds("flush_timeout", flush_timeout, zero=True)
        self.max_queued = count("max_queued", max_queued)
        if outbox is not None and not isinstance(outbox, SQLiteOutbox):
            raise ArgumentTypeError(f"outbox: must be an SQLiteOutbox or None, got {outbox!r:.40}")
        self._sync_call, self._async_call = _resolve(sink)
        self._sink = sink
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
            ConfigError: With an outbox, ``item`` cannot be serialised; ``key`` is not
                a non-empty str; a record's conversation id is unusable.
            StoreError: With an outbox, the durable write failed (nothing was queued, so
                a demotion hook's caller keeps its watermark and retries).
            HookBusy: ``max_queued`` items already wait for the sink (a stalled or slow
                sink): nothing was queued.
            FencedOut: With an outbox, ``item`` is a batch whose fencing token predates
                its conversation's erase (a late write from a worker that lost its lease);
                nothing was queued.
        """
        if is_blank(item) or self._closed:
            with self._lock:
                self._dispatcher.dropped()
            return
        item_key = dedup_key(item, key)
        conversation = conversation_of(item)
        if conversation is not None:  # a record's id, as every store refuses a bad one
            validate_conversation_id(conversation, "conversation")
        payload = encode(item) if self.outbox is not None else None
        fence = item.fence if isinstance(item, Demotion) else None
        self._ensure_started()
        with self._lock:
            if self._closed:
                self._dispatcher.dropped()
                return
            if self._dispatcher.unfinished >= self.max_queued:
                raise HookBusy(
                    f"recorder queue is full: max_queued={self.max_queued} items wait for the "
                    "sink; nothing was queued (a demotion keeps its watermark and retries)"
                )
            row = None
            if self.outbox is not None and payload is not None:
                row = self.outbox.put(item_key, payload, conversation=conversation, fence=fence)
            self._dispatcher.accepted()
            self._push(Envelope(item_key, item, row, conversation=conversation))

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

    def parts(self) -> tuple[object, ...]:
        """The sink: a tier of its own, erased after this Recorder (see :mod:`demote.erase`)."""
        return (self._sink,)

    def erase(
        self, conversation_id: str, *, fence: int | None = None, keys: Sequence[str] | None = None
    ) -> int:
        """Forget the conversation's items not yet delivered: queued, retried, dead letters.

        They leave the outbox (bytes included, see :meth:`SQLiteOutbox.erase`) and the
        queue, so none reaches the sink afterwards. An item of the conversation being
        delivered at this moment is waited for (up to ``flush_timeout``) and not retried;
        the sink itself is erased as the next tier (:meth:`parts`). Plain JSON values
        belong to no conversation and stay. On an :class:`~demote.capture.AsyncRecorder`,
        await :meth:`aerase` from its loop (this blocking wait would hold the loop).

        Args:
            conversation_id: The conversation.
            fence: The erase's fencing token; the outbox then refuses the conversation's
                batches delivered under an older one (:class:`~demote.errors.FencedOut`).
            keys: Unused (items are found by conversation); part of the tier protocol.

        Returns:
            Items removed: outbox rows with an outbox (dead letters included), else items
            taken out of the queue.

        Raises:
            HookTimeout: An item of the conversation was still in the sink after
                ``flush_timeout``: it may land there after the sink's erase.
            StoreError: The outbox failed; nothing was erased.
        """
        return drive_sync(self._erase(conversation_id, fence))

    async def aerase(
        self, conversation_id: str, *, fence: int | None = None, keys: Sequence[str] | None = None
    ) -> int:
        """:meth:`erase` without blocking the event loop (the outbox runs in a thread)."""
        return await drive_async(self._erase(conversation_id, fence))

    def _erase(self, conversation_id: str, fence: int | None) -> Flow[int]:
        cid = validate_conversation_id(conversation_id)
        removed: int = yield Call(self, "_erase_waiting", (cid, fence), {})
        deadline = time.monotonic() + self.flush_timeout
        while self._delivering(cid):
            if time.monotonic() >= deadline:
                raise HookTimeout(
                    f"erase {cid!r}: an item of the conversation was still being delivered "
                    f"after flush_timeout={self.flush_timeout:g} s; it may reach the sink "
                    "after the sink's erase: erase again once it has ended"
                )
            yield Sleep(_POLL_SECONDS)
        return removed

    def _erase_waiting(self, cid: str, fence: int | None) -> int:
        with self._lock:  # no enqueue in between: its fence check sees this erase
            rows = None if self.outbox is None else self.outbox.erase(cid, fence=fence)
            dropped = self._dispatcher.erase(cid)
        return dropped if rows is None else rows

    def _delivering(self, cid: str) -> bool:
        with self._lock:
            return self._dispatcher.delivering(cid)

    # -- for the drivers -------------------------------------------------------------

    def _push(self, message: Envelope | _Stop) -> None:
        """Hand ``message`` to the dispatcher and wake the worker (locked)."""
        self._dispatcher.receive(message)
        self._wake()

    def _wake(self) -> None:
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
                # A row is read back with whatever types the file holds: only a whole one
                # reaches the dispatcher, whose arithmetic would crash the worker on others.
                if not isinstance(row.key, str) or type(row.attempts) is not int:
                    raise StoreError(
                        f"corrupt row: key {row.key!r:.40}, attempts {row.attempts!r:.40}"
                    )
                if not isinstance(row.payload, str):
                    raise StoreError(f"corrupt row: payload is {type(row.payload).__name__}")
                item = decode(row.payload)
                envelopes.append(
                    Envelope(row.key, item, row.id, row.attempts, conversation_of(item))
                )
            except StoreError as exc:
                logger.error("outbox row %s is unreadable: %s", row.id, exc)
                attempts = row.attempts if type(row.attempts) is int else 0
                self.outbox.bury(row.id, attempts, storable_text(str(exc)))
        return envelopes

    def _step(self) -> Deliver | Wait | None:
        with self._lock:
            return self._dispatcher.next_step(time.monotonic())

    def _settle(self, envelope: Envelope, error: BaseException | None) -> None:
        with self._lock:
            decision = self._dispatcher.settle(envelope, error, time.monotonic())
        try:
            self._apply(decision)
        except StoreError as exc:  # the item stays in the outbox: redelivered next start
            logger.error("outbox update for key %s failed: %s", envelope.key, exc)

    def _apply(self, decision: Decision) -> None:
        envelope, row, outbox = decision.envelope, decision.envelope.row, self.outbox
        if decision.verdict in (Verdict.ACK, Verdict.ERASED):
            if decision.verdict is Verdict.ERASED:
                logger.info("sink failed on key %s, whose conversation was erased", envelope.key)
            if outbox is not None and row is not None:
                outbox.ack(row)  # (erased: the row is gone already)
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
