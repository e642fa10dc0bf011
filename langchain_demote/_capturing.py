"""Capture on a write: each user message the demoting history stores goes to ``capture=``.

A write to :class:`~langchain_demote.DemotingChatMessageHistory` (``add_messages``,
``aadd_messages``, ``add_message``) appends to the inner store, then captures the user
messages (``HumanMessage``) it stored. When the write has one (:func:`wants_capture`), the
history learns first where the messages go, so each is sent, once it is stored, as a
:class:`~demote.records.CapturedTurn` whose key is the dedup key of its position in the
inner store (:func:`capture_users`): a capture that is told a turn twice can tell. A
capture that fails does not fail the write: the message is stored, and a ``degraded``
event says so (the history dispatches it in the run that wrote; the demoter's observers
see it too).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from langchain_core.messages import BaseMessage, HumanMessage

from demote.engine import Demoter
from demote.events import DemoteEvent
from demote.hooks.base import Capture
from demote.records import CapturedTurn, MessageRecord, make_key
from langchain_demote.messages import message_text

__all__ = ["capture_users", "wants_capture"]


def wants_capture(capture: Capture | None, messages: Sequence[BaseMessage]) -> bool:
    """Whether storing ``messages`` captures one (so the write must know where they go)."""
    return capture is not None and any(isinstance(m, HumanMessage) for m in messages)


def capture_users(
    capture: Capture,
    demoter: Demoter,
    conversation_id: str,
    base: int,
    messages: Sequence[BaseMessage],
    describe: Callable[[BaseMessage], MessageRecord],
) -> list[DemoteEvent]:
    """Send each user message of ``messages`` (stored from ``base`` on) to ``capture``.

    Returns the ``degraded`` events of captures that failed (the messages are stored:
    the chat goes on without them, reported, never raised).
    """
    failed: list[DemoteEvent] = []
    cid = conversation_id
    for i, message in enumerate(messages, base):
        if isinstance(message, HumanMessage):
            record = describe(message)
            key = make_key(cid, i, record.fingerprint)
            try:
                capture.capture(CapturedTurn(cid, "user", message_text(message), i, key))
            except Exception as exc:
                failed.append(demoter.report_degraded(cid, "capture", exc))
    return failed
