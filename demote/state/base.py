"""The state store protocol.

A state store keeps one :class:`~demote.records.ConversationState` per conversation id.
Writes are compare-and-set, so two processes sharing a durable store never both commit
the same advance: the loser re-reads and sees the winner's watermark.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from demote.errors import ConversationIdError
from demote.records import ConversationState

__all__ = ["StateStore", "validate_conversation_id"]

#: Longest conversation id accepted (bytes of UTF-8).
MAX_ID_BYTES = 16_384


def validate_conversation_id(conversation_id: object) -> str:
    """Return ``conversation_id`` if usable, else raise :class:`ConversationIdError`.

    Any non-empty string up to 16 KiB is accepted: stores use it only as a parameter of
    parameterised queries, never in a path. NUL characters are rejected because several
    backends truncate at them, which would merge two conversations.
    """
    if not isinstance(conversation_id, str):
        raise ConversationIdError(
            f"conversation_id must be a str, got {type(conversation_id).__name__}"
        )
    if not conversation_id:
        raise ConversationIdError("conversation_id must not be empty")
    if "\x00" in conversation_id:
        raise ConversationIdError("conversation_id must not contain NUL characters")
    if len(conversation_id.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        raise ConversationIdError(f"conversation_id is longer than {MAX_ID_BYTES} bytes")
    return conversation_id


@runtime_checkable
class StateStore(Protocol):
    """Keeps the demotion state of every conversation."""

    def get(self, conversation_id: str) -> ConversationState | None:
        """The stored state, or ``None`` for a conversation never seen (or forgotten)."""

    def compare_and_set(
        self,
        conversation_id: str,
        expected: ConversationState | None,
        new: ConversationState,
    ) -> bool:
        """Store ``new`` only if the current state equals ``expected``; report success."""

    def delete(self, conversation_id: str) -> None:
        """Forget the conversation's state."""

    def count(self) -> int:
        """How many conversations have state."""

    def close(self) -> None:
        """Release resources (idempotent)."""
