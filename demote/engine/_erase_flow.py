"""What every adapter's ``erase`` does, written once for sync and async callers.

1. Read the conversation's messages, with their positions, from the adapter's inner
   store (a LangChain chat history, a LlamaIndex chat store, an agent's checkpoint).
2. Empty the inner store, unless asked not to. This comes before the engine's erase: once
   the demotion state is deleted, a load that still found the old history would demote
   all of it again, as a new conversation.
3. :meth:`demote.Demoter.erase`, with the dedup keys of what was read (for tiers that
   delete by id) and the adapter's ``capture`` (not under the hook, erased after it).
4. Report how many messages left the inner store (:attr:`EraseReport.inner`).

The adapters give the two store operations as :class:`Twin` (or any other
:mod:`demote.backends.flow` operation) and run the flow with ``drive_sync`` or ``drive_async``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from demote._validate import seconds
from demote.backends.flow import Call, Flow, Op
from demote.engine.demoter import Demoter
from demote.erase import EraseReport
from demote.records import MessageRecord, keys_of

__all__ = ["Twin", "erase_conversation"]

T = TypeVar("T")


@dataclass(slots=True)
class Twin:
    """Call ``sync(*args)`` blocking, or await ``asynchronous(*args)``."""

    sync: Callable[..., Any]
    asynchronous: Callable[..., Awaitable[Any]]
    args: tuple[Any, ...] = ()

    def run_sync(self) -> Any:
        return self.sync(*self.args)

    async def run_async(self) -> Any:
        return await self.asynchronous(*self.args)


def erase_conversation(
    demoter: Demoter,
    conversation_id: str,
    describe: Callable[[T], MessageRecord],
    *,
    read: Op,
    clear: Op | None,
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
    return replace(report, inner=len(held) if clear is not None else None)
