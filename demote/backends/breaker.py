"""Circuit breakers for store clients: fail fast while a store is down, probe it back.

Theory of operation
-------------------
Every store object the engine talks to has one :class:`Breaker` (:func:`breaker_of`),
shared by every :class:`~demote.Demoter`, thread and event loop that uses that object.

- **Closed** (the normal state): every call goes through.
- The first failure **opens** it for a *probe interval*. While it is open, calls are
  skipped at once (:class:`~demote.errors.StoreUnavailable`, without touching the store),
  so a store that is down costs a turn microseconds instead of a timeout, and the store
  is not hammered while it restarts.
- When the interval is over, exactly one call is let through as the **probe** (across
  threads and tasks: the others keep being skipped while it runs). Its success closes
  the breaker; its failure opens it again for ``factor`` times the interval, up to
  ``cap``. Every interval is jittered by up to ``jitter`` either way, so that many
  processes watching one store do not probe it in step.

Defaults: 0.1 s, doubling, at most 0.5 s, +-20 %. The cap is what bounds recovery: once
the store is back, the next probe (at most ``cap * (1 + jitter)`` = 0.6 s later, on the
next call) finds it, and the breaker closes. A probe costs its caller at most the store
client's own timeout (0.5 s by default for Redis and PostgreSQL).

Only the probe's answer moves the breaker once it is open: calls that were already in
flight when it opened fail (or succeed) without lengthening the interval or closing it.
A probe whose caller went away without an answer (an async task cancelled mid-call) is
given up with :meth:`Breaker.abandon`; one that never reports is replaced after
``probe_timeout``.

The breaker has no I/O and no threads: a lock and a clock. Its state is read without
the lock on the closed fast path, which is one attribute read per store call.
"""

from __future__ import annotations

import contextlib
import math
import random
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from demote._validate import seconds
from demote.errors import ArgumentTypeError, ConfigError, StoreUnavailable

__all__ = ["Breaker", "Pass", "Throttle", "breaker_of", "is_outage", "use_breaker"]

#: The jitter's own generator: retries never draw from (or disturb) the global ``random``
#: state an application may have seeded.
_JITTER = random.Random()

# Backend exceptions that mean "unreachable or out of time", by class name, so that no
# backend needs importing: redis-py's ConnectionError and TimeoutError, psycopg's
# OperationalError (connection failures, cancelled statements) and PoolTimeout, sqlite3's
# OperationalError (locked, disk full), and the builtins' (OSError, TimeoutError).
_OUTAGE_NAMES = frozenset(
    {"ConnectionError", "TimeoutError", "OperationalError", "PoolTimeout", "InterfaceError"}
)


def is_outage(error: BaseException) -> bool:
    """Does ``error`` say the store is unreachable or too slow (not that its data is bad)?

    A store that answers with something it cannot decode, or a script that refuses a
    key of the wrong type, is up: that is one conversation's problem, and must not make
    every conversation on the store skip it. The error's causes are looked at too (the
    stores translate backend errors into :class:`~demote.errors.StoreError` ``from``
    them).
    """
    seen = 0
    current: BaseException | None = error
    while current is not None and seen < 8:
        if isinstance(current, OSError | TimeoutError | StoreUnavailable):
            return True
        if any(c.__name__ in _OUTAGE_NAMES for c in type(current).__mro__):
            return True
        current = current.__cause__ or current.__context__
        seen += 1
    return False


def _number(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) or math.isfinite(value)


@dataclass(frozen=True, slots=True)
class Pass:
    """Leave to make one call: report its outcome to the breaker that gave it.

    Attributes:
        epoch: How many times the breaker had opened when the pass was given.
        probe: This call is the probe of an open breaker.
    """

    epoch: int
    probe: bool = False


