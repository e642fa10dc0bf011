"""What a Demoter reports of itself: its stats, and one conversation's.

:class:`~demote.events.DemoterStats` and :class:`~demote.events.ConversationStats` are
made from the Demoter's :class:`~demote.engine._work.Tally` (its counters in this
process); a conversation's also from its committed state and its retry backoff.
"""

from __future__ import annotations

from demote.engine._work import Tally
from demote.engine.retry import RetryTracker
from demote.events import ConversationStats, DemoterStats
from demote.records import ConversationState

__all__ = ["stats_of_conversation", "stats_of_demoter"]


def stats_of_demoter(
    tally: Tally, conversations: int, *, retrying: int = 0, queued: int = 0
) -> DemoterStats:
    """What :meth:`demote.Demoter.stats` returns: the tally, and how many conversations.

    ``retrying`` and ``queued`` are the Demoter's background retries and hook queue now.
    """
    with tally.lock:
        error, at = tally.last_error or (None, None)
        return DemoterStats(
            conversations=conversations,
            loads=tally.loads,
            delivered=tally.delivered,
            pending=sum(tally.pending.values()),
            failures=tally.failures,
            last_error=error,
            last_error_at=at,
            summaries=tally.summaries,
            resyncs=tally.resyncs,
            degraded=tally.degraded,
            pending_conversations=len(tally.pending),
            retrying=retrying,
            retries=tally.retries,
            untracked=tally.untracked,
            queued=queued,
        )


def stats_of_conversation(
    cid: str, state: ConversationState, tally: Tally, retry: RetryTracker
) -> ConversationStats:
    """What :meth:`demote.Demoter.conversation_stats` returns for ``cid`` in ``state``."""
    pending = max(0, state.window_start - max(state.delivered, state.pinned))
    error, at = tally.errors.get(cid) or (None, None)
    return ConversationStats(
        conversation_id=cid,
        window_start=state.window_start,
        delivered=state.delivered,
        pending=pending,
        summarized=state.summarized,
        failures=retry.failures(cid),
        retry_in=retry.wait(cid),
        last_error=error,
        last_error_at=at,
    )
