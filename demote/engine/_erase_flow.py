"""What every adapter's ``erase`` does, written once for sync and async callers.

1. Read the conversation's messages, with their positions, from the adapter's inner
   store (a LangChain chat history, a LlamaIndex chat store, an agent's checkpoint).
2. Empty the inner store, unless asked not to. This comes before the engine's erase: once
   the demotion state is deleted, a load that still found the old history would demote
   all of it again, as a new conversation.
3. :meth:`demote.Demoter.erase`, with the dedup keys of what was read (for tiers that
   delete by id) and the adapter's ``capture`` (not under the hook, erased after it).
4. Report the inner store as a tier of its own (:attr:`EraseReport.inner`): how many
   messages left it, or ``kept``.

The adapters give the two store operations as :class:`~demote.flow.Twin` (or any other
:mod:`demote.flow` operation) and run the flow with ``drive_sync`` or ``drive_async``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from demote._validate import seconds
from demote.engine.demoter import Demoter
from demote.erase import EraseReport, TierKind, TierReport
from demote.flow import Call, Flow, Op
from demote.records import MessageRecord, keys_of

__all__ = ["erase_conversation"]

T = TypeVar("T")


def erase_conversation(
    demoter: Demoter,
    conversation_id: str,
    describe: Callable[[T], MessageRecord],
    *,
    read: Op,
    clear: Op | None,
    inner: tuple[object, TierKind],
    also: Sequence[object] = (),
    wait: float | None = None,
) -> Flow[EraseReport]:
    """The steps of the module docstring.

    Args:
        demoter: The adapter's demoter.
        conversation_id: The conversation.
        describe: How the adapter describes one of its messages.
        read: Returns ``(position, message)`` pairs of the inner store's messages.
        clear: Empties the inner store; ``None`` leaves it as it is.
        inner: The inner store and what it is (``"history"``, ``"chat store"``,
            ``"checkpoint"``), for its line of the report.
        also: The adapter's capture, if any.
        wait: Passed to :meth:`demote.Demoter.erase`.
    """
    if wait is not None:  # before the inner store is touched: a refusal changes nothing
        seconds("wait", wait, zero=True)
    held: Sequence[tuple[int, T]] = yield read
    if clear is not None:
        yield clear
    keys = keys_of(conversation_id, ((i, describe(m)) for i, m in held))
    options = {"keys": keys, "also": tuple(also), "wait": wait}
    report: EraseReport = yield Call(demoter, "erase", (conversation_id,), options)
    store, kind = inner
    name = type(store).__name__
    if clear is None:
        return replace(report, inner=TierReport(name, "kept", kind=kind))
    return replace(report, inner=TierReport(name, "erased", len(held), kind=kind))
