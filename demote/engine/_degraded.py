"""A Demoter's degraded mode: loads whose state store failed, and parts that failed beside.

A load whose state store fails, times out or is skipped by its breaker returns a window
planned from the history alone; :meth:`Degradation.window` marks it degraded and adds its
``degraded`` event. Adapters report a failed recall or capture the same way
(:meth:`Degradation.report`). Each source is warned about at most once a period, with how
many warnings were held back meanwhile; once the store answers again, the recovery is
logged (:meth:`Degradation.recovered`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TypeVar

from demote.backends.breaker import Breaker, Throttle
from demote.engine._work import Tally
from demote.engine.result import Window
from demote.errors import ConfigError
from demote.events import DegradedSource, DemoteEvent, Observers

__all__ = ["DEGRADED_WARNING_PERIOD", "Degradation"]

logger = logging.getLogger("demote")

#: Seconds between two warnings about one failing part (state store, recall, capture).
DEGRADED_WARNING_PERIOD = 60.0

_DEGRADED_WHAT = {
    "state": "state store failed; windows are planned from the history alone and nothing "
    "is delivered or committed until it answers",
    "recall": "recall failed; windows go without recalled messages",
    "capture": "capture failed; user turns are not captured",
}

T = TypeVar("T")


class Degradation:
    """Marks degraded windows and reports failed parts, warning once a period (one per Demoter)."""

    def __init__(self, breaker: Breaker, observers: Observers, tally: Tally) -> None:
        self._breaker = breaker
        self._observers = observers
        self._tally = tally
        self._warnings = Throttle(DEGRADED_WARNING_PERIOD)
        #: When the state store began failing (``time.monotonic()``); ``None`` while it answers.
        self.since: float | None = None

    def window(self, cid: str, window: Window[T], error: Exception) -> Window[T]:
        """``window`` marked degraded, with its event; warned about once a period."""
        retry_in = self._breaker.retry_in()
        event = DemoteEvent.degraded(
            cid, "state", error, start=window.start, end=window.total, retry_in=retry_in
        )
        with self._tally.lock:
            self._tally.degraded += 1
        if self.since is None:
            self.since = time.monotonic()
        self.warn("state", cid, error, retry_in)
        events = (*window.events, event)
        return dataclasses.replace(window, degraded=True, events=events)

    def warn(self, source: str, cid: str, error: BaseException, retry_in: float) -> None:
        """Log that ``source`` failed, unless it was warned about less than a period ago."""
        held = self._warnings.ready(source)
        if held is None:
            return
        probe = f", next probe in {retry_in:.2g} s" if source == "state" else ""
        more = f"; {held} more since the last warning" if held else ""
        logger.warning(
            "demote: %s (conversation %r%s%s; warned at most every %g s): %r",
            _DEGRADED_WHAT[source],
            cid,
            probe,
            more,
            self._warnings.period,
            error,
        )

    def recovered(self) -> None:
        """The state store answered again: log how long it was down, if it was warned about."""
        since, self.since = self.since, None
        if since is not None and self._warnings.quiet("state"):
            logger.warning(
                "demote: state store answers again after %.1f s; demotion resumes",
                time.monotonic() - since,
            )

    def report(
        self, conversation_id: str, source: DegradedSource, error: BaseException
    ) -> DemoteEvent:
        """What :meth:`demote.Demoter.report_degraded` does: the event, published and warned."""
        if source not in ("state", "recall", "capture"):
            raise ConfigError(f"source: must be 'state', 'recall' or 'capture', got {source!r:.40}")
        event = DemoteEvent.degraded(conversation_id, source, error)
        self.warn(source, conversation_id, error, 0.0)
        self._observers.publish((event,))
        return event
