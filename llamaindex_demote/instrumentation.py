"""Demotion events as LlamaIndex instrumentation events.

:class:`~llamaindex_demote.DemotingMemory` reports what each read did through
``llama_index.core.instrumentation``: every :class:`~demote.events.DemoteEvent` of the
load (and a ``recalled`` event when recall ran) becomes one instrumentation event, sent
through this module's dispatcher (``get_dispatcher("llamaindex_demote.instrumentation")``,
which propagates to the root). Any event handler registered with
``dispatcher.add_event_handler`` (Arize Phoenix, Langfuse, your own) sees them, with the
``span_id`` of the span that was active: the chat engine's or agent's, or, for a memory
with ``recall=``, the span around that ``get``/``aget``.

Each kind has its own class, all subclasses of :class:`DemotionEvent`:

=========================  ==============================================
``demoted``                :class:`DemoteDemotedEvent`
``delivered``              :class:`DemoteDeliveredEvent`
``delivery_failed``        :class:`DemoteDeliveryFailedEvent`
``resynced``               :class:`DemoteResyncedEvent`
``compaction_started``     :class:`DemoteCompactionStartedEvent`
``compaction_committed``   :class:`DemoteCompactionCommittedEvent`
``compaction_failed``      :class:`DemoteCompactionFailedEvent`
``recalled``               :class:`DemoteRecalledEvent`
``degraded``               :class:`DemoteDegradedEvent`
``cleared``                :class:`DemoteClearedEvent`
``overhang``               :class:`DemoteOverhangEvent`
=========================  ==============================================

:class:`~llamaindex_demote.DemotingLLM` reports the loads it makes at each LLM call of an
agent run the same way, inside the agent's span.

Compactions run in the background, outside any read: they reach the Demoter's observers
(:meth:`demote.Demoter.observe`); to see them here too, pass :func:`emit_events` wrapped as
an observer (``demoter.observe(lambda e: emit_events([e]))``). With no handler but
LlamaIndex's default ``NullEventHandler`` anywhere up the dispatcher chain, nothing is built
and a read pays one walk of that chain.
"""

from __future__ import annotations

from collections.abc import Sequence

from llama_index.core.bridge.pydantic import Field

# The documented path; llama_index.core re-exports it without marking it for type checkers.
from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]
from llama_index.core.instrumentation.event_handlers import NullEventHandler
from llama_index.core.instrumentation.events import BaseEvent

from demote.events import DemoteEvent

__all__ = [
    "DemoteClearedEvent",
    "DemoteCompactionCommittedEvent",
    "DemoteCompactionFailedEvent",
    "DemoteCompactionStartedEvent",
    "DemoteDegradedEvent",
    "DemoteDeliveredEvent",
    "DemoteDeliveryFailedEvent",
    "DemoteDemotedEvent",
    "DemoteOverhangEvent",
    "DemoteRecalledEvent",
    "DemoteResyncedEvent",
    "DemotionEvent",
    "dispatcher",
    "emit_events",
    "instrumentation_event",
]

#: The dispatcher demote's LlamaIndex events and spans go through.
dispatcher = get_dispatcher(__name__)


class DemotionEvent(BaseEvent):
    """One thing demote did to a conversation (the fields of :class:`~demote.DemoteEvent`).

    Attributes:
        kind: What happened (``demoted``, ``delivered``, ``recalled``, ...).
        conversation_id: The conversation (the memory's ``chat_store_key``).
        start: First message index concerned (absolute).
        end: One past the last index concerned.
        count: How many messages.
        keys: Dedup keys of the messages (delivered, failed, recalled).
        tokens_before: Tokens in the window before a cut (``demoted``).
        tokens_after: Tokens in the window after it.
        duration: Seconds the hook, summarizer or recall took.
        error: The failure, as ``repr(exception)``.
        retry_in: Seconds until the next delivery attempt (``delivery_failed``).
        fence: The lease's fencing token the batch carried.
        at: Wall-clock time (``time.time()``) demote made the event.
        source: What failed, for ``degraded``: ``"state"``, ``"recall"`` or ``"capture"``.
    """

    kind: str
    conversation_id: str
    start: int = 0
    end: int = 0
    count: int = 0
    keys: list[str] = Field(default_factory=list)
    tokens_before: int | None = None
    tokens_after: int | None = None
    duration: float | None = None
    error: str | None = None
    retry_in: float | None = None
    fence: int | None = None
    at: float = 0.0
    source: str | None = None

    @classmethod
    def class_name(cls) -> str:
        """The name LlamaIndex reports the event under."""
        return cls.__name__


