"""State stores: where each conversation's window start and watermark live.

``InMemoryStateStore`` (default) and ``SQLiteStateStore`` (embedded, durable) need nothing
extra; ``RedisStateStore`` (``demote[redis]``) and ``PostgresStateStore``
(``demote[postgres]``) share state, and a delivery lease, across processes and hosts.
"""

from demote.state.base import (
    AsyncStateStore,
    Lease,
    LeasingStateStore,
    StateStore,
    validate_conversation_id,
)
from demote.state.memory import InMemoryStateStore
from demote.state.postgres import PostgresStateStore
from demote.state.redis import RedisStateStore
from demote.state.sqlite import SQLiteStateStore

__all__ = [
    "AsyncStateStore",
    "InMemoryStateStore",
    "Lease",
    "LeasingStateStore",
    "PostgresStateStore",
    "RedisStateStore",
    "SQLiteStateStore",
    "StateStore",
    "validate_conversation_id",
]
