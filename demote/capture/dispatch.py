"""The Recorder's decisions, written once for the thread and the asyncio worker.

:class:`Dispatcher` is sans-I/O: no threads, no locks, no clocks (``now`` is passed in),
no sink and no SQLite. A driver (a thread in :class:`~demote.capture.Recorder`, an asyncio
task in :class:`~demote.capture.AsyncRecorder`) loops::

    step = dispatcher.next_step(now)
    Wait(timeout)  -> sleep up to ``timeout``, or until an enqueue wakes it
    Deliver(env)   -> call the sink; hand the outcome to settle() and act on the Decision
    None           -> stop

``enqueue`` hands each item to :meth:`Dispatcher.receive` at once (under the Recorder's
lock), so the dispatcher holds every item not yet delivered, and :meth:`Dispatcher.erase`
can take a conversation's items out before the worker reaches them.

The dispatcher keeps the order (items ready in arrival order, due retries first), the
backoff schedule, the stop rule (STOP drains what was queued before it; retries still
waiting stay in the outbox), the item in flight, and the counters behind
:class:`RecorderStats`.
"""

from __future__ import annotations

import enum
import heapq
import itertools
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Final

from demote._validate import count, seconds
from demote.errors import ConfigError
from demote.records import storable_text

__all__ = [
    "STOP",
    "Decision",
    "Deliver",
    "Dispatcher",
    "Envelope",
    "RecorderStats",
    "RetryPolicy",
    "Verdict",
    "Wait",
    "describe_error",
]


#: The longest error text kept per failed item (logged and stored in the outbox).
MAX_ERROR_CHARS = 2_000


def describe_error(error: BaseException) -> str:
    """``"Type: message"`` for a sink's failure, as an outbox can store it; never raises.

    A sink's exception is arbitrary: its ``str`` may raise, be megabytes long, or hold a
    lone surrogate (which SQLite cannot store): none of that may stop the worker.
    """
    try:
        text = f"{type(error).__name__}: {error}"
    except Exception:  # a broken __str__
        text = f"{type(error).__name__}: <unprintable error>"
    return storable_text(text[:MAX_ERROR_CHARS])


class _Stop:
    """Type of the :data:`STOP` sentinel."""

    def __repr__(self) -> str:
        return "STOP"


STOP: Final = _Stop()
"""Pushed by ``close`` behind everything queued before it: the worker stops on reaching it."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How an outbox retries a failed item: exponential backoff, then the dead letters.

    Attributes:
        max_attempts: Deliveries tried before the item is dead-lettered (>= 1).
        base_delay: Seconds before the first retry; doubled after every failure.
        max_delay: Upper bound on one backoff delay, in seconds.
    """

    max_attempts: int = 5
    base_delay: float = 0.5
    max_delay: float = 60.0

    def __post_init__(self) -> None:
        # NaN passed the old ``<`` checks: max_delay=nan then killed the worker thread at
        # the first failure, max_attempts=nan never dead-lettered.
        count("RetryPolicy.max_attempts", self.max_attempts)
        base = seconds("RetryPolicy.base_delay", self.base_delay, zero=True)
        top = seconds("RetryPolicy.max_delay", self.max_delay, zero=True)
        if top < base:
            raise ConfigError(
                f"RetryPolicy: need base_delay <= max_delay, got base_delay={base:g}, "
                f"max_delay={top:g}"
            )

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failed attempt (1-based)."""
        # The exponent is capped: 2 ** 2e9 would take the worker minutes to compute.
        return float(min(self.max_delay, self.base_delay * 2 ** min(max(0, failures - 1), 60)))


@dataclass(frozen=True, slots=True)
class Envelope:
    """One queued item with its bookkeeping.

    Attributes:
        key: Dedup key (see :func:`~demote.capture.codec.dedup_key`).
        item: The item as the sink will receive it.
        row: Outbox row id, or ``None`` without an outbox.
        attempts: Failed deliveries so far.
        conversation: The item's conversation (``None``: a plain value).
    """

    key: str
    item: Any
    row: int | None = None
    attempts: int = 0
    conversation: str | None = None


@dataclass(frozen=True, slots=True)
class RecorderStats:
    """Counters of one Recorder.

    Right after close, ``queued == delivered + failed + erased + abandoned`` (an item still
    in the sink when a timed-out close gave up counts as abandoned, even if it finishes
    later).

    Attributes:
        queued: Items accepted (including outbox leftovers from a previous process).
        delivered: Items the sink accepted.
        failed: Items given up on (dropped without an outbox, dead-lettered with one).
        dropped: Enqueues ignored: blank content, or after close.
        retried: Failed attempts that were scheduled for another try (outbox only).
        abandoned: Items not finished when close gave up (lost without an outbox, left in
            it with one).
        erased: Items whose conversation was erased before they were delivered.
    """

    queued: int = 0
    delivered: int = 0
    failed: int = 0
    dropped: int = 0
    retried: int = 0
    abandoned: int = 0
    erased: int = 0


class Verdict(enum.Enum):
    """What to do with an item after one delivery attempt."""

    ACK = "ack"  # delivered: forget it (delete the outbox row)
    RETRY = "retry"  # failed, attempts left: keep it, try again after a backoff
    BURY = "bury"  # failed for the last time: move it to the dead letters
    DROP = "drop"  # failed, no outbox: count it failed and forget it
    ERASED = "erased"  # failed, and its conversation was erased meanwhile: forget it


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of :meth:`Dispatcher.settle`, for the driver to act on."""

    verdict: Verdict
    envelope: Envelope
    error: str | None = None
    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class Deliver:
    """Step: give this envelope's item to the sink."""

    envelope: Envelope


