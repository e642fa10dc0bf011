"""``prune_state=True``: removing delivered messages from the agent state, positions kept.

Dedup keys hold a message's absolute position, so pruning the front of the history must
not shift positions. The state records the pruned prefix in a private field,
``demote_pruned = {"pinned": p, "removed": n}``: the ``p`` leading system messages are
kept, the next ``n`` messages were removed. The engine is given a view of length
``n + len(messages)`` whose absolute index ``i`` maps to ``messages[i]`` below ``p`` and to
``messages[i - n]`` from ``p + n`` on. The engine reads only from ``needed_from(state)``,
which never goes below the watermark minus one, and a prune removes only messages below
``delivered - 1`` (the message just before the watermark is kept: it is the engine's
anchor for rewrite detection), so the pruned positions are never read.

The opener. When the window starts inside a turn, the model is sent the turn's opening
user message in front of the kept steps. A prune keeps it: it stops below the opener of
the window it follows, and when the window shows no opener and does not start at a user
message either (it is empty, or its turn has no user message), it prunes nothing, since
where the running turn begins is not known then. Window starts only move on, and so do
their turns' openers, so every later window's opener is still in the state. The engine,
though, does not store where the opener is: a load that has not seen it (a new process,
a new ``invoke`` whose checkpoint gave new message objects) plans again with records from
further back (``Plan.needs``: from the start). Such a load is told which positions were
pruned (``Demoter.load(pruned=range(p, p + n))``) and reads from their end: the anchor
at ``p + n`` is not the opener, the opener comes after it, and the turns after the anchor
are cut as they are in the whole history (in an agent's state a call's results follow it
at once, so no call before the anchor is answered after it). So the model is sent
exactly what it is sent without ``prune_state``.

Why not the other designs: the demotion state's ``offset`` would have to be written by
every prune and would not rewind with the checkpoint under time travel; keeping the
opener's position (or the opener itself) in the checkpoint adds a second record of what
the engine already finds, and a copy to keep true when the opener is edited.

Where the count lives: in the checkpoint, written by the same ``Command`` that removes the
messages. Removal and count are therefore one atomic state update, are per thread by
construction, survive restarts with a durable checkpointer, and rewind together under
LangGraph time travel. (The count cannot be derived from the demotion state alone: the
watermark moves on after a prune, and the next prune happens one model call later.) If
the demotion state does not cover the pruned prefix (a non-durable state store after a
restart, ``Demoter.clear``, time travel to a checkpoint before the window start), it is
re-seeded from the checkpoint: everything up to the kept anchor was delivered before it
was pruned. There, and only there, a pruned thread can be sent a different window than a
kept one: a kept thread re-plans its whole history afresh, which may show messages the
pruned checkpoint no longer has, while a pruned thread's window starts after its anchor.
A load whose state store is down (a degraded window) is planned from that same seeded
state, never from position 0, and prunes nothing: nothing it planned was committed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypedDict, cast, overload

from langchain_core.messages import BaseMessage, RemoveMessage

from demote.engine import Demoter, Window
from demote.errors import DemoteError
from demote.flow import Flow, Twin
from demote.records import ConversationState, MessageRecord
from langchain_demote.messages import message_role

__all__ = ["PRUNED_KEY", "PrunedPrefix", "PrunedView", "prune_update", "reconcile"]

logger = logging.getLogger("demote")

#: The private agent-state field that records the pruned prefix.
PRUNED_KEY = "demote_pruned"


class PrunedPrefix(TypedDict):
    """What ``prune_state=True`` removed from the front of a thread's messages.

    Attributes:
        pinned: Leading system messages kept in front (never pruned).
        removed: Messages removed right after them, all delivered to the hook.
    """

    pinned: int
    removed: int


class PrunedView(Sequence[BaseMessage]):
    """The thread's messages at their absolute positions, with the pruned prefix absent.

    Index ``i`` is ``messages[i]`` below ``pinned``, and ``messages[i - removed]`` from
    ``pinned + removed`` on. Reading a pruned position is a bug (the engine never reads
    below the watermark), so it raises instead of inventing a message.
    """

    __slots__ = ("_messages", "_pinned", "_removed")

    def __init__(self, messages: Sequence[BaseMessage], pinned: int, removed: int) -> None:
        self._messages = messages
        self._pinned = pinned
        self._removed = removed

    def __len__(self) -> int:
        return len(self._messages) + self._removed

    @overload
    def __getitem__(self, index: int) -> BaseMessage: ...

    @overload
    def __getitem__(self, index: slice) -> list[BaseMessage]: ...

    def __getitem__(self, index: int | slice) -> BaseMessage | list[BaseMessage]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(index)
        if i < self._pinned:
            return self._messages[i]
        if i < self._pinned + self._removed:
            raise DemoteError(
                f"message {i} was pruned from the agent state; the demotion state no longer "
                "covers it (was the thread's history rewritten below its pruned prefix?)"
            )
        return self._messages[i - self._removed]


def prune_update(
    cid: str,
    window: Window[BaseMessage],
    messages: Sequence[BaseMessage],
    pruned: PrunedPrefix | None,
) -> dict[str, Any] | None:
    """The state update removing what the hook accepted, or ``None`` if nothing new.

    ``window.delivered`` is the watermark the load committed (or found): only what the
    hook accepted is pruned, never what is still pending. Nor what the model is still
    sent: the watermark may run past the window start (cleared tool results in the
    window), and the opener of a window that starts inside a turn is before it; the
    prune stops below both.
    """
    if window.degraded:
        return None  # the store is down: nothing was committed, so nothing is pruned
    limit = min(window.delivered, window.start)
    if window.opener_index is not None:
        limit = min(limit, window.opener_index)
    elif not (window.messages and message_role(window.messages[0]) == "user"):
        # The window shows neither the running turn's opener nor a turn's start (it is
        # empty, or the turn has no user message): where that turn begins is not known
        # here, so nothing is pruned until a window shows it.
        return None
    if limit <= len(window.pinned):
        return None  # nothing delivered yet
    pinned = pruned["pinned"] if pruned else len(window.pinned)
    removed = pruned["removed"] if pruned else 0
    # Keep the message just before the limit: the engine reads it (its anchor).
    count = limit - 1 - (pinned + removed)
    if count <= 0:
        return None
    victims = list(messages[pinned : pinned + count])
    ids = [m.id for m in victims]
    if len(victims) < count or any(i is None for i in ids):
        logger.warning("demote: not pruning conversation %r: messages without ids", cid)
        return None
    return {
        "messages": [RemoveMessage(id=cast(str, i)) for i in ids],
        PRUNED_KEY: PrunedPrefix(pinned=pinned, removed=removed + count),
    }


def reconcile(
    demoter: Demoter,
    describe: Callable[[BaseMessage], MessageRecord],
    cid: str,
    view: Sequence[BaseMessage],
    pinned: int,
    removed: int,
) -> Flow[None]:
    """Re-seed a demotion state that does not cover the pruned prefix.

    Everything below ``floor = pinned + removed`` was pruned after the hook accepted it,
    and ``view[floor]`` is the kept anchor, also delivered. A state that would make the
    engine read below ``floor`` (lost with a non-durable store, cleared, or from a history
    rewritten below the prefix) is replaced by one whose window starts right after the
    anchor.
    """
    floor = pinned + removed
    if len(view) <= floor:
        raise DemoteError(
            f"conversation {cid!r}: the agent state is shorter than its pruned prefix"
        )
    d = demoter
    try:
        s: ConversationState = yield Twin(d.state_of, d.astate_of, (cid,))
    except Exception:
        if d.on_store_error == "raise":
            raise
        return  # the store is down: the load degrades, planned after the pruned prefix
    if (
        s.pinned == pinned
        and floor < s.window_start <= len(view)
        and s.delivered >= floor
        and describe(view[s.window_start - 1]).fingerprint == s.anchor
    ):
        return
    seeded = ConversationState(
        window_start=floor + 1,
        delivered=floor + 1,
        pinned=pinned,
        anchor=describe(view[floor]).fingerprint,
        summary=s.summary,
        summarized=min(s.summarized, floor + 1),
        generation=s.generation + 1,
    )
    logger.warning(
        "demote: demotion state of conversation %r does not cover its pruned prefix "
        "(%d messages); re-seeding it from the agent state",
        cid,
        floor,
    )
    try:
        yield Twin(d.seed, d.aseed, (cid, seeded))
    except Exception:
        if d.on_store_error == "raise":
            raise
