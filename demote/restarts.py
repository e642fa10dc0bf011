"""Restarts: an inner store that outlives the process, beside a demotion state that does not.

The inner store (a LangGraph checkpointer, a LlamaIndex chat store, a LangChain chat
history) keeps the conversation; the demotion state remembers how far into it the window
starts and how much of it the hook holds. When the first survives a restart and the second
does not (``InMemoryStateStore``, the default), a restarted process finds every
conversation without state and demotes it again from its start: the hook is handed what it
already holds. Built-in hooks skip the keys they know (at a cost); a hook of one's own gets
duplicates, and a ``Compact`` summary is written again.

:func:`check_restarts` is that check, written once; each adapter calls it with its inner
store and whether its framework keeps that store in memory (``InMemorySaver``,
``SimpleChatStore``, ``InMemoryChatMessageHistory``: everything else is taken to be
durable). It warns once per process, at the first line outside demote's packages, with
a :class:`~demote.errors.DemoteWarning` that names the fix: a durable state store that
lives and dies with the inner store. A demoter whose hook keeps nothing (``NoopHook``)
has nothing to hand over twice and is not warned about.
"""

from __future__ import annotations

import sys
import threading
import warnings

from demote.engine.demoter import Demoter
from demote.errors import DemoteWarning
from demote.hooks.simple import NoopHook
from demote.state.memory import InMemoryStateStore

__all__ = ["check_restarts"]

_OURS = ("demote.", "langchain_demote.", "llamaindex_demote.")
_lock = threading.Lock()
_warned = False  # once per process (tests reset it)


def check_restarts(demoter: Demoter, inner: object, *, durable: bool) -> bool:
    """Warn, once per process, if ``inner`` survives a restart and the demotion state does not.

    Args:
        demoter: The adapter's demoter: its state store and hook are looked at.
        inner: The inner store (named in the warning).
        durable: Does ``inner`` keep the conversation across restarts? The adapter knows:
            everything but its framework's in-memory stores.

    Returns:
        ``True`` when this pairing forgets on a restart (a durable ``inner``, a demotion
        state in memory, a hook that keeps what it is given), whether the warning was
        given now or earlier in the process.
    """
    if not durable or type(demoter.hook) is NoopHook:
        return False
    if not isinstance(demoter.state, InMemoryStateStore):
        return False
    global _warned
    with _lock:
        first, _warned = not _warned, True
    if first:
        name = type(inner).__name__
        warnings.warn(
            f"{name} keeps conversations across restarts, but the Demoter's state is in "
            "memory (InMemoryStateStore): after a restart every conversation is demoted "
            "again from its start, and the hook is handed what it already holds (built-in "
            "hooks skip known keys; a hook of your own gets duplicates). Give the Demoter "
            f"a durable state store that lives and dies with the {name}: "
            "Demoter(..., state=SQLiteStateStore('state.db')), or RedisStateStore / "
            "PostgresStateStore for several workers",
            DemoteWarning,
            stacklevel=_outside_demote(),
        )
    return True


def _outside_demote() -> int:
    """The ``stacklevel`` of the first caller outside demote's packages (the user's line)."""
    frame = sys._getframe(2)  # the caller of check_restarts
    level = 2
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith(_OURS):
        frame, level = frame.f_back, level + 1
    return level
