"""An in-process state store: the default, lost when the process exits."""

from __future__ import annotations

import threading

from demote.records import ConversationState

__all__ = ["InMemoryStateStore"]


class InMemoryStateStore:
    """Conversation states in a dict guarded by a lock."""

    def __init__(self) -> None:
        self._states: dict[str, ConversationState] = {}
        self._lock = threading.Lock()

    def get(self, conversation_id: str) -> ConversationState | None:
        """The stored state, or ``None``."""
        return self._states.get(conversation_id)

    def compare_and_set(
        self,
        conversation_id: str,
        expected: ConversationState | None,
        new: ConversationState,
    ) -> bool:
        """Store ``new`` if the current state equals ``expected``."""
        with self._lock:
            if self._states.get(conversation_id) != expected:
                return False
            self._states[conversation_id] = new
            return True

    def delete(self, conversation_id: str) -> None:
        """Forget the conversation's state."""
        with self._lock:
            self._states.pop(conversation_id, None)

    def count(self) -> int:
        """How many conversations have state."""
        return len(self._states)

    def close(self) -> None:
        """Nothing to release."""
