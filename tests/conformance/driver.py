"""The driver interface the conformance suite runs against.

Each adapter's test module implements :class:`MemoryDriver` for its memory (LangChain's
``DemotingChatMessageHistory``, LlamaIndex's ``DemotingMemory``) in a sync and an async
flavour, then subclasses the suite in ``tests/conformance/contract.py`` with a fixture
that builds drivers (see :class:`MakeDriver`). Messages are exchanged as ``(role, text)``
pairs with roles ``system``, ``user``, ``assistant``; tool exchanges as described on
``add_tool_exchange``.

The driver's methods are plain functions in both flavours: an async-flavour driver runs
the adapter's async methods to completion (``asyncio.run`` per call is enough), so the
suite's tests are written once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Protocol

from demote import Demoter, SlidingWindow, StateStore
from demote.erase import EraseReport

Pair = tuple[str, str]
Flavour = Literal["sync", "async"]


class MemoryDriver(Protocol):
    """One adapter memory bound to one conversation."""

    demoter: Demoter
    conversation_id: str

    def add(self, pairs: list[Pair]) -> None:
        """Append messages to the memory (through the adapter's write path)."""

    def add_tool_exchange(self, user: str, call_ids: list[str], answer: str) -> None:
        """Append user -> assistant with tool calls ``call_ids`` -> one tool result each
        -> final assistant ``answer``.

        As pairs (what ``window`` and ``all`` return), the exchange reads
        ``("user", user), ("assistant", <text of the calling message, usually "">),
        ("tool", <result>) * len(call_ids), ("assistant", answer)``.
        """

    def window(self) -> list[Pair]:
        """What the model would be sent (pinned system + summary + window), as pairs."""

    def all(self) -> list[Pair]:
        """The full history in the inner store."""

    def clear(self) -> None:
        """Clear the memory (inner store and demotion state)."""

    def erase(self, *, inner: bool = True) -> EraseReport:
        """Erase the conversation (the adapter's ``erase``/``aerase``)."""


class MakeDriver(Protocol):
    """What a conformance subclass's ``make_driver`` fixture returns.

    Each call builds a new :class:`~demote.Demoter` on ``policy``, ``hook`` and ``state``
    and a new adapter memory over a new inner store for ``conversation_id``.

    ``flavour`` picks the adapter's sync or async methods. ``persist`` (a path the test
    owns) asks for a persistent inner store: a driver made again with the same ``persist``
    and ``conversation_id`` must see the same history (a process restart); ``None`` means
    an in-memory inner store. A bad ``conversation_id`` may raise at once or on first use.
    """

    def __call__(
        self,
        policy: SlidingWindow,
        hook: object,
        state: StateStore,
        conversation_id: str,
        *,
        flavour: Flavour,
        persist: Path | None = None,
    ) -> MemoryDriver:
        """Build a driver."""
