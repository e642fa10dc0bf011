"""Steps 3 and 4 of a load: the gate and lease, delivery in batches, the fenced commit.

This is the part of :class:`~demote.engine.Demoter` that talks to the hook and commits;
it lives here so the engine module stays readable. Everything is a generator of the
operations in :mod:`demote._flow`, shared by the sync and async drivers.

A *hold* is a conversation's in-process gate, and its store lease once taken. Only its
owner delivers and commits. A sync hook call that outlives its wait (``hook_timeout``, or
an async load cancelled meanwhile) is *adopted*: the hold stays taken, gate and lease
(renewed by the keeper), until the call ends; a late success then moves the watermark
if it still stands where the call began.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from demote._flow import Deliver, Flow, HasKeys
from demote._flow import store_call as _op
from demote._runner import HookRunner, LeaseKeeper
from demote._views import View, ViewCache
from demote.events import DemoteEvent, Observers
from demote.planner import Plan
from demote.records import (
    ConversationState,
    DemotedMessage,
    Demotion,
    MessageRecord,
    make_key,
    text_data,
)
from demote.retry import RetryTracker
from demote.state.base import Lease, StateStore

logger = logging.getLogger("demote")

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

    @property
    def changed(self) -> bool:
        # The planner's answer is the committed state itself when nothing moved.
        return self.target is not (self.stored or FRESH)


@dataclass(slots=True, eq=False)
class Hold:
    """A conversation's in-process gate, and its store lease once taken."""

    conversation_id: str
    holder: str
    lease: Lease | None = None
    released: bool = False  # the lease was given back (or committed with release)
    orphan: Future[Any] | None = None  # a hook call that outlived its wait
    batch: tuple[int, int, int] | None = None  # (lo, hi, generation) being delivered


