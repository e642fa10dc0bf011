"""Holding a conversation: its gate, its lease, the store's calls and the fenced commit.

:class:`Holding` is the base of :class:`~demote.engine._delivery.Delivery`: the part of
it that takes a conversation's in-process gate, calls the state store (through the
store's breaker, :mod:`demote.backends.breaker`), commits with the compare-and-set the
hold's lease fences, and gives the lease back, or leaves it for the next load to release
when the store failed. What the gate and lease are for (only the hold's owner delivers
and commits), and the delivery itself, are told in :mod:`demote.engine._delivery`.
"""

from __future__ import annotations

import itertools
import logging
import threading
import uuid
from typing import Any

from demote.backends.breaker import Breaker, breaker_of, is_outage
from demote.engine._flow import store_call as _op
from demote.engine._runner import LeaseKeeper
from demote.engine._work import REPLAY, Hold
from demote.errors import StoreUnavailable
from demote.flow import Flow
from demote.records import ConversationState
from demote.state.base import Lease, StateStore

logger = logging.getLogger("demote")


class Holding:
    """Gates, leases, the store's breaker, the fenced commit: the base of a Delivery.

    It owns the in-process gates, the leases (and their keeper) and the store's breaker;
    :class:`~demote.engine._delivery.Delivery` adds the hook, its threads and the
    background flows.
    """

    def __init__(self, state: StateStore, lease_ttl: float) -> None:
        self.state = state
        self.lease_ttl = lease_ttl
        self._direct = bool(getattr(state, "nonblocking", False))
        self.breaker: Breaker = breaker_of(state)
        self.keeper = LeaseKeeper(state, lease_ttl)
        self.lock = threading.Lock()
        self.gates: dict[str, Hold] = {}
        # Leases whose release may have failed, or holders whose grant was not heard of.
        self.stranded: dict[str, Lease | str] = {}
        self._instance = uuid.uuid4().hex[:12]
        self._holders = itertools.count(1)

    def store_op(self, name: str, *args: Any, **kwargs: Any) -> Flow[Any]:
        """Call the state store: directly if it never blocks, else as a yielded op."""
        if self._direct:
            return getattr(self.state, name)(*args, **kwargs)
        return (yield _op(self.state, name, *args, **kwargs))

    def guarded(self, name: str, *args: Any, **kwargs: Any) -> Flow[Any]:
        """A load's store call, through the store's breaker (see :mod:`demote.backends.breaker`).

        Raises the store's error, or :class:`~demote.errors.StoreUnavailable` without
        calling it while the breaker is open (or another call is its probe).
        """
        breaker = self.breaker
        ticket = breaker.admit()
        if ticket is None:
            raise StoreUnavailable(
                f"state store skipped: it failed recently (next probe in "
                f"{breaker.retry_in():.2g} s)"
            )
        try:
            result = yield from self.store_op(name, *args, **kwargs)
        except Exception as exc:
            if is_outage(exc):
                breaker.failed(ticket)
            else:  # it answered, with something wrong for one conversation
                breaker.succeeded(ticket)
            raise
        except BaseException:  # cancelled, or the flow was closed: no answer
            breaker.abandon(ticket)
            raise
        breaker.succeeded(ticket)
        if result is None and name == "acquire_lease":  # another worker is delivering
            replay = REPLAY.get()
            if replay is not None and replay.conversation_id == args[0]:
                replay.elsewhere = True  # (a background load: theirs to deliver)
        return result

    def unstrand(self, cid: str) -> Flow[None]:
        """Release a lease an earlier load could not, before taking a new one.

        A load whose store failed while it held the lease (or while it asked for one: the
        server may have granted it and the reply been lost) leaves it to expire
        (``lease_ttl``); without this, the conversation would not be demoted again
        until then, although the store is back.
        """
        lease = self.stranded.pop(cid, None)
        if lease is None:
            return
        try:
            if isinstance(lease, Lease):
                yield from self.guarded("release_lease", lease)
            elif callable(getattr(self.state, "release_holder", None)):
                # A grant whose reply was lost: only the holder name is known.
                yield from self.guarded("release_holder", cid, lease)
        except Exception:
            self.stranded.setdefault(cid, lease)
            raise

    def take(self, cid: str) -> Hold | None:
        """The conversation's in-process gate, if free (never waits)."""
        with self.lock:
            if cid in self.gates:
                return None
            hold = self.gates[cid] = Hold(cid, f"{self._instance}:{next(self._holders)}")
            return hold

    def commit(
        self, hold: Hold, stored: ConversationState | None, new: ConversationState, *, release: bool
    ) -> Flow[bool]:
        """Compare-and-set ``new``, fenced by the hold's lease (released if asked)."""
        lease = hold.lease
        kwargs: dict[str, Any] = {}
        if lease is not None:
            release = release and hold.detached is None  # a running call keeps it
            kwargs = {"lease": lease, "release": release}
        cid = hold.conversation_id
        if self._direct:
            # No I/O: check in one step that no clear or forget of this process took the
            # gate away meanwhile (without a lease, nothing else would tell).
            with self.lock:
                ok = self.gates.get(cid) is hold and self.state.compare_and_set(
                    cid, stored, new, **kwargs
                )
        else:  # a lease fences it: clear and forget revoke it in the store
            ok = yield from self.guarded("compare_and_set", cid, stored, new, **kwargs)
        if lease is not None and kwargs["release"]:
            hold.released = True
            self.keeper.drop(lease)
        if not ok:
            logger.info(
                "demote: commit for conversation %r refused (advanced or cleared elsewhere, "
                "or the lease was lost); keeping theirs",
                hold.conversation_id,
            )
        return bool(ok)

    def release(self, hold: Hold) -> Flow[None]:
        """Give the lease back now (unless a running hook call still needs it)."""
        lease = hold.lease
        if lease is None or hold.released or hold.detached is not None:
            return
        hold.released = True
        self.keeper.drop(lease)
        try:  # through the breaker: a store that is down costs no turn a timeout here
            yield from self.guarded("release_lease", lease)
        except Exception as exc:  # it expires on its own, or the next load releases it
            self.stranded[hold.conversation_id] = lease
            if not isinstance(exc, StoreUnavailable):  # (a skipped call is no news)
                logger.warning("demote: releasing the lease of %r failed: %r", lease, exc)

    def _free(self, hold: Hold) -> None:
        lease = hold.lease
        if lease is not None and not hold.released:  # the flow failed or was cancelled
            hold.released = True
            if self._direct:  # no I/O: give it back now
                self.keeper.drop(lease)
                self.state.release_lease(lease)  # type: ignore[attr-defined]
            else:  # a cancelled flow cannot wait for a round trip
                self.keeper.release_later(lease)
        with self.lock:
            if self.gates.get(hold.conversation_id) is hold:
                del self.gates[hold.conversation_id]

    def _strand(self, hold: Hold) -> None:
        """Leave the hold's lease, if still out, to the next load, which releases it first.

        The keeper's release could come after that load (or fail with the store), which
        would then find the conversation held by this very process.
        """
        lease = hold.lease
        if lease is not None and not hold.released:
            hold.released = True
            self.keeper.drop(lease)
            self.stranded[hold.conversation_id] = lease
