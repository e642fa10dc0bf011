"""The recall protocols: what reads the long tail back.

:class:`Recall` searches one conversation's archived messages (``SQLiteArchive``,
``PostgresArchive``, ``Mem0Recall``, a LangGraph store's ``StoreRecall``); an
:class:`ArchiveRecall` also reads one message back by its key, which is what the recall
tools take. :mod:`demote.request`, the recall tools and the adapters type the recall
sources they are given with these; :mod:`demote.hooks.base` still exports both.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from demote.records import Recalled

__all__ = ["ArchiveRecall", "Recall"]


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
