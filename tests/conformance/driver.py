"""The driver interface the conformance suite runs against.

Each adapter's test module implements :class:`MemoryDriver` for its memory (LangChain's
``DemotingChatMessageHistory``, LlamaIndex's ``DemotingMemory``) in a sync and an async
flavour, then subclasses the suite in ``tests/conformance/contract.py`` with a fixture
that builds drivers. Messages are exchanged as ``(role, text)`` pairs with roles
``system``, ``user``, ``assistant``; tool exchanges as described on ``add_tool_exchange``.
"""

from __future__ import annotations

from typing import Protocol

from demote import Demoter

Pair = tuple[str, str]


class MemoryDriver(Protocol):
    """One adapter memory bound to one conversation."""

    demoter: Demoter
    conversation_id: str

    def add(self, pairs: list[Pair]) -> None:
        """Append messages to the memory (through the adapter's write path)."""

    def add_tool_exchange(self, user: str, call_ids: list[str], answer: str) -> None:
        """Append user -> assistant with tool calls ``call_ids`` -> one tool result each
        -> final assistant ``answer``."""

    def window(self) -> list[Pair]:
        """What the model would be sent (pinned system + summary + window), as pairs."""

    def all(self) -> list[Pair]:
        """The full history in the inner store."""

    def clear(self) -> None:
        """Clear the memory (inner store and demotion state)."""
