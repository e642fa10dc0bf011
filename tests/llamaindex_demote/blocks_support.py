"""Test support for memory blocks: a vector store that stores text, an embedding, a fact LLM.

llama-index-core's ``SimpleVectorStore`` stores no text (``VectorMemoryBlock`` refuses
it), so :class:`TextVectorStore` is an in-memory ``BasePydanticVectorStore`` that does:
nodes whole, cosine similarity, metadata filters (``==``), ``get_nodes`` and
``delete_nodes`` by id or filter, and a switch that makes it fail like a store that is
down. :class:`WordEmbedding` hashes words into buckets (similar texts, similar vectors).
:func:`fact_llm` is LlamaIndex's ``MockFunctionCallingLLM`` answering the fact block's
prompt with one ``<fact>`` per user message it was shown.
"""

from __future__ import annotations

import math
import re
import threading
import zlib
from collections.abc import Sequence
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.memory.memory import BaseMemoryBlock
from llama_index.core.schema import BaseNode
from llama_index.core.vector_stores.types import (
    BasePydanticVectorStore,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryResult,
)

from llamaindex_demote.messages import text_of

DIMS = 64


def embed(text: str) -> list[float]:
    vector = [0.0] * DIMS
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        vector[zlib.crc32(word.encode()) % DIMS] += 1.0
    return vector


class WordEmbedding(BaseEmbedding):
    """Words hashed into :data:`DIMS` buckets: a stand-in embedding model, offline."""

    def _get_query_embedding(self, query: str) -> list[float]:
        return embed(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return embed(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return embed(text)


class Down(ConnectionError):
    """What :class:`TextVectorStore` raises while it is down."""


class TextVectorStore(BasePydanticVectorStore):
    """An in-memory vector store that stores text (see the module docstring)."""

    stores_text: bool = True
    down: bool = False
    _nodes: dict[str, BaseNode] = PrivateAttr(default_factory=dict)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    @property
    def client(self) -> Any:
        return None

    def _check(self) -> None:
        if self.down:
            raise Down("the vector store is down")

    def add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        self._check()
        with self._lock:
            for node in nodes:
                self._nodes[node.node_id] = node
        return [n.node_id for n in nodes]

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        self._check()
        with self._lock:
            for key in [k for k, n in self._nodes.items() if n.ref_doc_id == ref_doc_id]:
                del self._nodes[key]

    def _matches(self, node: BaseNode, filters: MetadataFilters | None) -> bool:
        if filters is None:
            return True
        return all(
            node.metadata.get(f.key) == f.value  # type: ignore[union-attr]
            for f in filters.filters
        )

    def get_nodes(
        self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None
    ) -> list[BaseNode]:
        self._check()
        with self._lock:
            nodes = list(self._nodes.values())
        return [
            n
            for n in nodes
            if (node_ids is None or n.node_id in node_ids) and self._matches(n, filters)
        ]

    def delete_nodes(
        self,
        node_ids: list[str] | None = None,
        filters: MetadataFilters | None = None,
        **delete_kwargs: Any,
    ) -> None:
        for node in self.get_nodes(node_ids, filters):
            with self._lock:
                self._nodes.pop(node.node_id, None)

    def clear(self) -> None:
        with self._lock:
            self._nodes.clear()

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        self._check()
        wanted = query.query_embedding or []
        scored = []
        for node in self.get_nodes(filters=query.filters):
            vector = node.embedding or []
            dot = sum(a * b for a, b in zip(wanted, vector, strict=False))
            norm = math.sqrt(sum(a * a for a in wanted)) * math.sqrt(sum(b * b for b in vector))
            scored.append((dot / norm if norm else 0.0, node))
        scored.sort(key=lambda pair: -pair[0])
        top = scored[: query.similarity_top_k]
        return VectorStoreQueryResult(
            nodes=[n for _, n in top],
            similarities=[s for s, _ in top],
            ids=[n.node_id for _, n in top],
        )

    def texts(self, session_id: str | None = None) -> list[str]:
        """Every node's text (of one conversation, if given), oldest first."""
        with self._lock:
            nodes = list(self._nodes.values())
        return [
            n.get_content()
            for n in nodes
            if session_id is None or n.metadata.get("session_id") == session_id
        ]


def _facts(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
    """The fact block's LLM: one fact per user message shown before its prompt."""
    shown = messages[:-1]  # the last one is the block's prompt
    facts = "".join(
        f"<fact>{text_of(m)}</fact>" for m in shown if m.role == MessageRole.USER and text_of(m)
    )
    return ChatMessage(
        role=MessageRole.ASSISTANT, blocks=[TextBlock(text=f"<facts>{facts}</facts>")]
    )


def fact_llm() -> MockFunctionCallingLLM:
    """A mock LLM for ``FactExtractionMemoryBlock`` (see :func:`_facts`)."""
    return MockFunctionCallingLLM(response_generator=_facts, is_chat_model=True)


class Ledger(BaseMemoryBlock[str]):
    """A block of your own: keeps every message it is fed, per session, and can erase.

    Its content is the newest ``shown`` lines of the conversation it is read for.
    ``failing`` makes its ``aput`` raise (a block that is down).
    """

    name: str = "Ledger"
    shown: int = 3
    failing: bool = False
    fed: dict[str, list[str]] = Field(default_factory=dict)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    async def _aget(self, messages: list[ChatMessage] | None = None, **kwargs: Any) -> str:
        lines = self.fed.get(str(kwargs.get("session_id")), [])
        return "\n".join(lines[-self.shown :])

    async def aput(
        self,
        messages: list[ChatMessage],
        from_short_term_memory: bool = False,
        session_id: str | None = None,
    ) -> None:
        # The session id is kept here, before BaseMemoryBlock.aput hands only the messages on.
        if self.failing:
            raise Down("the ledger is down")
        with self._lock:
            self.fed.setdefault(str(session_id), []).extend(
                f"{m.role.value}: {text_of(m)}" for m in messages
            )

    async def _aput(self, messages: list[ChatMessage]) -> None:
        raise AssertionError("aput is overridden")

    def erase(
        self, conversation_id: str, *, fence: int | None = None, keys: Sequence[str] | None = None
    ) -> int:
        with self._lock:
            return len(self.fed.pop(conversation_id, []))
