"""The hook protocol: where demoted messages go.

A hook implements ``deliver(batch)`` and/or ``async adeliver(batch)``. The engine calls
whichever fits the caller: a sync load calls ``deliver`` (or runs ``adeliver`` to
completion), an async load awaits ``adeliver`` (or runs ``deliver`` in a worker thread so
the event loop never blocks). A hook signals failure by raising; the engine then keeps the
watermark where it was, so the next load delivers the same batch again.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from demote.records import CapturedTurn, Demotion, Recalled

__all__ = ["ArchiveRecall", "AsyncHook", "Capture", "Recall", "SyncHook"]


@runtime_checkable
class SyncHook(Protocol):
    """A hook with a blocking ``deliver``."""

    def deliver(self, batch: Demotion) -> None:
        """Store ``batch``; raise to refuse it (it will be offered again)."""


@runtime_checkable
class AsyncHook(Protocol):
    """A hook with an awaitable ``adeliver``."""

    async def adeliver(self, batch: Demotion) -> None:
        """Store ``batch``; raise to refuse it (it will be offered again)."""


@runtime_checkable
class Recall(Protocol):
    """Anything that reads the long tail back: ``SQLiteArchive``, ``Mem0Recall``.

    An implementation may also have ``async def asearch(...)`` with the same arguments;
    async callers use it when it is there.
    """

    def search(
        self, conversation_id: str, query: str, k: int = 5, *, budget_tokens: int | None = None
    ) -> list[Recalled]:
        """The stored messages of ``conversation_id`` most relevant to ``query``, best first.

        Args:
            conversation_id: The conversation to search; no other is ever read.
            query: Free text.
            k: How many hits at most.
            budget_tokens: Most tokens the returned texts may cost together (``None``: no
                limit); a hit that does not fit is left out, and a later, shorter one may
                take its place.
        """


@runtime_checkable
class ArchiveRecall(Recall, Protocol):
    """Recall that also reads one archived message back by its key: what recall tools take.

    ``SQLiteArchive`` and ``PostgresArchive`` are both; ``Mem0Recall`` only searches (mem0
    keeps memories, not the messages they came from). An implementation may also have
    ``async def afetch(...)``; async callers use it when it is there.
    """

    def fetch(self, conversation_id: str, key: str) -> Recalled | None:
        """The message of ``conversation_id`` archived under ``key``, or ``None``.

        Args:
            conversation_id: The conversation to read; a key of another conversation is
                ``None`` here, never its message.
            key: The dedup key the message was archived under (the key a cleared tool
                result's placeholder names).
        """


@runtime_checkable
class Capture(Protocol):
    """Takes each new user turn off the request path (``Mem0Capture``): never blocks."""

    def capture(self, turn: CapturedTurn) -> None:
        """Queue ``turn`` for extraction; must return at once."""
