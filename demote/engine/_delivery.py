"""Steps 3 and 4 of a load: the gate and lease, delivery in batches, the fenced commit.

:class:`Delivery` is the part of a :class:`~demote.engine.Demoter` that talks to the
hook and commits; the Demoter holds one. Everything is a generator of the
operations in :mod:`demote.engine._flow`, shared by the sync and async drivers. What one
hook call is handed, and what its outcome records, is :mod:`demote.engine._batches`; the
gate, the lease, the store's calls (through its breaker) and the fenced commit are its
base, :class:`~demote.engine._holding.Holding` (:mod:`demote.engine._holding`).

A *hold* is a conversation's in-process gate, and its store lease once taken. Only its
owner delivers and commits. A load waits for the hook at most ``hook_wait`` (and never
past ``hook_timeout``). A call that outlives that wait is *detached*: the load commits the
window move (the watermark stays before the batch) and returns, and a background flow (a
thread for sync loads, a task for async ones) takes the hold over, gate and lease (renewed
by the keeper), until the call ends. A success then commits the batch's watermark with the
same fenced compare-and-set, if the watermark still stands where the call began, so the
messages are not handed over again; a failure (or ``hook_timeout`` running out) leaves
them pending with backoff. A sync call interrupted by a cancelled async load is adopted
the same way.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from demote.engine._batches import Batches
from demote.engine._flow import Deliver, Outcome, Running
from demote.engine._holding import Holding
from demote.engine._runner import HookRunner
from demote.engine._views import ViewCache
from demote.engine._work import FRESH, REPLAY, UNREPLAYABLE, Detached, Hold, Tally, Work
from demote.engine.retry import RetryTracker
from demote.errors import HookTimeout
from demote.events import DemoteEvent, Observers
from demote.flow import Flow, Spawn, drive_async
from demote.records import ConversationState
from demote.state.base import StateStore

logger = logging.getLogger("demote")

#: Most conversations :attr:`Delivery.settled` remembers.
_SETTLED_KEPT = 10_000


class Delivery(Holding):
    """Gate, lease, batches, fenced commit: a Demoter's delivery part.

    How a :class:`~demote.engine.Demoter` hands what left the window to its hook and
    commits the watermark; one per Demoter. It owns the in-process gates, the leases (and
    their keeper) and the store's breaker (its base, :class:`~demote.engine._holding.Holding`,
    holds them), the hook threads, the background flows and its
    :class:`~demote.engine._batches.Batches`; the view cache, retry tracker, observers and
    tally it is given are the Demoter's, shared with its other parts.
    """

    def __init__(
        self,
        state: StateStore,
        hook: object,
        *,
        hook_timeout: float | None,
        hook_wait: float | None,
        lease_ttl: float,
        max_batch: int,
        hook_threads: int,
        hook_queue: int,
        views: ViewCache,
        retry: RetryTracker,
        observers: Observers,
        tally: Tally,
    ) -> None:
        super().__init__(state, lease_ttl)
        self.hook = hook
        self.hook_timeout = hook_timeout
        self.hook_wait = hook_wait
        self.max_batch = max_batch
        self._batches = Batches(hook, views, retry, tally)
        self._retry = retry
        self._observers = observers
        self._tally = tally
        self.runner = HookRunner(hook_threads, hook_queue)
        self.background: set[Any] = set()
        self.background_lock = threading.Lock()
        # Conversations delivered to, whose commit then failed: the next delivery asks
        # the hook what it holds (``has_keys``) before handing it anything again.
        self.unsure: set[str] = set()
        # The generation a settle left messages pending under, per conversation, until
        # the background retries take it (what their replay expects: see REPLAY).
        self.settled: dict[str, int] = {}

    def deliverable(self, cid: str, work: Work) -> bool:
        """Are messages pending, and may the hook be called for them now?"""
        return work.target.delivered < work.deliver_end and self._retry.ready(cid)

    def settle(
        self, hold: Hold, work: Work
    ) -> Flow[tuple[ConversationState | None, int, Exception | None]]:
        """With the gate (and lease) held: deliver what is pending, then commit.

        Returns the committed state (``None`` if the commit was refused), how many
        messages the hook accepted, and the hook's error, if any.
        """
        cid = hold.conversation_id
        replay = REPLAY.get()
        if replay is not None and replay.conversation_id == cid and replay.moved(work):
            yield from self.release(hold)  # a background load of a history gone stale
            return None, 0, None
        target, stored = work.target, work.stored
        delivered, end = target.delivered, work.deliver_end
        demoted = 0
        error: Exception | None = None
        if delivered < end and self.deliverable(cid, work):
            while delivered < end:
                hi = min(end, delivered + self.max_batch)
                batch = yield from self._batches.of(hold, work, delivered, hi)
                if batch.messages:
                    began = time.perf_counter()
                    sent = self._batches.sent(work, batch)
                    n, lo = end - delivered, delivered
                    detach = self._detacher(
                        hold, Detached(None, batch, lo, hi, target.generation, sent, n, began)
                    )
                    try:
                        running = yield Deliver(
                            self.hook,
                            batch,
                            self.hook_wait,
                            self.hook_timeout,
                            self.runner,
                            detach,
                        )
                    except Exception as exc:
                        error = exc
                        self._batches.failed(
                            work.events, batch, lo, hi, n, exc, time.perf_counter() - began
                        )
                        break
                    if running is not None:  # it goes on in the background (see the module doc)
                        detach(running)
                        if running.timed_out:
                            error = HookTimeout(f"hook did not finish within {self.hook_timeout} s")
                            took = time.perf_counter() - began
                            self._batches.failed(work.events, batch, lo, hi, n, error, took)
                        break
                    self._batches.accepted(
                        work.events, batch, lo, hi, sent, time.perf_counter() - began
                    )
                    demoted += len(batch.messages)
                delivered = hi
                if delivered < end:  # a backlog: make each batch's progress durable
                    step = replace(target, delivered=delivered)
                    if not (yield from self.commit(hold, stored, step, release=False)):
                        self._note_base(cid, work, None)
                        return None, demoted, None
                    stored = step
            if error is None and hold.detached is None:
                self._retry.succeeded(cid)
        final = target if delivered == target.delivered else replace(target, delivered=delivered)
        committed: ConversationState | None
        if final == (stored or FRESH):
            yield from self.release(hold)
            committed = stored or FRESH
        else:
            ok = yield from self.commit(hold, stored, final, release=True)
            committed = final if ok else None
        if committed is None or committed.delivered < end:  # left pending: retried
            self._note_base(cid, work, committed)
        if hold.detached is not None:  # the background flow takes the hold over
            hold.adopted = True
            try:
                yield Spawn(self._late(hold), self.background, self.background_lock)
            except Exception:
                hold.adopted = False  # _let_go adopts it another way
                raise
        return committed, demoted, error

    def _note_base(self, cid: str, work: Work, committed: ConversationState | None) -> None:
        """What a background load of this work's history expects to find (:data:`REPLAY`).

        The generation committed; if the commit was refused, the one planned against: a
        reset since then shows as another. A first commit refused cannot tell a
        conversation forgotten since from one never stored: it is not replayed.
        """
        stored = work.stored
        if committed is not None:
            base = committed.generation
        elif stored is not None:
            base = stored.generation
        else:  # refused from no state: forgotten since, or another's: not to replay
            base = UNREPLAYABLE
        settled = self.settled
        if len(settled) > _SETTLED_KEPT:
            settled.clear()  # (only a hint for the background retries)
        settled[cid] = base

    # -- the gate, and hook calls that outlive their wait --------------------------------------

    def take_leased(self, cid: str) -> Flow[Hold | None]:
        """The gate and, on a shared store, the lease (``None`` if either is busy)."""
        hold = self.take(cid)
        if (
            hold is None
            or not callable(getattr(self.state, "acquire_lease", None))
            or not getattr(self.state, "shared", True)
        ):
            return hold
        try:
            lease = yield from self.store_op("acquire_lease", cid, hold.holder, self.lease_ttl)
        except BaseException:  # granted, perhaps, and the reply lost: the next load frees it
            self.stranded.setdefault(cid, hold.holder)
            self.let_go(hold)  # else the gate stays taken and the conversation never moves
            raise
        if lease is None:  # another worker is delivering
            self.let_go(hold)
            return None
        hold.lease = lease
        self.keeper.hold(lease)
        return hold

    def let_go(self, hold: Hold) -> None:
        """Free the gate when a flow ends; a lease still held is released too."""
        if hold.adopted:
            return  # the background flow lets go when the running call ends
        if hold.detached is not None:  # the flow ended (cancelled, failed) before handing over
            self._adopt(hold)
            return
        self._free(hold)

    @staticmethod
    def _detacher(hold: Hold, detached: Detached) -> Callable[[Running], None]:
        """What marks the hold's call as running on past its load's wait."""

        def detach(running: Running) -> None:
            detached.running = running
            hold.detached = detached

        return detach

    def _adopt(self, hold: Hold) -> None:
        """Start the background flow of a detached call from outside a flow."""
        detached = hold.detached
        assert detached is not None and detached.running is not None
        hold.adopted = True
        call = detached.running.call
        try:
            if isinstance(call, asyncio.Future):  # we are on its loop (the flow's finally)
                task = call.get_loop().create_task(drive_async(self._late(hold)))
                with self.background_lock:
                    self.background.add(task)
                task.add_done_callback(self._background_done)
            else:
                Spawn(self._late(hold), self.background, self.background_lock).run_sync()
        except Exception as exc:  # no thread or task to be had: do not keep it busy forever
            logger.warning("demote: cannot follow a running hook call of %r: %r", hold, exc)
            hold.detached = None
            self._free(hold)

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        with self.background_lock:
            self.background.discard(task)

    def _late(self, hold: Hold, failed: bool = False) -> Flow[None]:
        """Wait for a detached call to end, commit its batch if it succeeded, let go.

        ``hook_timeout`` bounds the wait for a sync call: once it runs out, the failure is
        recorded (backoff, event), and the call, which cannot be stopped, keeps the
        conversation busy until it ends; a late success still moves the watermark.
        ``failed``: that failure was recorded already (by the flow this one took over).

        A sync call runs on in its hook thread whatever becomes of the task that follows it:
        if that task is cancelled (``asyncio.run`` cancels it when the load's event loop
        closes), a thread follows the call on, holding the conversation, instead of
        letting it go while the hook still runs (it would be handed over again, and its
        success never committed).
        """
        detached = hold.detached
        assert detached is not None and detached.running is not None
        events: list[DemoteEvent] = []
        running, batch = detached.running, detached.batch
        failed = failed or running.timed_out
        handed = False
        try:
            try:
                ended = yield Outcome(running, None if failed else running.deadline)
                if not ended:  # hook_timeout ran out; the call goes on and may still succeed
                    failed = True
                    error = HookTimeout(f"hook did not finish within {self.hook_timeout} s")
                    self._late_failed(events, detached, error)
                    yield Outcome(running, None)
            except Exception as exc:
                hold.detached = None
                if not failed:
                    self._late_failed(events, detached, exc)
                yield from self.release(hold)
                return
            except GeneratorExit:  # the task following the call was cancelled
                handed = self._follow_in_thread(hold, failed)
                raise
            hold.detached = None  # the call ended: commit and release as usual
            yield from self._late_commit(hold, detached, events)
        except Exception as exc:  # the hook may hold the batch: the next delivery asks it
            self.unsure.add(batch.conversation_id)
            self._strand(hold)
            logger.warning(
                "demote: recording a late delivery for %r failed: %r", batch.conversation_id, exc
            )
        finally:
            if not handed:
                hold.detached = None
                self._free(hold)
            self._observers.publish(events)

    def _follow_in_thread(self, hold: Hold, failed: bool) -> bool:
        """Follow a detached sync call from a thread; ``False`` if it cannot be (or is a task)."""
        detached = hold.detached
        if detached is None or detached.running is None:
            return False
        if isinstance(detached.running.call, asyncio.Future):  # cancelled with its loop
            return False
        try:
            Spawn(self._late(hold, failed), self.background, self.background_lock).run_sync()
        except Exception as exc:  # no thread to be had: let the conversation go
            logger.warning("demote: cannot follow a running hook call of %r: %r", hold, exc)
            return False
        return True

    def _late_failed(self, events: list[DemoteEvent], d: Detached, exc: Exception) -> None:
        took = time.perf_counter() - d.began
        self._batches.failed(events, d.batch, d.lo, d.hi, d.pending, exc, took)

    def _late_commit(self, hold: Hold, d: Detached, events: list[DemoteEvent]) -> Flow[None]:
        """The watermark past a batch accepted late, if it still stands where it began."""
        cid = hold.conversation_id
        current = yield from self.store_op("get", cid)
        if (
            current is not None and current.generation == d.generation and current.delivered == d.lo
        ):  # (``hi`` may pass the window start: results sent as placeholders)
            late = replace(current, delivered=d.hi)
            if (yield from self.commit(hold, current, late, release=True)):
                self._retry.succeeded(cid)
                self._batches.accepted(
                    events, d.batch, d.lo, d.hi, d.sent, time.perf_counter() - d.began
                )
                self._tally.note_pending(cid, max(0, late.window_start - late.delivered))
                return
        yield from self.release(hold)

    # -- waiting for the background flows ------------------------------------------------

    def drain(self, timeout: float | None) -> bool:
        """Wait for the background threads (of sync loads); ``True`` if none is left."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self.background_lock:
                threads = [t for t in self.background if isinstance(t, threading.Thread)]
            if not threads:
                return True
            for thread in threads:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                thread.join(left)
                if thread.is_alive():
                    return False

    async def adrain(self, timeout: float | None) -> bool:
        """Await the background tasks (of async loads), then the threads; ``True`` if idle."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self.background_lock:
                tasks = [t for t in self.background if isinstance(t, asyncio.Task)]
            if not tasks:
                break
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            _, pending = await asyncio.wait(tasks, timeout=left)
            if pending:
                return False
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return await asyncio.to_thread(self.drain, left)
