"""Compaction in the background: summarize the groups a ``Compact`` plan marks, commit.

Summarizing holds only the conversation's compaction slot (one summary at a time), so
loads keep delivering meanwhile and the bulk fallback (at ``limit + 2 * compact_count``)
keeps the window bounded. Committing takes the gate and lease like a load does, re-reads
the state in the same step, and applies the summary only if the window has not moved since
the plan (same generation, start, pinned prefix and anchor): otherwise the summary is
discarded and a later load starts another. The summarized messages then go to the hook
like any others that left the window: delivered, or pending and retried.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace

from demote.engine._delivery import Delivery
from demote.engine._flow import Summarize
from demote.engine._views import trail_at
from demote.engine._work import FRESH, Hold, Tally, Work
from demote.events import DemoteEvent, Observers
from demote.flow import Flow, Sleep, Spawn

logger = logging.getLogger("demote")

# A finished summary waits this long, at most, for a delivery in flight to end.
_GATE_POLLS = 200
_GATE_POLL_SECONDS = 0.02

# The state fields that must not have moved for a summary to apply.
_SAME = ("generation", "window_start", "summarized", "pinned", "anchor")


class Compactor:
    """A Demoter's background summaries: one at a time per conversation."""

    def __init__(
        self, summarizer: object, delivery: Delivery, observers: Observers, tally: Tally
    ) -> None:
        self.summarizer = summarizer
        self._delivery = delivery
        self._observers = observers
        self._tally = tally
        self._compacting: dict[str, object] = {}
        self._lock = threading.Lock()

    def maybe_compact(self, cid: str, work: Work) -> Flow[None]:
        """Start a summary of the groups the plan marked, unless one is being written."""
        token = object()
        with self._lock:
            if cid in self._compacting:
                return
            self._compacting[cid] = token
        try:
            delivery = self._delivery
            yield Spawn(
                self._compact(cid, token, work), delivery.background, delivery.background_lock
            )
        except BaseException:
            self._end_compaction(cid, token)
            raise

    def forget(self, cid: str) -> None:
        """Let a new summary of ``cid`` start (the conversation was cleared).

        One still being written commits nothing: the state it was planned on is gone.
        """
        with self._lock:
            self._compacting.pop(cid, None)

    def _end_compaction(self, cid: str, token: object) -> None:
        with self._lock:
            if self._compacting.get(cid) is token:
                del self._compacting[cid]

    def _compact(self, cid: str, token: object, work: Work) -> Flow[None]:
        """Background job: summarize the marked groups, then commit and deliver them."""
        assert work.plan.compact is not None
        lo, hi = work.plan.compact
        base_state = work.target
        records, base = work.view.records, work.view.base
        hold: Hold | None = None
        events: list[DemoteEvent] = [DemoteEvent("compaction_started", cid, lo, hi, hi - lo)]
        began = time.perf_counter()
        try:
            try:
                summary = yield Summarize(
                    self.summarizer, base_state.summary, records[lo - base : hi - base]
                )
            except Exception as exc:
                logger.warning(
                    "demote: summarizer failed for conversation %r (retried on a later load): %r",
                    cid,
                    exc,
                )
                events.append(
                    DemoteEvent(
                        "compaction_failed",
                        cid,
                        lo,
                        hi,
                        hi - lo,
                        duration=time.perf_counter() - began,
                        error=repr(exc),
                    )
                )
                return
            took = time.perf_counter() - began
            for _ in range(_GATE_POLLS):
                hold = yield from self._delivery.take_leased(cid)
                if hold is not None:
                    break
                yield Sleep(_GATE_POLL_SECONDS)
            if hold is None:
                logger.info("demote: summary for %r discarded (conversation busy)", cid)
                return
            if hold.lease is not None:
                current = hold.lease.state
            else:
                current = yield from self._delivery.store_op("get", cid)
            now = current or FRESH
            if any(getattr(now, f) != getattr(base_state, f) for f in _SAME):
                logger.info("demote: summary for %r discarded (the state moved on)", cid)
                yield from self._delivery.release(hold)
                return
            compacted = replace(
                now,
                summary=summary,
                summarized=hi,
                window_start=hi,
                anchor=records[hi - 1 - base].fingerprint,
                trail=trail_at(now, hi, now.pinned, work.view),
            )
            job = replace(work, stored=current, target=compacted, resynced=False, events=events)
            committed, _, _ = yield from self._delivery.settle(hold, job)
            if committed is not None:
                with self._tally.lock:
                    self._tally.summaries += 1
                events.append(
                    DemoteEvent("compaction_committed", cid, lo, hi, hi - lo, duration=took)
                )
        finally:
            if hold is not None:
                self._delivery.let_go(hold)
            self._end_compaction(cid, token)
            self._observers.publish(events)