class Breaker:
    """A circuit breaker for one store client (see the module docstring).

    Args:
        first: Seconds the breaker stays open after the first failure.
        factor: How much each failed probe lengthens the interval (>= 1).
        cap: The longest interval, in seconds.
        jitter: Each interval is multiplied by a random factor in ``[1 - jitter,
            1 + jitter]`` (``0 <= jitter < 1``).
        probe_timeout: Seconds after which a probe that never reported is given up and
            another call may probe.
        clock: Monotonic clock (for tests).
        rand: Uniform random numbers in ``[0, 1)`` (for tests).

    Raises:
        ConfigError: naming the bad argument.
    """

    def __init__(
        self,
        *,
        first: float = 0.1,
        factor: float = 2.0,
        cap: float = 0.5,
        jitter: float = 0.2,
        probe_timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = _JITTER.random,
    ) -> None:
        self.first = seconds("first", first)
        self.cap = seconds("cap", cap)
        if self.cap < self.first:
            raise ConfigError(f"cap: must be >= first ({self.first:g} s), got {cap!r}")
        if not _number(factor) or not 1 <= factor <= 100:
            raise ConfigError(f"factor: must be a number from 1 to 100, got {factor!r:.40}")
        if not _number(jitter) or not 0 <= jitter < 1:
            raise ConfigError(f"jitter: must be a number in [0, 1), got {jitter!r:.40}")
        self.factor = float(factor)
        self.jitter = float(jitter)
        self.probe_timeout = seconds("probe_timeout", probe_timeout)
        if not callable(clock) or not callable(rand):
            raise ArgumentTypeError("clock and rand: must be callables")
        self._clock = clock
        self._rand = rand
        self._lock = threading.Lock()
        self._epoch = 0
        self._closed_pass = Pass(0)
        self._until: float | None = None  # None: closed; else when the next probe may go
        self._interval = 0.0
        self._probing_since: float | None = None
        self.opened = 0  # how many times it opened (for stats and tests)

    @property
    def state(self) -> Literal["closed", "open", "probing"]:
        """``closed``, ``open`` (calls are skipped) or ``probing`` (one call is out)."""
        if self._until is None:
            return "closed"
        return "probing" if self._probing_since is not None else "open"

    def retry_in(self) -> float:
        """Seconds until the next probe may go (0 when closed or due)."""
        until = self._until
        return 0.0 if until is None else max(0.0, until - self._clock())

    def admit(self) -> Pass | None:
        """A pass for one call, or ``None``: skip the store (it is open, or being probed)."""
        if self._until is None:  # the fast path: no lock
            return self._closed_pass
        with self._lock:
            if self._until is None:
                return self._closed_pass
            now = self._clock()
            since = self._probing_since
            if since is not None and now - since < self.probe_timeout:
                return None
            if now < self._until:
                return None
            self._probing_since = now
            return Pass(self._epoch, probe=True)

    def succeeded(self, ticket: Pass) -> None:
        """The call of ``ticket`` succeeded: a probe's success closes the breaker."""
        if not ticket.probe:
            return
        with self._lock:
            if ticket.epoch == self._epoch and self._until is not None:
                self._until = None
                self._interval = 0.0
                self._probing_since = None

    def failed(self, ticket: Pass) -> None:
        """The call of ``ticket`` failed: open the breaker (longer after a failed probe)."""
        with self._lock:
            if ticket.epoch != self._epoch:
                return  # a call from before the breaker last opened
            if self._until is None:
                interval = self.first
                self._epoch += 1
                self._closed_pass = Pass(self._epoch)
                self.opened += 1
            elif ticket.probe:
                interval = min(self.cap, self._interval * self.factor)
            else:
                return  # in flight when it opened: only the probe counts now
            self._interval = interval
            spread = 1 + self.jitter * (2 * self._rand() - 1)
            self._until = self._clock() + interval * spread
            self._probing_since = None

    def abandon(self, ticket: Pass) -> None:
        """The call of ``ticket`` ended without an answer: another call may probe now."""
        if ticket.probe:
            with self._lock:
                if ticket.epoch == self._epoch:
                    self._probing_since = None

    def reset(self) -> None:
        """Close the breaker (an operator knows the store is back)."""
        with self._lock:
            self._until = None
            self._interval = 0.0
            self._probing_since = None


_BREAKERS: weakref.WeakKeyDictionary[object, Breaker] = weakref.WeakKeyDictionary()
_BREAKERS_LOCK = threading.Lock()


def breaker_of(store: object) -> Breaker:
    """The breaker of ``store`` (made with the defaults on first use).

    One per store object, shared by every Demoter using it. An object that cannot be
    weakly referenced or hashed gets a new breaker on each call (each Demoter keeps its
    own).
    """
    try:
        found = _BREAKERS.get(store)
    except TypeError:
        return Breaker()
    if found is not None:
        return found
    with _BREAKERS_LOCK:
        found = _BREAKERS.get(store)
        if found is None:
            found = Breaker()
            with contextlib.suppress(TypeError):  # made anew each time, then
                _BREAKERS[store] = found
        return found


def use_breaker(store: object, breaker: Breaker) -> Breaker:
    """Give ``store`` its own tuned ``breaker`` (before Demoters using it are made).

    Example::

        use_breaker(state, Breaker(first=0.05, cap=1.0))
        demoter = Demoter(policy, hook, state=state)

    Raises:
        ArgumentTypeError: ``breaker`` is not a :class:`Breaker`, or ``store`` cannot be
            weakly referenced.
    """
    if not isinstance(breaker, Breaker):
        raise ArgumentTypeError(f"breaker: expected a Breaker, got {breaker!r:.60}")
    with _BREAKERS_LOCK:
        try:
            _BREAKERS[store] = breaker
        except TypeError:
            raise ArgumentTypeError(
                f"store: {type(store).__name__} cannot be weakly referenced"
            ) from None
    return breaker


class Throttle:
    """Lets one message per key through every ``period`` seconds, and counts the rest.

    Args:
        period: Seconds between two messages of one key.
        clock: Monotonic clock (for tests).
    """

    def __init__(self, period: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.period = seconds("period", period)
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def ready(self, key: str) -> int | None:
        """``None`` to stay quiet; else how many were held back since the last message."""
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.period:
                self._held[key] = self._held.get(key, 0) + 1
                return None
            self._last[key] = now
            return self._held.pop(key, 0)

    def quiet(self, key: str) -> bool:
        """Forget ``key`` (it recovered): ``True`` if a message of it was let through."""
        with self._lock:
            self._held.pop(key, None)
            return self._last.pop(key, None) is not None