class Tally:
    """The Demoter's counters for :meth:`~demote.Demoter.stats` (this process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loads = 0
        self.delivered = 0
        self.failures = 0
        self.summaries = 0
        self.resyncs = 0
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


def _data(rec: MessageRecord, raw: Any) -> dict[str, Any]:
    """The neutral form of a message being delivered: the adapter's, or the record's.

    Made here, at delivery, from the framework message, so the cached records stay small.
    A converter that fails gives the text-only form (logged): a hook still gets the
    message, and the conversation does not stall on one odd message.
    """
    if rec.to_data is not None:
        try:
            data = rec.to_data(raw)
        except Exception as exc:
            logger.warning("demote: cannot convert a message to its neutral form: %r", exc)
        else:
            if isinstance(data, dict):
                return data
            logger.warning("demote: to_data returned %s, not a dict", type(data).__name__)
    return text_data(rec.role, rec.text, rec.answers, rec.tool)


class DeliveryMixin:
    """Gate, lease, batches, fenced commit: the Demoter's delivery half."""

    # Set by Demoter.__init__.
    state: StateStore
    hook: object
    hook_timeout: float | None
    lease_ttl: float
    max_batch: int
    _direct: bool
    _probe: bool
    _views: ViewCache
    _retry: RetryTracker
    _runner: HookRunner
    _keeper: LeaseKeeper
    _observers: Observers
    _tally: Tally
    _lock: threading.Lock
    _gates: dict[str, Hold]
    _instance: str
    _holders: Any

    def _store(self, name: str, *args: Any, **kwargs: Any) -> Flow[Any]:
        """Call the state store: directly if it never blocks, else as a yielded op."""
        if self._direct:
            return getattr(self.state, name)(*args, **kwargs)
        return (yield _op(self.state, name, *args, **kwargs))

    def _deliverable(self, cid: str, work: Work) -> bool:
        """Are messages pending, and may the hook be called for them now?"""
        target = work.target
        return target.delivered < target.window_start and self._retry.ready(cid)

    def _settle(
        self, hold: Hold, work: Work
    ) -> Flow[tuple[ConversationState | None, int, Exception | None]]:
        """With the gate (and lease) held: deliver what is pending, then commit.

        Returns the committed state (``None`` if the commit was refused), how many
        messages the hook accepted, and the hook's error, if any.
        """
        cid = hold.conversation_id
        target, stored = work.target, work.stored
        delivered, end = target.delivered, target.window_start
        demoted = 0
        error: Exception | None = None
        if delivered < end and self._deliverable(cid, work):
            while delivered < end:
                hi = min(end, delivered + self.max_batch)
                batch = yield from self._batch(hold, work, delivered, hi)
                if batch.messages:
                    hold.batch = (delivered, hi, target.generation)
                    began = time.perf_counter()
                    try:
                        yield Deliver(
                            self.hook, batch, self.hook_timeout, self._runner, self._adopter(hold)
                        )
                    except Exception as exc:
                        error = exc
                        self._failed(work, batch, delivered, hi, exc, time.perf_counter() - began)
                        break
                    self._accepted(work, batch, delivered, hi, time.perf_counter() - began)
                    demoted += len(batch.messages)
                delivered = hi
                if delivered < end:  # a backlog: make each batch's progress durable
                    step = replace(target, delivered=delivered)
                    if not (yield from self._commit(hold, stored, step, release=False)):
                        return None, demoted, None
                    stored = step
            if error is None:
                self._retry.succeeded(cid)
        final = target if delivered == target.delivered else replace(target, delivered=delivered)
        if final == (stored or FRESH):
            yield from self._release(hold)
            return stored or FRESH, demoted, error
        ok = yield from self._commit(hold, stored, final, release=True)
        return (final if ok else None), demoted, error

    def _batch(self, hold: Hold, work: Work, lo: int, hi: int) -> Flow[Demotion]:
        """The messages ``[lo, hi)`` as one batch, less what the hook already holds."""
        cid = hold.conversation_id
        records, base, messages = work.view.records, work.view.base, work.messages
        out = []
        for i in range(lo, hi):
            rec = records[i - base]
            key = make_key(cid, i, rec.fingerprint)
            raw = messages[i]
            out.append(DemotedMessage(rec.role, rec.text, i, key, raw, _data(rec, raw)))
        if work.known and out:
            # After a re-sync or a clear the watermark restarted: what the hook (or, for a
            # hook that cannot tell, this process) already holds is not offered again.
            if self._probe:
                held = yield HasKeys(self.hook, cid, [m.key for m in out])
                out = [m for m in out if m.key not in held]
            else:
                was = self._views.was_sent
                out = [m for m in out if not was(cid, m.index, records[m.index - base].fingerprint)]
        fence = hold.lease.token if hold.lease is not None else None
        return Demotion(cid, tuple(out), fence)

    def _accepted(self, work: Work, batch: Demotion, lo: int, hi: int, took: float) -> None:
        cid = batch.conversation_id
        if not self._probe:  # a key-aware hook answers for itself after a re-sync
            records, base = work.view.records, work.view.base
            self._views.mark_sent(
                cid, [(m.index, records[m.index - base].fingerprint) for m in batch.messages]
            )
        with self._tally.lock:
            self._tally.delivered += len(batch.messages)
        work.events.append(
            DemoteEvent(
                "delivered",
                cid,
                lo,
                hi,
                len(batch.messages),
                tuple(m.key for m in batch.messages),
                duration=took,
                fence=batch.fence,
            )
        )

    def _failed(
        self, work: Work, batch: Demotion, lo: int, hi: int, exc: Exception, took: float
    ) -> None:
        cid = batch.conversation_id
        wait = self._retry.failed(cid)
        self._tally.failed(cid, repr(exc))
        logger.warning(
            "demote: hook failed for conversation %r (%d messages pending, next attempt in "
            "%.3g s): %r",
            cid,
            work.target.window_start - lo,
            wait,
            exc,
        )
        work.events.append(
            DemoteEvent(
                "delivery_failed",
                cid,
                lo,
                hi,
                len(batch.messages),
                tuple(m.key for m in batch.messages),
                duration=took,
                error=repr(exc),
                retry_in=wait,
                fence=batch.fence,
            )
        )

    def _commit(
        self, hold: Hold, stored: ConversationState | None, new: ConversationState, *, release: bool
    ) -> Flow[bool]:
        """Compare-and-set ``new``, fenced by the hold's lease (released if asked)."""
        lease = hold.lease
        kwargs: dict[str, Any] = {}
        if lease is not None:
            release = release and hold.orphan is None  # a running call keeps it
            kwargs = {"lease": lease, "release": release}
        cid = hold.conversation_id
        if self._direct:
            # No I/O: check in one step that no clear or forget of this process took the
            # gate away meanwhile (without a lease, nothing else would tell).
            with self._lock:
                ok = self._gates.get(cid) is hold and self.state.compare_and_set(
                    cid, stored, new, **kwargs
                )
        else:  # a lease fences it: clear and forget revoke it in the store
            ok = yield from self._store("compare_and_set", cid, stored, new, **kwargs)
        if lease is not None and kwargs["release"]:
            hold.released = True
            self._keeper.drop(lease)
        if not ok:
            logger.info(
                "demote: commit for conversation %r refused (advanced or cleared elsewhere, "
                "or the lease was lost); keeping theirs",
                hold.conversation_id,
            )
        return bool(ok)

    def _release(self, hold: Hold) -> Flow[None]:
        """Give the lease back now (unless a running hook call still needs it)."""
        lease = hold.lease
        if lease is None or hold.released or hold.orphan is not None:
            return
        hold.released = True
        self._keeper.drop(lease)
        try:
            yield from self._store("release_lease", lease)
        except Exception as exc:  # it expires on its own
            logger.warning("demote: releasing the lease of %r failed: %r", lease, exc)

    # -- the gate, and hook calls that outlive their wait --------------------------------------

    def _take(self, cid: str) -> Hold | None:
        """The conversation's in-process gate, if free (never waits)."""
        with self._lock:
            if cid in self._gates:
                return None
            hold = self._gates[cid] = Hold(cid, f"{self._instance}:{next(self._holders)}")
            return hold

    def _take_leased(self, cid: str) -> Flow[Hold | None]:
        """The gate and, on a shared store, the lease (``None`` if either is busy)."""
        hold = self._take(cid)
        if (
            hold is None
            or not callable(getattr(self.state, "acquire_lease", None))
            or not getattr(self.state, "shared", True)
        ):
            return hold
        lease = yield from self._store("acquire_lease", cid, hold.holder, self.lease_ttl)
        if lease is None:  # another worker is delivering
            self._let_go(hold)
            return None
        hold.lease = lease
        self._keeper.hold(lease)
        return hold

    def _let_go(self, hold: Hold) -> None:
        """Free the gate when a flow ends; a lease still held is released too."""
        if hold.orphan is not None:
            return  # the running call lets go when it ends
        lease = hold.lease
        if lease is not None and not hold.released:  # the flow failed or was cancelled
            hold.released = True
            if self._direct:  # no I/O: give it back now
                self._keeper.drop(lease)
                self.state.release_lease(lease)  # type: ignore[attr-defined]
            else:  # a cancelled flow cannot wait for a round trip
                self._keeper.release_later(lease)
        with self._lock:
            if self._gates.get(hold.conversation_id) is hold:
                del self._gates[hold.conversation_id]

    def _adopter(self, hold: Hold) -> Callable[[Future[Any]], None]:
        def adopt(future: Future[Any]) -> None:
            hold.orphan = future
            future.add_done_callback(lambda f: self._orphan_done(hold, f))

        return adopt

    def _orphan_done(self, hold: Hold, future: Future[Any]) -> None:
        """A hook call that outlived its wait ended: count a late success, let go.

        Runs on the hook's thread. The watermark moves only if it still stands where the
        call began (same generation, nothing delivered since).
        """
        cid, lease = hold.conversation_id, hold.lease
        try:
            if hold.batch is not None and not future.cancelled() and future.exception() is None:
                lo, hi, generation = hold.batch
                current = self.state.get(cid)
                if (
                    current is not None
                    and current.generation == generation
                    and current.delivered == lo
                    and current.window_start >= hi
                ):
                    kwargs: dict[str, Any] = {} if lease is None else {"lease": lease}
                    late = replace(current, delivered=hi)
                    if self.state.compare_and_set(cid, current, late, **kwargs):
                        self._retry.succeeded(cid)
                        with self._tally.lock:
                            self._tally.delivered += hi - lo
        except Exception as exc:
            logger.warning("demote: recording a late delivery for %r failed: %r", cid, exc)
        finally:
            if lease is not None and not hold.released:
                hold.released = True
                self._keeper.release_later(lease)
            with self._lock:
                if self._gates.get(cid) is hold:
                    del self._gates[cid]
