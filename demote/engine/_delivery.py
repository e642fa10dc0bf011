"""Steps 3 and 4 of a load: the gate and lease, delivery in batches, the fenced commit.

:class:`Delivery` is the part of a :class:`~demote.engine.Demoter` that talks to the
hook and commits; the Demoter holds one. Everything is a generator of the
operations in :mod:`demote.engine._flow`, shared by the sync and async drivers. What one
hook call is handed, and what its outcome records, is :mod:`demote.engine._batches`.

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
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from demote.backends.breaker import Breaker, breaker_of, is_outage
from demote.engine._batches import Batches
from demote.engine._flow import Deliver, Outcome, Running
from demote.engine._flow import store_call as _op
from demote.engine._runner import HookRunner, LeaseKeeper
from demote.engine._views import ViewCache
from demote.engine._work import FRESH, REPLAY, UNREPLAYABLE, Detached, Hold, Tally, Work
from demote.engine.retry import RetryTracker
from demote.errors import HookTimeout, StoreUnavailable
from demote.events import DemoteEvent, Observers
from demote.flow import Flow, Spawn, drive_async
from demote.records import ConversationState
from demote.state.base import Lease, StateStore

logger = logging.getLogger("demote")

#: Most conversations :attr:`Delivery.settled` remembers.
_SETTLED_KEPT = 10_000


class Delivery:
    """Gate, lease, batches, fenced commit: a Demoter's delivery part.

    How a :class:`~demote.engine.Demoter` hands what left the window to its hook and
    commits the watermark; one per Demoter. It owns the in-process gates, the leases (and
    their keeper), the store's breaker, the hook threads, the background flows and its
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
        self.state = state
        self.hook = hook
        self.hook_timeout = hook_timeout
        self.hook_wait = hook_wait
        self.lease_ttl = lease_ttl
        self.max_batch = max_batch
        self._batches = Batches(hook, views, retry, tally)
        self._retry = retry
        self._observers = observers
        self._tally = tally
        self._direct = bool(getattr(state, "nonblocking", False))
        self.breaker: Breaker = breaker_of(state)
        self.runner = HookRunner(hook_threads, hook_queue)
        self.keeper = LeaseKeeper(state, lease_ttl)
        self.lock = threading.Lock()
        self.gates: dict[str, Hold] = {}
        self.background: set[Any] = set()
        self.background_lock = threading.Lock()
        # Leases whose release may have failed, or holders whose grant was not heard of.
        self.stranded: dict[str, Lease | str] = {}
        # Conversations delivered to, whose commit then failed: the next delivery asks
        # the hook what it holds (``has_keys``) before handing it anything again.
        self.unsure: set[str] = set()
        # The generation a settle left messages pending under, per conversation, until
        # the background retries take it (what their replay expects: see REPLAY).
        self.settled: dict[str, int] = {}
        self._instance = uuid.uuid4().hex[:12]
        self._holders = itertools.count(1)

    def store_op(self, name: str, *args: Any, **kwargs: Any) -> Flow[Any]:
        """Call the state store: directly if it never blocks, else as a yielded op."""
        if self._direct:
            return getattr(self.state, name)(*args, **kwargs)
        return (yield _op(self.state, name, *args, **kwargs))

    def guarded(self, name: str, *args: Any, **kwargs: Any) -> Flow[Any]:
        """A load's store call, through the store's breaker (see :mod:`demote.backends.breaker`).

        Raises the store's error, or :class:`~demote.errors.StoreUnavailable` without
        calling it while the breaker is open (or another call is its probe).
        """
        breaker = self.breaker
        ticket = breaker.admit()
        if ticket is None:
            raise StoreUnavailable(
                f"state store skipped: it failed recently (next probe in "
                f"{breaker.retry_in():.2g} s)"
            )
        try:
            result = yield from self.store_op(name, *args, **kwargs)
        except Exception as exc:
            if is_outage(exc):
                breaker.failed(ticket)
            else:  # it answered, with something wrong for one conversation
                breaker.succeeded(ticket)
            raise
        except BaseException:  # cancelled, or the flow was closed: no answer
            breaker.abandon(ticket)
            raise
        breaker.succeeded(ticket)
        if result is None and name == "acquire_lease":  # another worker is delivering
            replay = REPLAY.get()
            if replay is not None and replay.conversation_id == args[0]:
                replay.elsewhere = True  # (a background load: theirs to deliver)
        return result

    def unstrand(self, cid: str) -> Flow[None]:
        """Release a lease an earlier load could not, before taking a new one.

        A load whose store failed while it held the lease (or while it asked for one: the
        server may have granted it and the reply been lost) leaves it to expire
        (``lease_ttl``); without this, the conversation would not be demoted again
        until then, although the store is back.
        """
        lease = self.stranded.pop(cid, None)
        if lease is None:
            return
        try:
            if isinstance(lease, Lease):
                yield from self.guarded("release_lease", lease)
            elif callable(getattr(self.state, "release_holder", None)):
                # A grant whose reply was lost: only the holder name is known.
                yield from self.guarded("release_holder", cid, lease)
        except Exception:
            self.stranded.setdefault(cid, lease)
            raise

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

    def commit(
        self, hold: Hold, stored: ConversationState | None, new: ConversationState, *, release: bool
    ) -> Flow[bool]:
        """Compare-and-set ``new``, fenced by the hold's lease (released if asked)."""
        lease = hold.lease
        kwargs: dict[str, Any] = {}
        if lease is not None:
            release = release and hold.detached is None  # a running call keeps it
            kwargs = {"lease": lease, "release": release}
        cid = hold.conversation_id
        if self._direct:
            # No I/O: check in one step that no clear or forget of this process took the
            # gate away meanwhile (without a lease, nothing else would tell).
            with self.lock:
                ok = self.gates.get(cid) is hold and self.state.compare_and_set(
                    cid, stored, new, **kwargs
                )
        else:  # a lease fences it: clear and forget revoke it in the store
            ok = yield from self.guarded("compare_and_set", cid, stored, new, **kwargs)
        if lease is not None and kwargs["release"]:
            hold.released = True
            self.keeper.drop(lease)
        if not ok:
            logger.info(
                "demote: commit for conversation %r refused (advanced or cleared elsewhere, "
                "or the lease was lost); keeping theirs",
                hold.conversation_id,
            )
        return bool(ok)

    def release(self, hold: Hold) -> Flow[None]:
        """Give the lease back now (unless a running hook call still needs it)."""
        lease = hold.lease
        if lease is None or hold.released or hold.detached is not None:
            return
        hold.released = True
        self.keeper.drop(lease)
        try:  # through the breaker: a store that is down costs no turn a timeout here
            yield from self.guarded("release_lease", lease)
        except Exception as exc:  # it expires on its own, or the next load releases it
            self.stranded[hold.conversation_id] = lease
            if not isinstance(exc, StoreUnavailable):  # (a skipped call is no news)
                logger.warning("demote: releasing the lease of %r failed: %r", lease, exc)

    # -- the gate, and hook calls that outlive their wait --------------------------------------

    def take(self, cid: str) -> Hold | None:
        """The conversation's in-process gate, if free (never waits)."""
        with self.lock:
            if cid in self.gates:
                return None
            hold = self.gates[cid] = Hold(cid, f"{self._instance}:{next(self._holders)}")
            return hold

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

    def _free(self, hold: Hold) -> None:
        lease = hold.lease
        if lease is not None and not hold.released:  # the flow failed or was cancelled
            hold.released = True
            if self._direct:  # no I/O: give it back now
                self.keeper.drop(lease)
                self.state.release_lease(lease)  # type: ignore[attr-defined]
            else:  # a cancelled flow cannot wait for a round trip
                self.keeper.release_later(lease)
        with self.lock:
            if self.gates.get(hold.conversation_id) is hold:
                del self.gates[hold.conversation_id]

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

    def _strand(self, hold: Hold) -> None:
        """Leave the hold's lease, if still out, to the next load, which releases it first.

        The keeper's release could come after that load (or fail with the store), which
        would then find the conversation held by this very process.
        """
        lease = hold.lease
        if lease is not None and not hold.released:
            hold.released = True
            self.keeper.drop(lease)
            self.stranded[hold.conversation_id] = lease

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
