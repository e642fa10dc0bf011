"""A Demoter's batches: what one hook call is handed, and what its outcome records.

:class:`Batches` makes the batch of messages ``[lo, hi)`` (their neutral form, less what
the hook already holds after a re-sync or a clear) and records how the hook answered: the
``delivered`` or ``delivery_failed`` event, the tally, the retry backoff, the messages
marked sent. :class:`~demote.engine._delivery.Delivery` drives the calls and commits.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from demote.engine._flow import HasKeys
from demote.engine._views import ViewCache
from demote.engine._work import Hold, Tally, Work
from demote.engine.retry import RetryTracker
from demote.events import DemoteEvent
from demote.flow import Flow
from demote.records import (
    DemotedMessage,
    Demotion,
    MessageRecord,
    keys_of,
    make_key,
    text_data,
)

__all__ = ["Batches"]

logger = logging.getLogger("demote")


def _data(rec: MessageRecord, raw: Any) -> dict[str, Any]:
    """The neutral form of a message being delivered: the adapter's, or the record's.

    Made here, at delivery, from the framework message, so the cached records stay small.
    A converter that fails gives the text-only form (logged): a hook still gets the
    message, and the conversation does not stall on one odd message.
    """
    if rec.to_data is not None:
        try:
            data = rec.to_data(raw)
        except Exception as exc:
            logger.warning("demote: cannot convert a message to its neutral form: %r", exc)
        else:
            if isinstance(data, dict):
                return data
            logger.warning("demote: to_data returned %s, not a dict", type(data).__name__)
    return text_data(rec.role, rec.text, rec.answers, rec.tool)


class Batches:
    """Makes each batch for the hook and records its outcome (one per Demoter)."""

    def __init__(self, hook: object, views: ViewCache, retry: RetryTracker, tally: Tally) -> None:
        self.hook = hook
        self._views = views
        self._retry = retry
        self._tally = tally
        self._probe = callable(getattr(hook, "has_keys", None))

    def of(self, hold: Hold, work: Work, lo: int, hi: int) -> Flow[Demotion]:
        """The messages ``[lo, hi)`` as one batch, less what the hook already holds."""
        cid = hold.conversation_id
        records, base, messages = work.view.records, work.view.base, work.messages
        out = []
        for i in range(lo, hi):
            rec = records[i - base]
            key = make_key(cid, i, rec.fingerprint)
            raw = messages[i]
            out.append(DemotedMessage(rec.role, rec.text, i, key, raw, _data(rec, raw)))
        if work.known and out:
            # After a re-sync or a clear the watermark restarted: what the hook (or, for a
            # hook that cannot tell, this process) already holds is not offered again.
            if self._probe:
                # A message whose calls or blocks an earlier release fingerprinted without
                # them was delivered under the key of its legacy fingerprint: ask for both.
                known = [keys_of(cid, [(m.index, records[m.index - base])]) for m in out]
                held = yield HasKeys(self.hook, cid, [k for keys in known for k in keys])
                out = [m for m, keys in zip(out, known, strict=True) if held.isdisjoint(keys)]
            else:
                was = self._views.was_sent
                out = [m for m in out if not was(cid, m.index, records[m.index - base].fingerprint)]
        fence = hold.lease.token if hold.lease is not None else None
        return Demotion(cid, tuple(out), fence)

    def sent(self, work: Work, batch: Demotion) -> list[tuple[int, str]] | None:
        """What to mark sent once the hook accepts ``batch`` (``None``: a key-aware hook)."""
        if self._probe:  # a key-aware hook answers for itself after a re-sync
            return None
        records, base = work.view.records, work.view.base
        return [(m.index, records[m.index - base].fingerprint) for m in batch.messages]

    def accepted(
        self,
        events: list[DemoteEvent],
        batch: Demotion,
        lo: int,
        hi: int,
        sent: list[tuple[int, str]] | None,
        took: float,
    ) -> None:
        """The hook took ``batch``: mark it sent, count it, add its ``delivered`` event."""
        cid = batch.conversation_id
        if sent is not None:
            self._views.mark_sent(cid, sent)
        with self._tally.lock:
            self._tally.delivered += len(batch.messages)
        events.append(_event("delivered", batch, lo, hi, took))

    def failed(
        self,
        events: list[DemoteEvent],
        batch: Demotion,
        lo: int,
        hi: int,
        pending: int,
        exc: Exception,
        took: float,
    ) -> None:
        """The hook failed on ``batch``: back off, count it, log, add its event."""
        cid = batch.conversation_id
        wait = self._retry.failed(cid)
        self._tally.failed(cid, repr(exc))
        logger.warning(
            "demote: hook failed for conversation %r (%d messages pending, next attempt in "
            "%.3g s): %r",
            cid,
            pending,
            wait,
            exc,
        )
        events.append(
            _event("delivery_failed", batch, lo, hi, took, error=repr(exc), retry_in=wait)
        )


def _event(
    kind: Literal["delivered", "delivery_failed"],
    batch: Demotion,
    lo: int,
    hi: int,
    took: float,
    **outcome: Any,
) -> DemoteEvent:
    """The event of one hook call on ``batch`` (messages ``lo`` to ``hi``)."""
    keys = tuple(m.key for m in batch.messages)
    return DemoteEvent(
        kind,
        batch.conversation_id,
        lo,
        hi,
        len(keys),
        keys,
        duration=took,
        fence=batch.fence,
        **outcome,
    )