class DemoteDemotedEvent(DemotionEvent):
    """Messages left the window (they go to the hook, or stay pending)."""


class DemoteDeliveredEvent(DemotionEvent):
    """The hook accepted a batch of demoted messages."""


class DemoteDeliveryFailedEvent(DemotionEvent):
    """The hook refused a batch: its messages stay pending and are retried."""


class DemoteResyncedEvent(DemotionEvent):
    """A history rewritten outside the memory was planned afresh."""


class DemoteCompactionStartedEvent(DemotionEvent):
    """A running summary of the oldest groups started (in the background)."""


class DemoteCompactionCommittedEvent(DemotionEvent):
    """A running summary was committed."""


class DemoteCompactionFailedEvent(DemotionEvent):
    """The summarizer failed (retried on a later load)."""


class DemoteRecalledEvent(DemotionEvent):
    """Recall placed archived messages in the prompt (count and keys, never the query)."""


class DemoteDegradedEvent(DemotionEvent):
    """The chat went on without a part of the memory layer that failed (see ``source``)."""


class DemoteClearedEvent(DemotionEvent):
    """Tool results are first sent as placeholders, or clipped (archived first)."""


class DemoteOverhangEvent(DemotionEvent):
    """What cannot be cut alone exceeds the limit, by ``tokens_after`` (every such load)."""


_CLASSES: dict[str, type[DemotionEvent]] = {
    "demoted": DemoteDemotedEvent,
    "delivered": DemoteDeliveredEvent,
    "delivery_failed": DemoteDeliveryFailedEvent,
    "resynced": DemoteResyncedEvent,
    "compaction_started": DemoteCompactionStartedEvent,
    "compaction_committed": DemoteCompactionCommittedEvent,
    "compaction_failed": DemoteCompactionFailedEvent,
    "recalled": DemoteRecalledEvent,
    "degraded": DemoteDegradedEvent,
    "cleared": DemoteClearedEvent,
    "overhang": DemoteOverhangEvent,
}


def instrumentation_event(event: DemoteEvent) -> DemotionEvent:
    """The LlamaIndex event for ``event`` (its class names the kind)."""
    cls = _CLASSES.get(event.kind, DemotionEvent)
    return cls(
        kind=event.kind,
        conversation_id=event.conversation_id,
        start=event.start,
        end=event.end,
        count=event.count,
        keys=list(event.keys),
        tokens_before=event.tokens_before,
        tokens_after=event.tokens_after,
        duration=event.duration,
        error=event.error,
        retry_in=event.retry_in,
        fence=event.fence,
        at=event.at,
        source=event.source,
    )


def _listening() -> bool:
    """Is any handler other than LlamaIndex's default no-op registered up the chain?"""
    d = dispatcher
    while True:
        for handler in d.event_handlers:
            # (The exact class first: an isinstance of a pydantic class is slow.)
            if type(handler) is not NullEventHandler and not isinstance(handler, NullEventHandler):
                return True
        if not d.propagate or not d.parent_name:
            return False
        d = d.parent


def emit_events(events: Sequence[DemoteEvent]) -> bool:
    """Send ``events`` to the registered event handlers, in order.

    Returns:
        ``True`` if a handler was registered (then each got every event).
    """
    if not events or not _listening():
        return False
    for event in events:
        dispatcher.event(instrumentation_event(event))
    return True
