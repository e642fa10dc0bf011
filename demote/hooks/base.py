"""The hook protocol: where demoted messages go.

A hook implements ``deliver(batch)`` and/or ``async adeliver(batch)``. The engine calls
whichever fits the caller: a sync load calls ``deliver`` (or runs ``adeliver`` to
completion), an async load awaits ``adeliver`` (or runs ``deliver`` in a worker thread so
the event loop never blocks). A hook signals failure by raising; the engine then keeps the
watermark where it was, so the next load delivers the same batch again.

The recall protocols (:class:`Recall`, :class:`ArchiveRecall`) live in ``demote.recall``,
the capture protocol (:class:`Capture`) in ``demote.capture.base``; this module still
exports all three, as it always has.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from demote.capture.base import Capture
from demote.recall import ArchiveRecall, Recall
from demote.records import Demotion

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
