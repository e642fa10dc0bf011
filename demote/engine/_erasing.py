"""The Demoter's ``clear``, ``forget`` and ``erase``: letting go of a conversation.

``clear`` resets its demotion state (a tombstone one generation on), ``forget`` drops it,
and ``erase`` removes it from every tier behind the hook as well (see :mod:`demote.erase`
for what that means and reports).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

from demote._validate import seconds
from demote.engine._compaction import Compactor
from demote.engine._delivery import Delivery
from demote.engine._pending import Retries
from demote.engine._views import ViewCache
from demote.engine._work import Hold, Tally
from demote.engine.retry import RetryTracker
from demote.erase import EraseReport, TierReport, tiers
from demote.errors import ConfigError
from demote.flow import Call, Flow, Sleep
from demote.records import MessageRecord, keys_of
from demote.state.base import Lease, validate_conversation_id

T = TypeVar("T")

_POLL_SECONDS = 0.05


class Eraser:
    """A Demoter's ``clear``, ``forget`` and ``erase`` (one per Demoter)."""

    def __init__(
        self,
        delivery: Delivery,
        compactor: Compactor | None,
        views: ViewCache,
        retry: RetryTracker,
        tally: Tally,
        retries: Retries,
    ) -> None:
        self._delivery = delivery
        self._retries = retries
        self._compactor = compactor
        # A store that never blocks is called in the gate's lock (see ``reset``).
        self._direct = bool(getattr(delivery.state, "nonblocking", False))
        self._views = views
        self._retry = retry
        self._tally = tally

    def reset(self, conversation_id: str, how: Literal["clear", "delete"]) -> Flow[None]:
        """``clear`` or ``delete`` the conversation's state; its gate and caches go too."""
        cid = validate_conversation_id(conversation_id)
        delivery = self._delivery
        if how == "clear" and not callable(getattr(delivery.state, "clear", None)):
            how = "delete"  # a store from before tombstones
        with delivery.lock:
            delivery.gates.pop(cid, None)
            if self._compactor is not None:
                self._compactor.forget(cid)
            if self._direct:  # in the same step, so no commit of a taken gate lands after
                getattr(delivery.state, how)(cid)
        self._views.forget(cid)
        self._retry.succeeded(cid)
        self._retries.drop(cid)  # what was pending is gone with the state
        if not self._direct:
            yield from delivery.store_op(how, cid)

    def erase(
        self,
        conversation_id: str,
        messages: Sequence[T] | None,
        describe: Callable[[T], MessageRecord] | None,
        wait: float | None,
        also: Sequence[object] = (),
        given: Sequence[str] | None = None,
    ) -> Flow[EraseReport]:
        cid = validate_conversation_id(conversation_id)
        if (messages is None) != (describe is None):
            raise ConfigError("erase: give both messages and describe, or neither")
        keys = None if given is None else [str(k) for k in given]
        if messages is not None and describe is not None:
            derived = keys_of(cid, ((i, describe(m)) for i, m in enumerate(messages)))
            keys = list(dict.fromkeys([*derived, *(keys or ())]))
        delivery = self._delivery
        wait = delivery.lease_ttl if wait is None else seconds("wait", wait, zero=True)
        deadline = time.monotonic() + wait
        hold: Hold | None = None
        took_over = False
        try:
            while True:  # wait for a delivery in flight, here or elsewhere, to end
                hold = yield from delivery.take_leased(cid)
                if hold is not None or time.monotonic() >= deadline:
                    break
                yield Sleep(_POLL_SECONDS)
            if hold is None:  # it did not end in time: revoke its lease and take over
                took_over = True
                with delivery.lock:
                    delivery.gates.pop(cid, None)
                held = (yield from delivery.store_op("get", cid)) is not None
                yield from delivery.store_op("delete", cid)
                hold = yield from delivery.take_leased(cid)
            elif hold.lease is not None:  # the state, read with the grant
                held = hold.lease.state is not None
            else:  # the gate alone: no commit of this process lands while it is held
                held = (yield from delivery.store_op("get", cid)) is not None
            fence = hold.lease.token if hold is not None and hold.lease is not None else None
            reports: list[TierReport] = []
            for holder in (delivery.hook, *also):
                reports += yield from erase_tiers(holder, cid, fence, keys)
            if hold is not None and hold.lease is not None and not took_over:
                # Still ours? If the lease ran out while the tiers erased (its renewals
                # lost), another worker may have delivered to a tier since: not complete.
                took_over = not (yield from lease_still_held(delivery, hold.lease))
            state = yield from self._delete_state(cid, held)
            if hold is not None and hold.lease is not None and state.status == "erased":
                hold.released = True  # (with the state: a failed delete leaves it to let_go)
                delivery.keeper.drop(hold.lease)
            self.forget_everywhere(cid)
            return EraseReport(cid, tuple(reports), state, took_over)
        finally:
            if hold is not None:
                delivery.let_go(hold)

    def _delete_state(self, cid: str, held: bool) -> Flow[TierReport]:
        """Delete the state, summary and lease, bytes too; what the state tier did."""
        name = type(self._delivery.state).__name__
        try:
            yield from self._delivery.store_op("delete", cid)
        except Exception as exc:  # reported: the long tail erased all the same
            return TierReport(name, "failed", error=repr(exc), kind="state")
        return TierReport(name, "erased", int(held), kind="state")

    def forget_everywhere(self, cid: str) -> None:
        """Drop what this process keeps of the conversation (caches, counters, errors)."""
        self._views.forget(cid)
        self._retry.succeeded(cid)
        self._retries.drop(cid)
        with self._tally.lock:
            self._tally.errors.pop(cid, None)
            self._tally.pending.pop(cid, None)


def lease_still_held(delivery: Delivery, lease: Lease) -> Flow[bool]:
    """Is ``lease`` still held? Renewed once to find out (a refusal: it was lost).

    The keeper renews it meanwhile, but a renewal that never reached the store (a
    partition) is only retried: asking the store is the one sure answer.
    """
    if delivery.keeper.lost(lease):
        return False
    if not callable(getattr(delivery.state, "renew_lease", None)):
        return True
    return bool((yield from delivery.store_op("renew_lease", lease, delivery.lease_ttl)))


def erase_tiers(
    holder: object, cid: str, fence: int | None, keys: Sequence[str] | None
) -> Flow[list[TierReport]]:
    """Ask every tier behind ``holder`` to erase ``cid``; one report per tier, in order."""
    reports = []
    for label, tier in tiers(holder):
        if not (callable(getattr(tier, "erase", None)) or hasattr(tier, "aerase")):
            reports.append(TierReport(label, "unsupported"))
            continue
        try:
            removed = yield Call(tier, "erase", (cid,), {"fence": fence, "keys": keys})
        except Exception as exc:  # reported, and the other tiers still erase
            reports.append(TierReport(label, "failed", error=repr(exc)))
            continue
        reports.append(TierReport(label, "erased", _count(removed)))
    return reports


def _count(removed: Any) -> int | None:
    return removed if isinstance(removed, int) and not isinstance(removed, bool) else None
