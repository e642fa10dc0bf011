"""The engine's own threads: sync hook calls with a deadline, and lease renewal.

:class:`HookRunner` runs sync hook calls that must not block their caller past
``hook_timeout`` (or must not block an event loop). Its threads are the engine's own, not
the loop's default executor, so a hung sink cannot starve the application's
``asyncio.to_thread`` calls; they are daemon threads, so a hung sink cannot keep the
process from exiting. With every thread busy, a call waits in a bounded queue
(``hook_queue``) for the next free one: more application threads than hook threads is a
busy hook, not a broken one, and its calls are taken in turn. A call that has not started
by its deadline (``hook_timeout``) is withdrawn (:meth:`HookRunner.withdraw`: it never
reaches the hook), and with the queue full a call is refused at once: both are
:class:`~demote.errors.HookBusy`, and their messages stay pending (a hung sink holds every
thread and fills the queue; nothing waits on it without bound).

:class:`LeaseKeeper` renews, from one daemon thread, every lease its Demoter holds, every
third of the lease's time to live: a hook slower than ``lease_ttl`` keeps its exclusion,
and a worker that stops (killed, paused) loses it once the TTL runs out. A renewal that
fails marks the lease lost; the fenced commit would be refused anyway. It also releases the
leases of flows that were cancelled, which cannot wait for a store round trip themselves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from queue import SimpleQueue
from typing import Any

from demote.errors import HookBusy
from demote.state.base import Lease

__all__ = ["HookRunner", "LeaseKeeper"]

logger = logging.getLogger("demote")

_Job = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]


class HookRunner:
    """Up to ``size`` daemon threads for sync hook calls, and ``queue`` calls waiting."""

    def __init__(self, size: int, queue: int = 0) -> None:
        self.size = size
        self.queue = queue
        self._jobs: SimpleQueue[_Job | None] = SimpleQueue()
        self._lock = threading.Lock()
        self._running = 0  # calls on a thread now
        self._waiting = 0  # calls queued for a thread (not withdrawn)
        self._threads: list[threading.Thread] = []

    @property
    def busy(self) -> int:
        """Calls running now."""
        return self._running

    @property
    def queued(self) -> int:
        """Calls waiting for a free thread."""
        return self._waiting

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Start ``fn(*args)`` on a runner thread, or queue it for the next free one.

        Raises:
            HookBusy: Every thread is busy and ``queue`` calls wait already.
        """
        with self._lock:
            if self._running + self._waiting >= self.size + self.queue:
                waiting = f" and {self.queue} calls wait for them" if self.queue else ""
                raise HookBusy(
                    f"all {self.size} hook threads are busy{waiting}; the messages stay pending"
                )
            self._waiting += 1
            if len(self._threads) < min(self.size, self._running + self._waiting):
                thread = threading.Thread(target=self._work, name="demote-hook", daemon=True)
                self._threads.append(thread)
                thread.start()
        future: Future[Any] = Future()
        future.add_done_callback(self._settled)
        self._jobs.put((future, fn, args))
        return future

    def withdraw(self, future: Future[Any]) -> bool:
        """Take back a call still queued (it never reaches the hook); ``False`` if it started."""
        return future.cancel()

    def _settled(self, future: Future[Any]) -> None:
        if future.cancelled():  # withdrawn while queued: a cancelled call never ran
            with self._lock:
                self._waiting -= 1

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, fn, args = job
            if not future.set_running_or_notify_cancel():
                continue  # withdrawn (counted then)
            with self._lock:
                self._waiting -= 1
                self._running += 1
            try:
                try:
                    result = fn(*args)
                except BaseException as exc:  # handed to whoever waits
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            finally:
                with self._lock:
                    self._running -= 1
                # An idle thread holds nothing: a failed call's error carries the frames
                # of the load that waited for it (its Demoter, its history) in its traceback.
                job = future = result = None  # type: ignore[assignment]

    def close(self) -> None:
        """Let idle threads exit (running calls finish on their own; idempotent)."""
        with self._lock:
            threads, self._threads = self._threads, []
        for _ in threads:
            self._jobs.put(None)


class LeaseKeeper:
    """Renews a Demoter's held leases from one daemon thread (started on first use)."""

    def __init__(self, store: object, ttl: float) -> None:
        self.store = store
        self.ttl = ttl
        self._cond = threading.Condition()
        self._held: dict[int, tuple[Lease, float]] = {}  # token -> lease, last renewed
        self._lost: set[int] = set()
        self._to_release: list[Lease] = []
        self._thread: threading.Thread | None = None
        self._closed = False

    def hold(self, lease: Lease) -> None:
        """Keep ``lease`` renewed until :meth:`drop`.

        Cheap (most deliveries end long before a renewal is due): the thread, once
        started, wakes every third of the TTL on its own and needs no notice.
        """
        with self._cond:
            self._held[lease.token] = (lease, time.monotonic())
            if self._thread is None:
                self._start()

    def drop(self, lease: Lease) -> None:
        """Stop renewing ``lease`` (it was released, or committed with release)."""
        with self._cond:
            self._held.pop(lease.token, None)
            self._lost.discard(lease.token)

    def lost(self, lease: Lease) -> bool:
        """Did a renewal of ``lease`` fail (it expired or was revoked)?"""
        return lease.token in self._lost

    def release_later(self, lease: Lease) -> None:
        """Stop renewing ``lease`` and release it from the keeper thread."""
        with self._cond:
            self._held.pop(lease.token, None)
            self._lost.discard(lease.token)
            self._to_release.append(lease)
            self._start()
            self._cond.notify()

    def _start(self) -> None:
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(
                target=self._run, name="demote-lease-keeper", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        every = self.ttl / 3
        while True:
            with self._cond:
                if not self._to_release and not self._closed:
                    self._cond.wait(every)
                if self._closed:
                    return
                releases, self._to_release = self._to_release, []
                now = time.monotonic()
                due = [lease for lease, at in self._held.values() if now - at >= every * 0.9]
            for lease in releases:
                self._call("release_lease", lease)
            for lease in due:
                renewed = self._call("renew_lease", lease, self.ttl)
                with self._cond:
                    if lease.token not in self._held:
                        continue  # dropped meanwhile
                    if renewed:
                        self._held[lease.token] = (lease, time.monotonic())
                    elif renewed is not None:  # refused: expired or revoked
                        self._held.pop(lease.token, None)
                        self._lost.add(lease.token)
                        logger.warning(
                            "demote: lost the delivery lease of conversation %r "
                            "(expired or revoked); its commit will be refused",
                            lease.conversation_id,
                        )
                    # None: the store did not answer; try again on the next tick

    def _call(self, name: str, *args: Any) -> bool | None:
        """Call the store; its answer, or ``None`` if it failed (logged)."""
        method = getattr(self.store, name, None)
        if method is None:
            return True
        try:
            return bool(method(*args)) if name == "renew_lease" else not method(*args)
        except Exception as exc:
            logger.warning(
                "demote: %s of conversation %r failed: %r", name, args[0].conversation_id, exc
            )
            return None

    def close(self) -> None:
        """Stop the thread (held leases are left to expire; idempotent)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
