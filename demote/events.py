"""What the engine did, as small records: events, observers, and stats.

Every load that moves the window, delivers a batch, fails to deliver, re-syncs a rewritten
history, clears tool results, commits a compaction, or goes on without its state store
(``degraded``) produces one :class:`DemoteEvent` per thing it did; a load whose window cannot
obey the limit (``overhang``) says so each time. A
load returns its own events with its window (:attr:`demote.Window.events`), so an adapter
can report them inside the run that caused them (LangChain callbacks, LlamaIndex
instrumentation); background work (a summary being written) reports only to observers.

Observers subscribe with :meth:`demote.Demoter.observe`. They are called from one daemon
thread of the Demoter's, in order, never on the request path: the engine never waits on
them, and an observer that raises is logged, never raised. A load that does nothing
produces no event and costs nothing here.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from demote.records import Recalled

__all__ = [
    "ConversationStats",
    "DegradedSource",
    "DemoteEvent",
    "DemoterStats",
    "EventKind",
    "Observers",
]

logger = logging.getLogger("demote")

EventKind = Literal[
    "demoted",
    "delivered",
    "delivery_failed",
    "resynced",
    "compaction_started",
    "compaction_committed",
    "compaction_failed",
    "recalled",
    "degraded",
    "cleared",
    "overhang",
]

#: What a ``degraded`` event names as the part of the memory layer that failed.
DegradedSource = Literal["state", "recall", "capture"]


@dataclass(frozen=True, slots=True)
class DemoteEvent:
    """One thing the engine did to one conversation.

    Attributes:
        kind: ``demoted`` (messages left the window), ``delivered`` (the hook accepted a
            batch), ``delivery_failed`` (it did not: the messages stay pending),
            ``resynced`` (a rewritten history was planned afresh),
            ``compaction_started`` / ``compaction_committed`` / ``compaction_failed``
            (a running summary), ``recalled`` (an adapter read the long tail back),
            ``degraded`` (a state store, recall or capture failed or was skipped: the
            chat went on without it; see ``source``),
            ``cleared`` (tool results in the window are sent from now on as a
            placeholder, or clipped to their head and a placeholder; their content goes
            to the hook first, or stays pending if it refuses), ``overhang`` (what
            cannot be cut, pinned messages, the opener and the newest step, alone
            exceeds the limit; reported on every such load).
        conversation_id: The conversation.
        start: First message index concerned (absolute).
        end: One past the last index concerned.
        count: How many messages (a batch skips what the hook already holds).
        keys: Dedup keys of the messages (``delivered``, ``delivery_failed``, ``recalled``,
            ``cleared``: the keys the placeholders name).
        tokens_before: Tokens in the window before a cut (``demoted``); the cleared
            results' content (``cleared``); the window's size (``overhang``).
        tokens_after: Tokens in the window after it (``demoted``); what the model is
            sent instead (``cleared``); how far the window exceeds the limit
            (``overhang``).
        duration: Seconds the hook, summarizer or recall took.
        error: The failure, as ``repr(exception)``.
        retry_in: Seconds until the next delivery attempt (``delivery_failed``), or
            until the failed store is probed again (``degraded``).
        fence: The lease's fencing token the batch carried.
        at: Wall-clock time (``time.time()``) the event was made.
        source: What failed, for ``degraded``: ``"state"`` (the state store: the window
            was planned without it, nothing was delivered or committed), ``"recall"``
            (the window went without recall) or ``"capture"`` (a user turn was not
            captured).
    """

    kind: EventKind
    conversation_id: str
    start: int = 0
    end: int = 0
    count: int = 0
    keys: tuple[str, ...] = ()
    tokens_before: int | None = None
    tokens_after: int | None = None
    duration: float | None = None
    error: str | None = None
    retry_in: float | None = None
    fence: int | None = None
    at: float = field(default_factory=time.time, compare=False)
    source: DegradedSource | None = None

    def to_dict(self) -> dict[str, object]:
        """The event as plain JSON-ready data (for callbacks, logs, traces)."""
        return {
            "kind": self.kind,
            "conversation_id": self.conversation_id,
            "start": self.start,
            "end": self.end,
            "count": self.count,
            "keys": list(self.keys),
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "duration": self.duration,
            "error": self.error,
            "retry_in": self.retry_in,
            "fence": self.fence,
            "at": self.at,
            "source": self.source,
        }

    @classmethod
    def recalled(
        cls, conversation_id: str, hits: Sequence[Recalled], duration: float
    ) -> DemoteEvent:
        """The ``recalled`` event of an adapter that placed ``hits`` in a prompt.

        Only the count and the dedup keys of what was recalled, never the query or the
        recalled text (an event may leave the process, in a trace or a metric).

        Args:
            conversation_id: The conversation searched.
            hits: The recalled messages the model is sent.
            duration: Seconds the search took.
        """
        return cls(
            "recalled",
            conversation_id,
            count=len(hits),
            keys=tuple(h.key for h in hits),
            duration=duration,
        )

    @classmethod
    def degraded(
        cls,
        conversation_id: str,
        source: DegradedSource,
        error: BaseException,
        *,
        start: int = 0,
        end: int = 0,
        retry_in: float | None = None,
    ) -> DemoteEvent:
        """The ``degraded`` event of a load, recall or capture that went on without ``source``.

        Args:
            conversation_id: The conversation.
            source: What failed: ``"state"``, ``"recall"`` or ``"capture"``.
            error: The failure (recorded as its ``repr``).
            start: The window's start (absolute), for ``"state"``.
            end: The history's length, for ``"state"``.
            retry_in: Seconds until the failed store is probed again, if known.
        """
        return cls(
            "degraded",
            conversation_id,
            start,
            end,
            error=repr(error),
            retry_in=retry_in,
            source=source,
        )


@dataclass(frozen=True, slots=True)
class DemoterStats:
    """What one Demoter did since it was made (this process only).

    Attributes:
        conversations: Conversations with demotion state in the store.
        loads: Loads served.
        delivered: Messages the hook accepted.
        pending: Messages waiting for delivery, over the conversations this process saw
            last with something pending.
        failures: Deliveries that failed.
        last_error: The last delivery failure, or ``None``.
        last_error_at: When it happened (``time.time()``).
        summaries: Compactions committed.
        resyncs: Rewritten histories re-synced.
        degraded: Loads served without the state store (it failed or was skipped).
        pending_conversations: Conversations over which ``pending`` is counted.
        retrying: Conversations with pending messages that background loads retry
            (without waiting for their next load; ``drain`` delivers them at once).
        retries: Background loads run for them (not counted in ``loads``).
        untracked: Conversations the background retries let go to their next load
            (over ``cached_conversations``, or busy elsewhere with no progress).
        queued: Sync hook calls waiting for a free hook thread (``hook_queue``).
    """

    conversations: int
    loads: int
    delivered: int
    pending: int
    failures: int
    last_error: str | None
    last_error_at: float | None
    summaries: int
    resyncs: int
    degraded: int = 0
    pending_conversations: int = 0
    retrying: int = 0
    retries: int = 0
    untracked: int = 0
    queued: int = 0


@dataclass(frozen=True, slots=True)
class ConversationStats:
    """One conversation's demotion state and health.

    Attributes:
        conversation_id: The conversation.
        window_start: Index of the first message kept in the window.
        delivered: The hook's watermark.
        pending: Messages that left the window but were not delivered yet.
        summarized: Messages covered by the running summary.
        failures: Delivery failures in a row (0 when the last attempt succeeded).
        retry_in: Seconds until the next delivery attempt may run (0: now).
        last_error: The conversation's last delivery failure seen by this process.
        last_error_at: When it happened.
    """

    conversation_id: str
    window_start: int
    delivered: int
    pending: int
    summarized: int
    failures: int
    retry_in: float
    last_error: str | None
    last_error_at: float | None


Observer = Callable[[DemoteEvent], object]


class Observers:
    """Subscribers to a Demoter's events, called in order from one daemon thread."""

    def __init__(self) -> None:
        self._subscribers: tuple[Observer, ...] = ()
        self._queue: queue.SimpleQueue[DemoteEvent | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()

    def __bool__(self) -> bool:
        return bool(self._subscribers)

    def add(self, fn: Observer) -> Callable[[], None]:
        """Subscribe ``fn``; returns a function that unsubscribes it."""
        if not callable(fn):
            from demote.errors import ConfigError

            raise ConfigError(f"observer: {fn!r} is not callable")
        with self._lock:
            self._subscribers = (*self._subscribers, fn)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="demote-events", daemon=True)
                self._thread.start()

        def remove() -> None:
            with self._lock:
                self._subscribers = tuple(s for s in self._subscribers if s is not fn)

        return remove

    def publish(self, events: tuple[DemoteEvent, ...] | list[DemoteEvent]) -> None:
        """Queue ``events`` for the subscribers (returns at once)."""
        if self._subscribers and events:
            self._idle.clear()
            for event in events:
                self._queue.put(event)
            self._queue.put(None)  # a marker: idle once the thread reaches it

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every queued event was handed to the subscribers (for tests)."""
        return self._idle.wait(timeout)

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                if self._queue.empty():
                    self._idle.set()
                continue
            for fn in self._subscribers:
                try:
                    fn(event)
                except Exception:
                    logger.exception("demote: an event observer failed (ignored)")
