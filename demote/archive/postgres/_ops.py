"""The steps a PostgreSQL archive's operation yields: a database flow, or a model call.

Each operation of :class:`~demote.archive.postgres.PostgresArchive` is written once, as a
flow (:data:`demote.flow.Flow`) of these steps; :func:`demote.flow.drive_sync` runs it
with ``run_sync`` and ``drive_async`` with ``run_async``, so the sync and async methods
share one body.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from demote.archive.embeddings import Embedder
from demote.archive.postgres._flows import SqlFlow, aexecute, execute
from demote.backends.postgres import Pools

__all__ = ["Db", "Embed", "Prepare"]

T = TypeVar("T")
_LABEL = "postgres archive"


@dataclass(frozen=True, slots=True)
class Db:
    """An operation (:mod:`demote.flow`): a database flow on a pooled connection.

    ``make`` makes the flow: each attempt runs a fresh one (a flow is a generator, spent
    by a try that failed; the pools try again once a missing table is made again).
    """

    pools: Pools
    make: Callable[[], SqlFlow[Any]]
    write: bool = False

    def run_sync(self) -> Any:
        return self.pools.run(lambda conn: execute(conn, self.make(), self.write), _LABEL)

    async def run_async(self) -> Any:
        return await self.pools.arun(lambda conn: aexecute(conn, self.make(), self.write), _LABEL)


@dataclass(frozen=True, slots=True)
class Prepare:
    """An operation: make or check the tables now, if the server was out of reach so far."""

    pools: Pools

    def run_sync(self) -> None:
        self.pools.prepare(_LABEL)

    async def run_async(self) -> None:
        await self.pools.aprepare(_LABEL)


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
