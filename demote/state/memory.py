"""An in-process state store: the default, lost when the process exits.

It keeps the whole store protocol, leases included, so two Demoters sharing one instance
behave like two workers sharing Redis (the tests use it that way). Nothing here does I/O,
so the async twins simply call the sync methods.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import ClassVar

from demote.records import ConversationState
from demote.state._codec import check_ttl
from demote.state.base import (
    Lease,
    check_holder,
    check_lease,
    check_states,
    tombstone,
    validate_conversation_id,
)

__all__ = ["InMemoryStateStore"]


class InMemoryStateStore:
    """Conversation states and leases in dicts guarded by a lock.

    Args:
        clock: Seconds, monotonic; leases expire by it (tests pass a fake one).
    """

    #: Its methods never block: the engine's async path calls them directly.
    nonblocking: ClassVar[bool] = True

    @property
    def shared(self) -> bool:
        """Do several Demoters use this store? Only then do they need its leases.

        One Demoter's in-process gate already keeps its conversations to one deliverer;
        leases (and their bookkeeping on every demoting load) matter once a second
        Demoter shares the store, as two workers share Redis.
        """
        return self._attached > 1

    def attach(self) -> None:
        """Count one more Demoter on this store (the engine calls it)."""
        with self._lock:
            self._attached += 1

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._states: dict[str, ConversationState] = {}
        self._leases: dict[str, tuple[str, int, float]] = {}  # holder, token, expires
        self._tokens = itertools.count(1)
        self._clock = clock
        self._attached = 0
        self._lock = threading.Lock()

    def get(self, conversation_id: str) -> ConversationState | None:
        """The stored state, or ``None``."""
        return self._states.get(validate_conversation_id(conversation_id))

    def _holds(self, lease: Lease, conversation_id: str | None = None) -> bool:
        if conversation_id is not None and lease.conversation_id != conversation_id:
            return False  # a lease fences its own conversation only
        held = self._leases.get(lease.conversation_id)
        return (
            held is not None and held[:2] == (lease.holder, lease.token) and held[2] > self._clock()
        )

    def compare_and_set(
        self,
        conversation_id: str,
        expected: ConversationState | None,
        new: ConversationState,
        *,
        lease: Lease | None = None,
        release: bool = False,
    ) -> bool:
        """Store ``new`` if the current state equals ``expected`` (and ``lease`` holds)."""
        conversation_id = validate_conversation_id(conversation_id)
        check_states(expected, new)
        check_lease(lease, optional=True)
        with self._lock:
            ok = self._states.get(conversation_id) == expected and (
                lease is None or self._holds(lease, conversation_id)
            )
            if ok:
                self._states[conversation_id] = new
            if release and lease is not None:
                self._drop_lease(lease)
            return ok

    def clear(self, conversation_id: str) -> ConversationState:
        """Leave a tombstone one generation on, and revoke the lease."""
        conversation_id = validate_conversation_id(conversation_id)
        with self._lock:
            tomb = tombstone(self._states.get(conversation_id))
            self._states[conversation_id] = tomb
            self._leases.pop(conversation_id, None)
            return tomb

    def delete(self, conversation_id: str) -> None:
        """Forget the conversation's state and lease."""
        conversation_id = validate_conversation_id(conversation_id)
        with self._lock:
            self._states.pop(conversation_id, None)
            self._leases.pop(conversation_id, None)

    def count(self) -> int:
        """How many conversations have state."""
        return len(self._states)

    def acquire_lease(self, conversation_id: str, holder: str, ttl: float) -> Lease | None:
        """Take the lease for ``ttl`` seconds if it is free or expired."""
        conversation_id = validate_conversation_id(conversation_id)
        holder, ttl = check_holder(holder), check_ttl(ttl)
        with self._lock:
            now = self._clock()
            held = self._leases.get(conversation_id)
            if held is not None and held[2] > now:
                return None
            token = next(self._tokens)
            self._leases[conversation_id] = (holder, token, now + ttl)
            return Lease(conversation_id, holder, token, self._states.get(conversation_id))

    def renew_lease(self, lease: Lease, ttl: float) -> bool:
        """Extend ``lease`` if it is still held and unexpired."""
        check_lease(lease)
        ttl = check_ttl(ttl)
        with self._lock:
            if not self._holds(lease):
                return False
            self._leases[lease.conversation_id] = (lease.holder, lease.token, self._clock() + ttl)
            return True

    def release_lease(self, lease: Lease) -> None:
        """Give ``lease`` back if it is still held."""
        check_lease(lease)
        with self._lock:
            self._drop_lease(lease)

    def _drop_lease(self, lease: Lease) -> None:
        held = self._leases.get(lease.conversation_id)
        if held is not None and held[:2] == (lease.holder, lease.token):
            del self._leases[lease.conversation_id]

    def close(self) -> None:
        """Nothing to release."""
