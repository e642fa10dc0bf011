"""The steps a PostgreSQL archive's operation yields: a database flow, or a model call.

Each operation of :class:`~demote.archive.postgres.PostgresArchive` is written once, as a
generator of these steps (:data:`Steps`); :func:`demote.backends.flow.drive_sync` runs it
with ``run_sync`` and ``drive_async`` with ``run_async``, so the sync and async methods
share one body.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from demote.archive._pg_flows import Flow, aexecute, execute
from demote.archive.embeddings import Embedder
from demote.backends.postgres import Pools

__all__ = ["Db", "Embed", "Steps"]

T = TypeVar("T")
_LABEL = "postgres archive"


@dataclass(frozen=True, slots=True)
class Db:
    """An operation (:mod:`demote.backends.flow`): a database flow on a pooled connection."""

    pools: Pools
    flow: Flow[Any]
    write: bool = False

    def run_sync(self) -> Any:
        return self.pools.run(lambda conn: execute(conn, self.flow, self.write), _LABEL)

    async def run_async(self) -> Any:
        return await self.pools.arun(lambda conn: aexecute(conn, self.flow, self.write), _LABEL)


@dataclass(frozen=True, slots=True)
class Embed:
    """An operation: the model embeds documents (in a thread when async), or a query."""

    model: Embedder
    documents: list[str] | None = None
    query: str = ""

    def run_sync(self) -> Any:
        if self.documents is not None:
            return self.model.embed_documents(self.documents)
        return self.model.embed_query(self.query)

    async def run_async(self) -> Any:
        if self.documents is not None:
            return await asyncio.to_thread(self.model.embed_documents, self.documents)
        return await self.model.aembed_query(self.query)


#: An operation's steps, run by :func:`demote.backends.flow.drive_sync` or ``drive_async``.
Steps = Generator[Db | Embed, Any, T]
