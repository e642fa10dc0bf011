"""A Demoter's load, step by step (the theory of operation: :mod:`demote.engine.demoter`).

:class:`Loader` drives one load through the Demoter's other parts: the planning of
:class:`~demote.engine._planning.Planning`, the gate, lease, batches and commit of
:class:`~demote.engine._delivery.Delivery`, the degraded mode of
:mod:`demote.engine._degraded` (a load whose store fails). One load:

1. reads the committed state (one store round trip);
2. describes only the messages the planner needs (records are cached per conversation by
   message identity, see :mod:`demote.engine._views`) and runs the pure planner. A history that
   no longer matches the state is re-synced from a fresh state (one generation on); a
   stale, shorter copy read by a slow request is served its own window and changes
   nothing;
3. if the plan moves the window, or messages are *pending* (they left the window but the
   hook has not accepted them) and the conversation's retry backoff allows an attempt, it
   takes the conversation's in-process gate and, on a shared store, its lease (never
   waiting for either: a caller without them returns the planned window at once). The
   lease comes with the committed state read in the same step (without a lease, the state
   is read again once the gate is taken: its last holder may have committed since); if it
   moved on, the load re-plans against it;
4. hands the pending messages to the hook in batches of at most ``max_batch``, each with
   the lease's fencing token, then commits the new window start and how far the hook got
   with one compare-and-set that is valid only while the lease is held, and releases the
   lease in the same step. A hook failure moves nothing back: the window start is
   committed anyway (the window obeys the policy's bound whatever the hook does), the
   watermark stays behind the undelivered messages, and the conversation backs off;
5. returns the window: pinned system messages, the committed summary, the kept messages.

Before it returns, it starts the summary of the groups a ``Compact`` plan marks (in the
background, see :mod:`demote.engine._compaction`) and publishes the load's events. A
store that fails, times out or is known down (see :mod:`demote.backends.breaker`) gives a
degraded window instead of an error (``on_store_error="degrade"``): planned from the
history alone when step 1 fails, the planned one when a later step does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

from demote._validate import count
from demote.engine._compaction import Compactor
from demote.engine._degraded import Degradation
from demote.engine._delivery import Delivery
from demote.engine._planning import Planning
from demote.engine._views import ViewCache
from demote.engine._work import FRESH, Tally, Work
from demote.engine.result import Window
from demote.errors import ArgumentTypeError, ConfigError, HookError
from demote.events import Observers
from demote.flow import Flow
from demote.records import ConversationState, MessageRecord
from demote.state.base import validate_conversation_id

__all__ = ["Loader"]

T = TypeVar("T")


class Loader:
    """Drives each load through the Demoter's other parts (one per Demoter)."""

    def __init__(
        self,
        planning: Planning,
        delivery: Delivery,
        degradation: Degradation,
        compactor: Compactor | None,
        views: ViewCache,
        observers: Observers,
        tally: Tally,
        *,
        on_store_error: Literal["degrade", "raise"],
        on_hook_error: Literal["log", "raise"],
        noop: bool,
    ) -> None:
        self.on_store_error = on_store_error
        self.on_hook_error = on_hook_error
        self._noop = noop  # the hook keeps nothing: it accepts everything at once
        self._planning = planning
        self._delivery = delivery
        self._leasing = callable(getattr(delivery.state, "acquire_lease", None))
        self._degradation = degradation
        self._compactor = compactor
        self._views = views
        self._observers = observers
        self._tally = tally

    def stale_copy(
        self, cid: str, messages: Sequence[T], describe: Callable[[T], MessageRecord]
    ) -> bool:
        """Is ``messages`` a copy older than the history this process last loaded for ``cid``?

        Its load was served its own window and changed nothing; loading it again would
        not deliver anything either (the next load of the current history does).
        """
        return self._views.is_stale(cid, messages, describe, FRESH)

    def flow(
        self,
        conversation_id: str,
        messages: Sequence[T],
        describe: Callable[[T], MessageRecord],
        reserved: int = 0,
        pruned: range = range(0),
        fixed: int | None = None,
    ) -> Flow[Window[T]]:
        """One load: steps 1 to 5 (see :mod:`demote.engine.demoter`)."""
        if type(conversation_id) is str and conversation_id in self._views:
            cid = conversation_id  # a cached view's id was checked when it was made
        else:
            cid = validate_conversation_id(conversation_id)
        if type(messages) is not list and (
            not isinstance(messages, Sequence) or isinstance(messages, str | bytes)
        ):
            raise ArgumentTypeError(
                f"messages: expected a sequence of messages (a list), got {type(messages).__name__}"
            )
        if not callable(describe):
            raise ArgumentTypeError(f"describe: expected a callable, got {describe!r:.80}")
        if type(reserved) is not int or reserved:  # (the common 0 is valid)
            count("reserved", reserved, minimum=0)
        if fixed is None:
            fixed = reserved
        elif type(fixed) is not int or fixed:
            count("fixed", fixed, minimum=0)
            if fixed > reserved:
                raise ConfigError(
                    f"fixed: {fixed} tokens, more than the {reserved} reserved; fixed is the "
                    "part of reserved every request carries unchanged"
                )
        if type(pruned) is not range or pruned.step != 1 or pruned.start < 0:
            raise ConfigError(f"pruned: expected a range of positions, got {pruned!r:.80}")
        tally = self._tally
        with tally.lock:
            tally.loads += 1
        try:
            stored = yield from self._delivery.guarded("get", cid)
        except Exception as exc:  # down, slow or skipped: plan from the history alone
            if self.on_store_error == "raise":
                raise
            window = self._degradation.window(
                cid,
                self._planning.from_history(cid, messages, describe, reserved, pruned, fixed),
                exc,
            )
            self._observers.publish(window.events)
            return window
        if self._degradation.since is not None:
            self._degradation.recovered()
        work = self._planning.prepare(cid, messages, describe, stored, reserved, pruned, fixed)
        if isinstance(work, Window):
            return work
        window, done = yield from self._run(cid, describe, stored, work)
        if done is not None and done.plan.compact is not None and self._compactor is not None:
            yield from self._compactor.maybe_compact(cid, done)
        if not window.degraded:
            tally.note_pending(cid, window.pending)
        if window.events:
            self._observers.publish(window.events)
        return window

    def _run(
        self,
        cid: str,
        describe: Callable[[T], MessageRecord],
        stored: ConversationState | None,
        work: Work,
    ) -> Flow[tuple[Window[T], Work | None]]:
        """Steps 3 and 4: take the gate and lease if there is work, deliver, commit."""
        delivery = self._delivery
        if not (work.changed or delivery.deliverable(cid, work)):
            return self._planning.window(cid, work), work
        hold = delivery.take(cid)
        if hold is None:  # another caller of this process is delivering
            self._planning.unconfirmed(cid, work)
            return self._planning.window(cid, work), work
        failure: Exception | None = None
        try:
            try:
                if self._leasing and getattr(delivery.state, "shared", True):
                    yield from delivery.unstrand(cid)
                    try:
                        lease = yield from delivery.guarded(
                            "acquire_lease", cid, hold.holder, delivery.lease_ttl
                        )
                    except Exception:  # granted, perhaps, and the reply lost
                        delivery.stranded[cid] = hold.holder
                        raise
                    if lease is None:  # another worker is delivering
                        self._planning.unconfirmed(cid, work)
                        return self._planning.window(cid, work), work
                    hold.lease = lease
                    delivery.keeper.hold(lease)
                    current = lease.state
                else:  # the gate alone: its last holder may have committed since we read
                    current = yield from delivery.guarded("get", cid)
                if current is not stored and current != stored:  # it moved on: plan again
                    replanned = self._planning.prepare(
                        cid,
                        work.messages,
                        describe,
                        current,
                        work.reserved,
                        work.pruned,
                        work.fixed,
                    )
                    if isinstance(replanned, Window):
                        yield from delivery.release(hold)
                        return replanned, None
                    work = replanned
                if cid in delivery.unsure:  # delivered before, but that commit failed
                    work.known = True
                committed, demoted, error = yield from delivery.settle(hold, work)
            except Exception as exc:  # the store failed mid-way (hook errors are settled)
                if self.on_store_error == "raise":
                    raise
                failure = exc
                if any(e.kind == "delivered" for e in work.events):
                    delivery.unsure.add(cid)  # the next delivery asks what the hook holds
                if hold.lease is not None and not hold.released:
                    delivery.stranded[cid] = hold.lease
        finally:
            delivery.let_go(hold)
        if failure is not None:
            self._planning.unconfirmed(cid, work)
            return self._degradation.window(cid, self._planning.window(cid, work), failure), None
        if committed is None:
            self._planning.unconfirmed(cid, work)
        if error is not None and self.on_hook_error == "raise":
            if isinstance(error, HookError):
                raise error
            raise HookError(f"hook failed for conversation {cid!r}: {error}") from error
        if committed is not None:
            delivery.unsure.discard(cid)
            self._planning.committed(cid, work, committed)
            if self._noop:  # it took what left the window at once
                prev = work.stored or FRESH
                before = prev.delivered if prev.window_start > prev.pinned else work.plan.pinned
                demoted = max(0, committed.delivered - before)
        return self._planning.window(cid, work, committed, demoted), work