@dataclass(frozen=True, slots=True)
class Wait:
    """Step: block on the queue for up to ``timeout`` seconds (``None``: no limit)."""

    timeout: float | None


class Dispatcher:
    """Per-item decisions of a Recorder, free of I/O.

    Args:
        retry: The retry policy when items are durable (an outbox); ``None`` means a failed
            item is dropped.
    """

    def __init__(self, retry: RetryPolicy | None = None) -> None:
        self._retry = retry
        self._ready: deque[Envelope] = deque()
        self._later: list[tuple[float, int, Envelope]] = []
        self._tiebreak = itertools.count()
        self._stopping = False
        self._abandoned = False
        self._stats = RecorderStats()
        self._flight: Envelope | None = None
        self._flight_erased = False

    @property
    def stats(self) -> RecorderStats:
        """A snapshot of the counters."""
        return self._stats

    @property
    def unfinished(self) -> int:
        """Items accepted but neither delivered nor given up (in flight included)."""
        s = self._stats
        return s.queued - s.delivered - s.failed - s.erased

    def accepted(self) -> None:
        """Count an item accepted for delivery (it is on its way to :meth:`receive`)."""
        self._stats = replace(self._stats, queued=self._stats.queued + 1)

    def dropped(self) -> None:
        """Count an ignored enqueue (blank, or after close)."""
        self._stats = replace(self._stats, dropped=self._stats.dropped + 1)

    def receive(self, message: Envelope | _Stop) -> None:
        """Take what the driver's queue produced: an envelope, or :data:`STOP`."""
        if isinstance(message, _Stop):
            self._stopping = True
        else:
            self._ready.append(message)

    def next_step(self, now: float) -> Deliver | Wait | None:
        """What the driver does next; ``None`` means the worker is done."""
        if self._abandoned:
            return None
        if self._later and self._later[0][0] <= now:
            return self._start(heapq.heappop(self._later)[2])
        if self._ready:
            return self._start(self._ready.popleft())
        if self._stopping:
            # Everything queued before STOP is done; retries still in backoff are durable
            # (only an outbox retries) and the next start delivers them.
            return None
        return Wait(self._later[0][0] - now if self._later else None)

    def _start(self, envelope: Envelope) -> Deliver:
        self._flight, self._flight_erased = envelope, False
        return Deliver(envelope)

    def delivering(self, conversation: str) -> bool:
        """Is an item of ``conversation`` in the sink right now?"""
        return self._flight is not None and self._flight.conversation == conversation

    def erase(self, conversation: str) -> int:
        """Take the conversation's waiting items out (retries included); how many.

        The item in flight, if it is the conversation's, is not retried should it fail.
        """
        before = len(self._ready) + len(self._later)
        self._ready = deque(e for e in self._ready if e.conversation != conversation)
        self._later = [entry for entry in self._later if entry[2].conversation != conversation]
        heapq.heapify(self._later)
        removed = before - len(self._ready) - len(self._later)
        if self.delivering(conversation):
            self._flight_erased = True
        self._stats = replace(self._stats, erased=self._stats.erased + removed)
        return removed

    def settle(self, envelope: Envelope, error: BaseException | None, now: float) -> Decision:
        """Record the outcome of one delivery attempt and say what to do about it."""
        erased = envelope is self._flight and self._flight_erased
        if envelope is self._flight:
            self._flight = None
        s = self._stats
        if error is None:
            self._stats = replace(s, delivered=s.delivered + 1)
            return Decision(Verdict.ACK, envelope)
        reason = describe_error(error)
        if erased:
            self._stats = replace(s, erased=s.erased + 1)
            return Decision(Verdict.ERASED, envelope, reason)
        if self._retry is None:
            self._stats = replace(s, failed=s.failed + 1)
            return Decision(Verdict.DROP, envelope, reason)
        failed = replace(envelope, attempts=envelope.attempts + 1)
        if failed.attempts >= self._retry.max_attempts:
            self._stats = replace(s, failed=s.failed + 1)
            return Decision(Verdict.BURY, failed, reason)
        delay = self._retry.delay(failed.attempts)
        heapq.heappush(self._later, (now + delay, next(self._tiebreak), failed))
        self._stats = replace(s, retried=s.retried + 1)
        return Decision(Verdict.RETRY, failed, reason, delay)

    def abandon(self) -> int:
        """Stop after the item in flight; returns (and counts) the unfinished items."""
        if not self._abandoned:
            self._abandoned = True
        left = self.unfinished
        self._stats = replace(self._stats, abandoned=left)
        return left
