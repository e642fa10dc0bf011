"""Retrying a hook that failed: per-conversation exponential backoff.

When a hook fails, the messages that left the window stay *pending*: the window moves on
(it always obeys the policy's bound), the watermark stays behind them, and a later load
delivers them. :class:`Backoff` says how much later, so a dead sink is not called on every
turn of every conversation: after the ``n``-th failure in a row a conversation waits
``min(maximum, initial * 2 ** (n - 1))`` seconds before its next attempt, and one warning
is logged per attempt (so once per backoff period, not per turn).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from demote._validate import seconds
from demote.errors import ConfigError

__all__ = ["Backoff", "RetryTracker"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long a conversation whose hook failed waits before the next delivery attempt.

    Attributes:
        initial: Seconds after the first failure (``0`` retries on the next load).
        maximum: Upper bound on one wait, in seconds.
    """

    initial: float = 1.0
    maximum: float = 60.0

    def __post_init__(self) -> None:
        initial = seconds("Backoff.initial", self.initial, zero=True)
        maximum = seconds("Backoff.maximum", self.maximum, zero=True)
        if maximum < initial:
            raise ConfigError(f"Backoff: maximum ({maximum}) must be >= initial ({initial})")

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failure in a row (1-based)."""
        if failures <= 0:
            return 0.0
        return float(min(self.maximum, self.initial * 2 ** min(failures - 1, 60)))


class RetryTracker:
    """Failures in a row and the next allowed attempt, per conversation (bounded)."""

    def __init__(
        self, backoff: Backoff, *, size: int = 10_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.backoff = backoff
        self._clock = clock
        self._size = size
        self._due: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self._lock = threading.Lock()

    def ready(self, conversation_id: str) -> bool:
        """May the conversation's hook be called now?"""
        due = self._due.get(conversation_id)
        return due is None or self._clock() >= due[1]

    def failures(self, conversation_id: str) -> int:
        """Failures in a row so far (0 when the last attempt succeeded)."""
        due = self._due.get(conversation_id)
        return 0 if due is None else due[0]

    def wait(self, conversation_id: str) -> float:
        """Seconds until the next attempt may run (0: now)."""
        due = self._due.get(conversation_id)
        return 0.0 if due is None else max(0.0, due[1] - self._clock())

    def failed(self, conversation_id: str) -> float:
        """Record a failure; the seconds until the next attempt."""
        with self._lock:
            failures = self.failures(conversation_id) + 1
            wait = self.backoff.delay(failures)
            self._due[conversation_id] = (failures, self._clock() + wait)
            self._due.move_to_end(conversation_id)
            if len(self._due) > self._size:  # forgetting one only makes it retry sooner
                self._due.popitem(last=False)
            return wait

    def succeeded(self, conversation_id: str) -> None:
        """Record a success (or a reset): the next attempt may come at once."""
        if conversation_id in self._due:
            with self._lock:
                self._due.pop(conversation_id, None)
