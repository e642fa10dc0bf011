"""Conversations left with pending messages, retried in the background until delivered.

Theory of operation
-------------------
A load can return with messages *pending*: the hook failed, or refused a call (every hook
thread busy and the queue full), or ran past ``hook_wait`` and lost the race with the next
load, or the conversation was busy with another delivery so the load committed nothing. A
later load of the conversation retries them, but a conversation that has ended is never
loaded again: its end would never reach the long tail (the inner store still has it).

So the Demoter keeps, for each conversation whose last load left something pending, that
load's inputs (the history as it was read, ``describe``, ``reserved``, ``pruned``), and
runs the same load again in the background once the conversation may be retried: a
*background load*, the very flow of :mod:`demote.engine._loading` (gate, lease, batches,
fenced commit, degraded mode), whose window is dropped. Its outcome decides what comes
next: nothing pending, and the conversation is forgotten; still pending, and it is tried
again, after the retry backoff if the hook failed (and never sooner than 1 s, 2 s, 4 s ...
60 s, whatever ``retry`` says: a dead sink is not hammered), at least 2 s later if the
store is down (or when its breaker probes it next), or after a short pause, growing from
50 ms to 5 s, if the conversation was busy. A conversation that stays busy through ten
such pauses with no progress (its lease held by another worker, which then delivers it) is
let go to its next load.

Every load replaces its conversation's entry (or drops it, when nothing is pending), so a
background load replays the newest history this process read, never an older one than a
load already planned. ``clear``, ``forget`` and ``erase`` drop it too. Another worker may
have moved the conversation on since (a fleet shares it): a background load runs under a
:class:`~demote.engine._work.Replay`, and finding the conversation reset (another
generation, or no state) or its history taken for a rewrite (a copy far behind theirs), it
delivers and commits nothing and lets the conversation go: the one who moved it on
delivers it, and its next load reads the history afresh. It is bounded: at most ``size``
conversations (the least recently noted go first); one background load at a time, run by
one daemon thread that exists only while there are entries and exits when its Demoter is
garbage-collected; an entry noted by an async load is retried as a task on that load's
event loop while the loop runs, so a hook or store bound to the loop is used from it. It
is observable: :meth:`~demote.Demoter.stats` counts the conversations retried
(``retrying``), the background loads run (``retries``), and the conversations let go
(``untracked``); the background loads' events reach the observers like any load's.

:meth:`Retries.drain` does the same at once, for every entry, from the caller (``drain``
and ``adrain`` at shutdown): each conversation is tried once whatever its backoff, and
again while that helps (a delivery that outlived ``hook_wait`` ended, another was busy).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from demote.engine._delivery import Delivery
from demote.engine._loading import Loader
from demote.engine._work import REPLAY, Replay, Tally
from demote.engine.result import Window
from demote.engine.retry import Backoff, RetryTracker
from demote.errors import HookError, StoreError
from demote.flow import Flow, drive_async, drive_sync
from demote.records import MessageRecord

__all__ = ["Retries"]

logger = logging.getLogger("demote")

T = TypeVar("T")

#: The least a failing conversation waits between background loads (by failures in a row).
FLOOR = Backoff(1.0, 60.0)
#: The pause before a busy conversation is tried again: first, and at most.
BUSY_FIRST, BUSY_MOST = 0.05, 5.0
#: The pause before a conversation whose store was down is tried again (at least).
DOWN_PAUSE = 2.0
#: Background loads of a busy conversation, with no progress, before it is let go.
STALLS_KEPT = 10
#: How long a background load handed to an event loop may take before the thread looks again.
LOOP_PATIENCE = 30.0


@dataclass(slots=True, eq=False)
class Pending:
    """A conversation's last load that left messages pending: what to load again, and when."""

    messages: Sequence[Any]
    describe: Callable[[Any], MessageRecord]
    reserved: int
    pruned: range
    loop: asyncio.AbstractEventLoop | None
    fixed: int | None = None
    due: float = 0.0
    seq: int = 0
    stalls: int = 0
    delivered: int = -1  # the watermark the last background load left
    generation: int | None = None  # what its replay expects (Replay.generation)


