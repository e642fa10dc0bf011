"""What the Demoter's parts pass each other.

A load's :class:`Work`, a conversation's :class:`Hold` (gate and lease), a
:class:`Detached` hook call, the :class:`Tally` of counters, and the :class:`Replay` a
background load runs under (:data:`REPLAY`).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from demote.engine._flow import Running
from demote.engine._views import View
from demote.events import DemoteEvent
from demote.records import ConversationState, Demotion, MessageRecord
from demote.state.base import Lease
from demote.window.planner import Plan

__all__ = ["FRESH", "REPLAY", "UNREPLAYABLE", "Detached", "Hold", "Replay", "Tally", "Work"]

FRESH = ConversationState()

#: How many conversations' last delivery errors a Demoter remembers.
_ERRORS_KEPT = 10_000


@dataclass(slots=True)
class Work:
    """One plan of one history against one committed state, and the state to commit."""

    messages: Sequence[Any]
    stored: ConversationState | None  # the committed state planned against
    plan: Plan
    view: View
    target: ConversationState  # window moved; ``delivered`` as committed
    resynced: bool
    known: bool  # the hook may hold some of these messages already (re-sync, clear)
    events: list[DemoteEvent] = field(default_factory=list)
    reserved: int = 0  # tokens outside the messages the plan left room for
    pruned: range = range(0)  # positions absent from the messages (a pruned prefix)
    describe: Callable[[Any], MessageRecord] | None = None  # records a message read outside
    fixed: int = 0  # of ``reserved``, what every request carries alike (sizes the clipping)

    @property
    def changed(self) -> bool:
        # The planner's answer is the committed state itself when nothing moved.
        return self.target is not (self.stored or FRESH)

    @property
    def deliver_end(self) -> int:
        """End of what the hook must hold once this work is done.

        Past the window start when results in the window are sent as placeholders
        (their content goes to the hook first).
        """
        p = self.plan  # (p.deliver.stop, without making the range)
        return max(self.target.window_start, p.window_start, p.deliver_to)


@dataclass(slots=True, eq=False)
class Hold:
    """A conversation's in-process gate, and its store lease once taken."""

    conversation_id: str
    holder: str
    lease: Lease | None = None
    released: bool = False  # the lease was given back (or committed with release)
    detached: Detached | None = None  # a hook call that outlived its load's wait
    adopted: bool = False  # a background flow owns the hold until that call ends


@dataclass(slots=True)
class Detached:
    """A batch whose hook call goes on after its load stopped waiting for it."""

    running: Running | None  # set when the call outlives the wait
    batch: Demotion
    lo: int
    hi: int
    generation: int
    sent: list[tuple[int, str]] | None  # (index, fingerprint) to mark sent on success
    pending: int  # messages pending when the call began (for the log)
    began: float  # time.perf_counter() at the call's start


@dataclass(slots=True, eq=False)
class Replay:
    """What a background load (:mod:`demote.engine._pending`) expects to find.

    It replays a history read earlier, so before it delivers or commits anything the
    conversation must still be the one that history was planned under: its state of the
    same ``generation`` (``None``: unknown; :data:`UNREPLAYABLE`: none will do), and no
    rewrite to re-sync. Else another worker reset or re-synced it since, and ``moved_on``
    is set: the load does nothing. ``elsewhere``: another worker held its lease.
    """

    conversation_id: str
    generation: int | None
    moved_on: bool = False
    elsewhere: bool = False

    def moved(self, work: Work) -> bool:
        """Has the conversation moved on from what this replay expects (recorded if so)?"""
        stored = work.stored
        have = -1 if stored is None else stored.generation
        if work.resynced or self.generation not in (None, have):
            self.moved_on = True
        return self.moved_on


#: A :attr:`Replay.generation` no state has: the history is not to be replayed.
UNREPLAYABLE = -2

#: The background load running in this context, if any (``None`` for every other load).
REPLAY: ContextVar[Replay | None] = ContextVar("demote_replay", default=None)


class Tally:
    """The Demoter's counters for :meth:`~demote.Demoter.stats` (this process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loads = 0
        self.delivered = 0
        self.failures = 0
        self.summaries = 0
        self.resyncs = 0
        self.degraded = 0
        self.retries = 0  # background loads of conversations left with pending messages
        self.untracked = 0  # conversations the background retries let go
        self.last_error: tuple[str, float] | None = None
        self.errors: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self.pending: OrderedDict[str, int] = OrderedDict()

    def failed(self, cid: str, error: str) -> None:
        with self.lock:
            self.failures += 1
            self.last_error = (error, time.time())
            self.errors[cid] = self.last_error
            self.errors.move_to_end(cid)
            if len(self.errors) > _ERRORS_KEPT:
                self.errors.popitem(last=False)

    def note_pending(self, cid: str, pending: int) -> None:
        if pending:
            with self.lock:
                self.pending[cid] = pending
                self.pending.move_to_end(cid)
                if len(self.pending) > _ERRORS_KEPT:
                    self.pending.popitem(last=False)
        elif cid in self.pending:
            with self.lock:
                self.pending.pop(cid, None)
