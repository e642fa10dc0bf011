"""The state store protocol: watermarks, compare-and-set, and fenced delivery leases.

A state store keeps one :class:`~demote.records.ConversationState` per conversation id.

Writes are compare-and-set, so two processes sharing a durable store never both commit the
same advance: the loser re-reads and sees the winner's watermark.

Stores shared across processes (all the built-in ones) also grant *delivery leases*. A
lease names its holder and carries a *fencing token*: an integer strictly greater than every
token the store granted before, for any conversation, across clears and deletes. The
engine takes a conversation's lease before it delivers or commits, renews it while a hook
runs, and commits with ``compare_and_set(..., lease=lease)``, which succeeds only while the
lease is still held, unexpired, by that holder and token, checked in the same atomic step as
the comparison. A worker whose lease ran out, or was revoked, cannot commit. Hooks receive
the token with each batch (:attr:`~demote.records.Demotion.fence`) so a sink can refuse a
stale writer too.

``clear`` replaces the state with a *tombstone* (a fresh state whose ``generation`` is one
more than before) and revokes the lease in one atomic step, so a delivery begun before a
clear can commit nothing after it, in any process. ``delete`` removes the state and the
lease (``erase``); only the fencing counter survives it.

Every method has an async twin (``aget``, ``acompare_and_set``, ...) with the same meaning;
the engine's async path awaits them, so no store round trip blocks an event loop. A store
without async twins is called from a worker thread on the async path, unless it declares
``nonblocking = True`` (its methods do no I/O, as ``InMemoryStateStore``'s): then the async
path calls its sync methods directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from demote.errors import ArgumentTypeError, ConversationIdError
from demote.records import ConversationState

__all__ = [
    "AsyncStateStore",
    "Lease",
    "LeasingStateStore",
    "StateStore",
    "validate_conversation_id",
]

#: Longest conversation id accepted (bytes of UTF-8).
MAX_ID_BYTES = 16_384


def validate_conversation_id(conversation_id: object, name: str = "conversation_id") -> str:
    """Return ``conversation_id`` if usable, else raise :class:`ConversationIdError`.

    Any non-empty string of valid Unicode text up to 16 KiB is accepted: stores use it
    only as a parameter of parameterised queries, never in a path. NUL characters are
    rejected because several backends truncate at them, and lone surrogates because UTF-8
    cannot hold them: either would merge two conversations. ``name`` is what the message
    calls the argument (an adapter's ``thread_id``, ``chat_store_key``).
    """
    if not isinstance(conversation_id, str):
        raise ConversationIdError(f"{name} must be a str, got {type(conversation_id).__name__}")
    if not conversation_id:
        raise ConversationIdError(f"{name} must not be empty")
    if "\x00" in conversation_id:
        raise ConversationIdError(f"{name} must not contain NUL characters")
    try:
        size = len(conversation_id.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ConversationIdError(
            f"{name} is not valid Unicode text ({exc.reason} at {exc.start})"
        ) from None
    if size > MAX_ID_BYTES:
        raise ConversationIdError(f"{name} is longer than {MAX_ID_BYTES} bytes")
    return conversation_id


@dataclass(frozen=True, slots=True)
class Lease:
    """A delivery lease a store granted.

    Attributes:
        conversation_id: The conversation it covers.
        holder: Who holds it (the engine uses ``"<instance>:<n>"``).
        token: The fencing token: strictly greater than every token the store granted
            before, for any conversation.
        state: The conversation's committed state, read in the same atomic step as the
            grant (``None`` if it has none). Not compared.
    """

    conversation_id: str
    holder: str
    token: int
    state: ConversationState | None = field(default=None, compare=False)


@runtime_checkable
class StateStore(Protocol):
    """Keeps the demotion state of every conversation (the methods every store has)."""

    def get(self, conversation_id: str) -> ConversationState | None:
        """The stored state, or ``None`` for a conversation never seen (or deleted)."""

    def compare_and_set(
        self,
        conversation_id: str,
        expected: ConversationState | None,
        new: ConversationState,
        *,
        lease: Lease | None = None,
        release: bool = False,
    ) -> bool:
        """Store ``new`` only if the current state equals ``expected``; report success.

        With ``lease``, also only while that lease (holder and token) is still held and
        unexpired, checked in the same atomic step. With ``release=True`` the lease is
        released in that step too, whether or not the state was stored.
        """

    def clear(self, conversation_id: str) -> ConversationState:
        """Replace the state with a tombstone (``generation`` + 1), revoke the lease.

        Returns the tombstone. One atomic step: a commit expecting the old state, or
        fenced by the old lease, fails after it.
        """

    def delete(self, conversation_id: str) -> None:
        """Remove the conversation's state and lease (the fencing counter stays)."""

    def count(self) -> int:
        """How many conversations have state (a cleared one keeps its tombstone)."""

    def close(self) -> None:
        """Release resources (idempotent)."""


@runtime_checkable
class LeasingStateStore(StateStore, Protocol):
    """A store shared across processes: it also grants fenced delivery leases."""

    def acquire_lease(self, conversation_id: str, holder: str, ttl: float) -> Lease | None:
        """Take the conversation's lease for ``ttl`` seconds if no unexpired one is held.

        Returns the lease, with a new fencing token and the state read in the same step,
        or ``None`` if someone else holds it.
        """

    def renew_lease(self, lease: Lease, ttl: float) -> bool:
        """Extend ``lease`` to ``ttl`` seconds from now if it is still held and unexpired."""

    def release_lease(self, lease: Lease) -> None:
        """Give ``lease`` back if it is still held (by that holder and token)."""


@runtime_checkable
class AsyncStateStore(Protocol):
    """The async twins of the store methods (same meaning, awaited)."""

    async def aget(self, conversation_id: str) -> ConversationState | None:
        """Async :meth:`StateStore.get`."""

    async def acompare_and_set(
        self,
        conversation_id: str,
        expected: ConversationState | None,
        new: ConversationState,
        *,
        lease: Lease | None = None,
        release: bool = False,
    ) -> bool:
        """Async :meth:`StateStore.compare_and_set`."""

    async def aclear(self, conversation_id: str) -> ConversationState:
        """Async :meth:`StateStore.clear`."""

    async def adelete(self, conversation_id: str) -> None:
        """Async :meth:`StateStore.delete`."""

    async def aacquire_lease(self, conversation_id: str, holder: str, ttl: float) -> Lease | None:
        """Async :meth:`LeasingStateStore.acquire_lease`."""

    async def arenew_lease(self, lease: Lease, ttl: float) -> bool:
        """Async :meth:`LeasingStateStore.renew_lease`."""

    async def arelease_lease(self, lease: Lease) -> None:
        """Async :meth:`LeasingStateStore.release_lease`."""


def check_states(expected: object, new: object) -> None:
    """Raise :class:`~demote.errors.ArgumentTypeError` unless both are states (or ``None``)."""
    if expected is not None and not isinstance(expected, ConversationState):
        raise ArgumentTypeError(
            f"expected state: must be a ConversationState or None, got {expected!r:.80}"
        )
    if not isinstance(new, ConversationState):
        raise ArgumentTypeError(f"new state: must be a ConversationState, got {new!r:.80}")


def tombstone(current: ConversationState | None) -> ConversationState:
    """The state ``clear`` leaves: fresh, one generation after ``current``."""
    return ConversationState(generation=(current.generation if current else 0) + 1)


def check_lease(lease: object, *, optional: bool = False) -> None:
    """Raise :class:`~demote.errors.ArgumentTypeError` unless ``lease`` is a :class:`Lease`.

    With ``optional``, ``None`` passes too. Only a store's own leases are meant here: a
    lease is never built by hand, so anything else is a caller's mistake.
    """
    if optional and lease is None:
        return
    if not isinstance(lease, Lease):
        hint = " or None" if optional else ""
        raise ArgumentTypeError(f"lease: must be a Lease{hint}, got {lease!r:.80}")


def check_holder(holder: object) -> str:
    """``holder`` if it is a usable lease holder name (as a conversation id is), else raise."""
    if not isinstance(holder, str) or not holder or "\x00" in holder or len(holder) > 1024:
        raise ArgumentTypeError(
            f"holder: must be a non-empty str of at most 1024 characters without NUL, "
            f"got {holder!r:.40}"
        )
    try:
        holder.encode("utf-8")
    except UnicodeEncodeError:
        raise ArgumentTypeError(f"holder: is not valid Unicode text: {holder!r:.40}") from None
    return holder
