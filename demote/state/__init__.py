"""State stores: where each conversation's window start and watermark live."""

from demote.state.base import StateStore, validate_conversation_id
from demote.state.memory import InMemoryStateStore
from demote.state.sqlite import SQLiteStateStore

__all__ = ["InMemoryStateStore", "SQLiteStateStore", "StateStore", "validate_conversation_id"]