class Retries:
    """Background loads of the conversations left with pending messages (one per Demoter)."""

    def __init__(
        self, loader: Loader, delivery: Delivery, retry: RetryTracker, tally: Tally, size: int
    ) -> None:
        self._loader = loader
        self._delivery = delivery
        self._retry = retry
        self._tally = tally
        self.size = size
        self._entries: OrderedDict[str, Pending] = OrderedDict()
        self._heap: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._paused = 0  # drains running: the thread starts nothing meanwhile
        self._active = False  # the thread is running a background load

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, conversation_id: object) -> bool:
        return conversation_id in self._entries

    # -- what loads tell it ----------------------------------------------------------------

    def load(
        self,
        cid: str,
        messages: Sequence[T],
        describe: Callable[[T], MessageRecord],
        reserved: int,
        pruned: range,
        fixed: int | None = None,
    ) -> Flow[Window[T]]:
        """A load (:meth:`demote.Demoter.load`) that hands what it leaves pending to us."""
        try:
            window = yield from self._loader.flow(cid, messages, describe, reserved, pruned, fixed)
        except (HookError, StoreError):  # raised as configured: what was pending still is
            self.note(cid, True, messages, describe, reserved, pruned, fixed)
            raise
        if (window.pending or cid in self._entries) and not self._loader.stale_copy(
            cid, messages, describe
        ):  # (a stale copy's window says nothing of what its replay could deliver)
            self.note(cid, window.pending > 0, messages, describe, reserved, pruned, fixed)
        return window

    def note(
        self,
        cid: str,
        pending: bool,
        messages: Sequence[Any],
        describe: Callable[[Any], MessageRecord],
        reserved: int,
        pruned: range,
        fixed: int | None = None,
    ) -> None:
        """After a load of ``cid``: keep it for a background load if ``pending``, else drop it.

        A load made on a running event loop (an async load) is retried on that loop.
        """
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # a sync load on a thread of its own
            loop = None
        with self._cond:
            if not pending:
                self._entries.pop(cid, None)
                return
            old = self._entries.pop(cid, None)
            entry = Pending(messages, describe, reserved, pruned, loop, fixed)
            entry.generation = self._delivery.settled.pop(cid, None)
            if old is not None:  # a newer load of it: its progress so far carries over
                entry.stalls, entry.delivered = old.stalls, old.delivered
                if entry.generation is None:  # (this load did not settle: as before)
                    entry.generation = old.generation
            self._entries[cid] = entry
            self._schedule(cid, entry, self._pause(cid, entry))
            while len(self._entries) > self.size:  # the least recently noted go first
                gone, _ = self._entries.popitem(last=False)
                self._let_go(gone, "over the bound of cached_conversations")
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=_run, args=(weakref.ref(self), self._cond), name="demote-retry"
                )
                self._thread.daemon = True
                self._thread.start()
            self._cond.notify()

    def drop(self, cid: str) -> None:
        """Forget ``cid`` (it was cleared, forgotten or erased)."""
        with self._cond:
            self._entries.pop(cid, None)

    def close(self) -> None:
        """Stop the thread (entries stay, for the conversations' next loads; idempotent)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- one background load ---------------------------------------------------------------

    def attempt(self, cid: str, entry: Pending) -> Flow[bool]:
        """Load ``cid`` again from ``entry``; ``True`` when nothing is left to retry.

        The load runs under a :class:`~demote.engine._work.Replay`: if the conversation
        was reset or re-synced since ``entry``'s history was read (by another worker: this
        process drops the entry when it does either), it delivers and commits nothing, and
        the entry is dropped: the conversation's next load reads the history afresh.
        """
        window: Window[Any] | None = None
        replay = Replay(cid, entry.generation)
        outer = REPLAY.get()
        REPLAY.set(replay)
        try:
            window = yield from self._loader.flow(
                cid, entry.messages, entry.describe, entry.reserved, entry.pruned, entry.fixed
            )
        except (HookError, StoreError) as exc:  # raised as configured: still pending
            logger.info("demote: background load of %r: %r", cid, exc)
        except Exception as exc:  # anything else is not a retry's to fix: the next load's
            logger.warning(
                "demote: background load of %r failed; left to its next load: %r", cid, exc
            )
            self._settle(cid, entry, None, done=True)
            return True
        finally:
            REPLAY.set(outer)
            with self._tally.lock:  # counted as a retry, not as a load served
                self._tally.loads -= 1
                self._tally.retries += 1
                if window is not None and window.degraded:
                    self._tally.degraded -= 1
        if replay.moved_on or replay.elsewhere:  # theirs, or read afresh by its next load
            self._settle(cid, entry, window, done=True)
            why = "another worker delivers it" if replay.elsewhere else "reset elsewhere"
            self._let_go(cid, why)
            return True
        done = window is not None and not window.pending
        self._settle(cid, entry, window, done=done)
        return done

    def _settle(self, cid: str, entry: Pending, window: Window[Any] | None, *, done: bool) -> None:
        """Forget ``entry`` when done, else schedule its next background load."""
        with self._cond:
            if self._entries.get(cid) is not entry:
                return  # a newer load replaced it, or it was dropped meanwhile
            if done:
                del self._entries[cid]
                return
            if window is not None and not window.degraded and not self._retry.failures(cid):
                progress = window.delivered > entry.delivered
                entry.delivered = max(entry.delivered, window.delivered)
                entry.stalls = 0 if progress else entry.stalls + 1
                if entry.stalls > STALLS_KEPT:  # busy elsewhere all along: theirs to deliver
                    del self._entries[cid]
                    self._let_go(cid, "busy with another delivery, no progress")
                    return
            self._schedule(cid, entry, self._pause(cid, entry, window))
            self._cond.notify()

    def _pause(self, cid: str, entry: Pending, window: Window[Any] | None = None) -> float:
        """Seconds until ``cid`` may be loaded again in the background."""
        failures = self._retry.failures(cid)
        if failures:  # the hook failed: its backoff, and never sooner than FLOOR's
            return max(self._retry.wait(cid), FLOOR.delay(failures))
        if window is not None and window.degraded:  # the store is down: after its probe
            return max(DOWN_PAUSE, self._delivery.breaker.retry_in())
        return min(BUSY_MOST, BUSY_FIRST * 2.0**entry.stalls)

    def _schedule(self, cid: str, entry: Pending, pause: float) -> None:
        entry.due = time.monotonic() + pause
        entry.seq = next(self._seq)
        heapq.heappush(self._heap, (entry.due, entry.seq, cid))
        if len(self._heap) > 4 * len(self._entries) + 64:  # drop what was replaced
            self._heap = [(e.due, e.seq, c) for c, e in self._entries.items()]
            heapq.heapify(self._heap)

    def _let_go(self, cid: str, why: str) -> None:
        with self._tally.lock:
            self._tally.untracked += 1
        logger.info("demote: %r is left to its next load (%s)", cid, why)

    # -- the thread ------------------------------------------------------------------------

    def _next(self) -> tuple[str, Pending] | float | None:
        """The entry due now, or seconds until one is, or ``None`` when there is none."""
        heap = self._heap
        while heap:
            due, seq, cid = heap[0]
            entry = self._entries.get(cid)
            if entry is None or entry.seq != seq:
                heapq.heappop(heap)
                continue
            wait = due - time.monotonic()
            if wait > 0:
                return wait
            heapq.heappop(heap)
            entry.seq = -1  # taken: not scheduled until the load settles it
            return cid, entry
        return None

    def _run_one(self, cid: str, entry: Pending) -> None:
        """One background load: on its event loop while that runs, else on this thread."""
        loop = entry.loop
        if loop is not None and loop.is_running():
            with self._cond:  # the thread looks again if the loop never runs it
                self._schedule(cid, entry, LOOP_PATIENCE)
            try:
                handed = asyncio.run_coroutine_threadsafe(self._on_loop(cid, entry), loop)
            except RuntimeError:  # closed meanwhile
                entry.loop = None
            else:
                handed.add_done_callback(_log_failure)
                return
        try:
            drive_sync(self.attempt(cid, entry))
        except Exception as exc:  # pragma: no cover - attempt handles what a load raises
            logger.warning("demote: background load of %r failed: %r", cid, exc)

    async def _on_loop(self, cid: str, entry: Pending) -> None:
        task = asyncio.current_task()
        delivery = self._delivery
        with delivery.background_lock:
            delivery.background.add(task)
        try:
            await drive_async(self.attempt(cid, entry))
        finally:
            with delivery.background_lock:
                delivery.background.discard(task)

    # -- drain -----------------------------------------------------------------------------

    def drain(self, timeout: float | None) -> Flow[bool]:
        """Deliver what is pending now: ``True`` if nothing is left pending or running.

        Every conversation with pending messages is loaded once, at once, whatever its
        backoff; background work (late hook calls, summaries, the retry thread's load) is
        waited for, and what is still pending and may be retried is loaded again, round
        after round, for as long as a round delivers something or leaves background work
        to wait for. A hook that keeps failing is tried once, not until ``timeout``: the
        result then says what is left, and the retries go on in the background.
        ``timeout`` (``None``: no bound) bounds the whole.
        """
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        with self._cond:
            self._paused += 1
        try:
            if not (yield Idle(self, left())):  # the thread's own background load
                return False
            first = True
            while True:
                if not (yield Idle(self, left(), self._delivery)):
                    return False
                with self._cond:
                    todo = list(self._entries.items())
                if not todo:
                    return True
                done = 0
                for cid, entry in todo:
                    if deadline is not None and time.monotonic() >= deadline:
                        return False
                    if first:
                        self._retry.succeeded(cid)  # at once, whatever its backoff
                    elif not self._retry.ready(cid):
                        continue  # it failed in this drain: once is enough
                    done += yield from self.attempt(cid, entry)
                first = False
                if not (done or self._delivery.background):
                    return not self._entries  # a round that changed nothing: what is, is
        finally:
            with self._cond:
                self._paused -= 1
                self._cond.notify_all()


@dataclass(slots=True)
class Idle:
    """Wait, up to ``timeout``, for the retry thread's load (or ``delivery``'s flows).

    The result is ``True`` if all of it ended.
    """

    retries: Retries
    timeout: float | None
    delivery: Delivery | None = None

    def _thread_idle(self) -> bool:
        r = self.retries
        with r._cond:
            return r._cond.wait_for(lambda: not r._active, self.timeout)

    def run_sync(self) -> bool:
        """Block until idle (background threads of sync loads)."""
        if self.delivery is not None:
            return self.delivery.drain(self.timeout)
        return self._thread_idle()

    async def run_async(self) -> bool:
        """Await background tasks and threads; the thread's load from a worker thread."""
        if self.delivery is not None:
            return await self.delivery.adrain(self.timeout)
        return await asyncio.to_thread(self._thread_idle)


def _run(ref: weakref.ref[Retries], cond: threading.Condition) -> None:
    """The retry thread: background loads as they fall due, until none is left."""
    while True:
        with cond:
            retries = ref()
            if retries is None or retries._closed:
                return
            nxt = None if retries._paused else retries._next()
            if nxt is None and not retries._entries:
                retries._thread = None
                return
            if not isinstance(nxt, tuple):
                del retries  # (waits without holding its Demoter alive)
                cond.wait(1.0 if nxt is None else min(nxt, 1.0))
                continue
            retries._active = True
        try:
            retries._run_one(*nxt)
        finally:
            with cond:
                retries._active = False
                cond.notify_all()
            del retries


def _log_failure(future: Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:  # pragma: no cover
        logger.warning("demote: background load failed: %r", future.exception())
