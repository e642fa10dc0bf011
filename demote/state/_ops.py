"""The public face the durable stores share: each method builds one operation, run twice.

A durable store describes each operation once (:class:`StoreOp`: what to send, in the
store's own terms, and how to read the reply) and supplies two drivers, ``_run``
(blocking) and ``_arun`` (awaited). :class:`OpStore` turns that into the whole protocol,
sync and async, so no method body exists twice. Arguments are checked while the
operation is built, on the caller's side, before any I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from demote._closing import Closing
from demote.records import ConversationState
from demote.state.base import Lease, check_holder, check_lease, check_states

__all__ = ["OpStore", "StoreOp"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StoreOp(Generic[T]):
    """One state store operation: ``request``, and ``finish``, which reads the reply.

    ``request`` is a script call, a statement or a function, in the store's own terms.
    Not a flow's operation (:class:`demote.flow.Op`): the store's ``_run`` or ``_arun``
    sends it whole.
    """

    request: Any
    finish: Callable[[Any], T]


def _lease(lease: Lease) -> Lease:
    check_lease(lease)
    return lease


class OpStore(Closing):
    """The state store protocol over operation builders and two drivers."""

    #: Its calls do I/O: the engine's async path awaits the async twins.
    nonblocking: ClassVar[bool] = False

    def _run(self, op: StoreOp[T]) -> T:
        raise NotImplementedError

    async def _arun(self, op: StoreOp[T]) -> T:
        raise NotImplementedError

    def _get_op(self, conversation_id: str) -> StoreOp[ConversationState | None]:
        raise NotImplementedError

    def _cas_op(
        self,
        conversation_id: str,
        expected: ConversationState | None,
        new: ConversationState,
        lease: Lease | None,
        release: bool,
    ) -> StoreOp[bool]:
        raise NotImplementedError

    def _clear_op(self, conversation_id: str) -> StoreOp[ConversationState]:
        raise NotImplementedError

    def _delete_op(self, conversation_id: str) -> StoreOp[None]:
        raise NotImplementedError

    def _count_op(self) -> StoreOp[int]:
        raise NotImplementedError

    def _acquire_op(self, conversation_id: str, holder: str, ttl: float) -> StoreOp[Lease | None]:
        raise NotImplementedError

    def _conversations_op(self) -> StoreOp[list[str]]:
        raise NotImplementedError

    def _renew_op(self, lease: Lease, ttl: float) -> StoreOp[bool]:
        raise NotImplementedError

    def _release_op(self, lease: Lease) -> StoreOp[None]:
        raise NotImplementedError

    def get(self, conversation_id: str) -> ConversationState | None:
        """The stored state, or ``None`` for a conversation never seen (or deleted)."""
        return self._run(self._get_op(conversation_id))

    def compare_and_set(
        self,
        conversation_id: str,
        expected: ConversationState | None,
        new: ConversationState,
        *,
        lease: Lease | None = None,
        release: bool = False,
    ) -> bool:
        """Compare-and-set, fenced by ``lease`` if given (see ``StateStore``).

        Stores ``new`` if the state equals ``expected`` and the lease is still held,
        unexpired, by its holder and token, all in one atomic step; ``release=True``
        gives the lease back in that step, stored or not. Returns whether it stored.
        """
        check_states(expected, new)
        check_lease(lease, optional=True)
        return self._run(self._cas_op(conversation_id, expected, new, lease, release))

    def clear(self, conversation_id: str) -> ConversationState:
        """Replace the state with a tombstone (``generation`` + 1), revoke the lease.

        Returns the tombstone. One atomic step.
        """
        return self._run(self._clear_op(conversation_id))

    def delete(self, conversation_id: str) -> None:
        """Remove the conversation's state and lease (the fencing counter stays)."""
        self._run(self._delete_op(conversation_id))

    def count(self) -> int:
        """How many conversations have state (a cleared one keeps its tombstone)."""
        return self._run(self._count_op())

    def conversations(self) -> list[str]:
        """Ids of the conversations with state, sorted by code point (``demote inspect``)."""
        return self._run(self._conversations_op())

    async def aconversations(self) -> list[str]:
        """Async :meth:`conversations`."""
        return await self._arun(self._conversations_op())

    def acquire_lease(self, conversation_id: str, holder: str, ttl: float) -> Lease | None:
        """Take the conversation's lease for ``ttl`` seconds if no unexpired one is held.

        Returns the lease, with a new fencing token and the state read in the same step,
        or ``None`` if someone holds it. ``ttl`` must be a finite number > 0
        (:class:`~demote.errors.ConfigError` otherwise).
        """
        return self._run(self._acquire_op(conversation_id, check_holder(holder), ttl))

    def renew_lease(self, lease: Lease, ttl: float) -> bool:
        """Extend ``lease`` to ``ttl`` seconds from now if it is still held and unexpired."""
        return self._run(self._renew_op(_lease(lease), ttl))

    def release_lease(self, lease: Lease) -> None:
        """Give ``lease`` back if it is still held (by that holder and token)."""
        self._run(self._release_op(_lease(lease)))

    async def aget(self, conversation_id: str) -> ConversationState | None:
        """Async :meth:`get`."""
        return await self._arun(self._get_op(conversation_id))

    async def acompare_and_set(
        self,
        conversation_id: str,
        expected: ConversationState | None,
        new: ConversationState,
        *,
        lease: Lease | None = None,
        release: bool = False,
    ) -> bool:
        """Async :meth:`compare_and_set`."""
        check_states(expected, new)
        check_lease(lease, optional=True)
        return await self._arun(self._cas_op(conversation_id, expected, new, lease, release))

    async def aclear(self, conversation_id: str) -> ConversationState:
        """Async :meth:`clear`."""
        return await self._arun(self._clear_op(conversation_id))

    async def adelete(self, conversation_id: str) -> None:
        """Async :meth:`delete`."""
        await self._arun(self._delete_op(conversation_id))

    async def acount(self) -> int:
        """Async :meth:`count`."""
        return await self._arun(self._count_op())

    async def aacquire_lease(self, conversation_id: str, holder: str, ttl: float) -> Lease | None:
        """Async :meth:`acquire_lease`."""
        return await self._arun(self._acquire_op(conversation_id, check_holder(holder), ttl))

    async def arenew_lease(self, lease: Lease, ttl: float) -> bool:
        """Async :meth:`renew_lease`."""
        return await self._arun(self._renew_op(_lease(lease), ttl))

    async def arelease_lease(self, lease: Lease) -> None:
        """Async :meth:`release_lease`."""
        await self._arun(self._release_op(_lease(lease)))

    async def aclose(self) -> None:
        """Async :meth:`close`."""
        self.close()
