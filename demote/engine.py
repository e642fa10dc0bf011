"""The demotion engine: load -> plan -> deliver -> commit.

Theory of operation
-------------------
Adapters call :meth:`Demoter.load` (or :meth:`Demoter.aload`) on every read with the
conversation's full history and a function that describes one message as a
:class:`~demote.records.MessageRecord`. One load:

1. takes the conversation's in-flight gate if it is free (never waits for it);
2. reads the committed state and describes only the messages the planner needs (records
   are cached per conversation by message identity, so an unchanged window is not
   re-described, and each message's tokens are counted once in its life);
3. runs the pure planner; a history that no longer matches the state is re-synced from a
   fresh state, and messages whose keys the hook already holds are not offered again.
   The planner's group index (``Plan.index``) is cached with the records and handed back
   while the cached messages are still the same objects, so a load that appended one
   message plans over one message, not the window; any mismatch, a re-sync, ``clear`` or
   ``forget`` drops it and the next plan builds it afresh;
4. if the plan demotes messages and this caller holds the gate, hands them to the hook as
   one :class:`~demote.records.Demotion`, then commits the new watermark with
   compare-and-set. A caller without the gate returns the planned window at once: the
   holder is delivering. A hook failure keeps the watermark (the next load retries) and
   the window keeps the undelivered messages;
5. returns the window: pinned system messages, the committed summary, the kept messages.

Steps 1-3 and 5 are plain code shared by both entry points. The only I/O that differs
between sync and async callers, the hook call, is yielded by a generator (``_flow``) as an
operation object; two short drivers run it, one blocking, one awaiting. ``clear`` and
``forget`` bump the conversation's epoch, so a delivery still in flight when they run
neither commits its stale state nor releases the newer reservation.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import operator
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Generic, Literal, TypeVar

from demote._flow import Deliver, Flow, Sleep, Spawn, Summarize, drive_async, drive_sync
from demote._groups import GroupIndex
from demote.errors import ConfigError, HookError
from demote.hooks.simple import NoopHook, check_hook
from demote.planner import Plan, needed_from, plan
from demote.policy import Compact, SlidingWindow
from demote.records import (
    ConversationState,
    DemotedMessage,
    Demotion,
    MessageRecord,
    fingerprint,
    make_key,
)
from demote.state.base import StateStore, validate_conversation_id
from demote.state.memory import InMemoryStateStore
from demote.summarize import check_summarizer
from demote.tokens import TokenCache

__all__ = ["SUMMARY_PREFIX", "Demoter", "Window", "render_summary"]

#: How adapters introduce the running summary to the model (one system message).
SUMMARY_PREFIX = "Summary of the earlier conversation:\n"


def render_summary(summary: str) -> str:
    """The text of the one system message that carries the running summary."""
    return SUMMARY_PREFIX + summary


logger = logging.getLogger("demote")

# How many fingerprints of messages that left the window a conversation's view remembers.
_LEFT_KEPT = 64

# A finished summary waits this long, at most, for a delivery in flight to end.
_GATE_POLLS = 200
_GATE_POLL_SECONDS = 0.02

T = TypeVar("T")
R = TypeVar("R")

# ConversationState's fields in constructor order, and where the watermarks a load moves sit.
_STATE_FIELDS = tuple(f.name for f in fields(ConversationState) if f.init)
_state_values = operator.attrgetter(*_STATE_FIELDS)
_WATERMARKS = ("window_start", "delivered", "pinned", "anchor")
_watermarks = operator.attrgetter(*_WATERMARKS)
_WATERMARK_AT = tuple(_STATE_FIELDS.index(name) for name in _WATERMARKS)


@dataclass(frozen=True, slots=True)
class Window(Generic[T]):
    """What a load returns: the part of the history the model should see.

    Attributes:
        conversation_id: The conversation.
        pinned: Leading system messages (never demoted).
        summary: The committed running summary, or ``None``.
        messages: The kept messages, oldest first.
        start: Absolute index of ``messages[0]``.
        total: Length of the full history.
        demoted: Messages this call handed to the hook.
    """

    conversation_id: str
    pinned: list[T]
    summary: str | None
    messages: list[T]
    start: int
    total: int
    demoted: int = 0

    def __len__(self) -> int:
        return len(self.pinned) + len(self.messages)


@dataclass(slots=True)
class _View:
    """Records of one conversation's recent messages, cached by message identity.

    ``raws[i]`` is the message at absolute index ``base + i`` and ``records[i]`` its
    record; ``left[i]`` is the fingerprint of the message at ``left_base + i``, one of the
    newest that moved out of the view (kept to recognise a stale, shorter snapshot).
    ``index`` is the planner's group index over (a suffix of) those records, set once by
    the load that made the view; it is only handed back to the planner while the messages
    it covers are the same objects.
    """

    base: int
    raws: list[Any]
    records: list[MessageRecord]
    index: GroupIndex | None = None
    left_base: int = 0
    left: tuple[str, ...] = ()  # fingerprints of the newest messages that left the view


class Demoter:
    """Keeps each conversation's active window and demotes what falls out, once.

    One Demoter serves any number of conversations; share it across adapters.

    Args:
        policy: The window policy.
        hook: Where demoted messages go (``NoopHook`` if omitted): an object with
            ``deliver(batch)`` and/or ``async adeliver(batch)``.
        state: Where watermarks live; ``InMemoryStateStore()`` if omitted, use
            ``SQLiteStateStore(path)`` to survive restarts.
        on_hook_error: ``"log"`` (warn and return the window) or ``"raise"``
            (:class:`~demote.errors.HookError` to the caller that drove the delivery).
            Either way the watermark stays and the next load retries.
        hook_timeout: Seconds an async load waits for the hook before giving up
            (:class:`~demote.errors.HookTimeout`); ``None`` waits forever.
        summarizer: Folds the groups a ``Compact`` policy marks into a running summary,
            off the hot path (see :mod:`demote.summarize`). Without one, ``Compact``
            behaves as bulk eviction at ``limit + 2 * compact_count``.
        lease_ttl: Seconds a delivery lease lasts on stores shared across processes
            (Redis, Postgres), so a crashed worker cannot hold a conversation forever.
        cached_conversations: How many conversations keep their described window in
            memory (least recently loaded go first); a conversation without one is
            described again on its next load, which costs time, not correctness.
    """

    def __init__(
        self,
        policy: SlidingWindow,
        hook: object | None = None,
        *,
        state: StateStore | None = None,
        on_hook_error: Literal["log", "raise"] = "log",
        hook_timeout: float | None = None,
        summarizer: object | None = None,
        lease_ttl: float = 30.0,
        cached_conversations: int = 1_000,
    ) -> None:
        if not isinstance(policy, SlidingWindow):
            raise ConfigError(f"policy: expected a SlidingWindow, got {type(policy).__name__}")
        if on_hook_error not in ("log", "raise"):
            raise ConfigError(f"on_hook_error: must be 'log' or 'raise', got {on_hook_error!r}")
        if hook_timeout is not None and not hook_timeout > 0:
            raise ConfigError(f"hook_timeout: must be > 0 seconds, got {hook_timeout!r}")
        self.policy = policy
        self.hook: object = NoopHook() if hook is None else hook
        check_hook(self.hook)
        self.state: StateStore = InMemoryStateStore() if state is None else state
        self.on_hook_error = on_hook_error
        self.hook_timeout = hook_timeout
        if summarizer is not None:
            check_summarizer(summarizer)
        self.summarizer = summarizer
        self.tokens = TokenCache(policy.counter)
        self._background: set[Any] = set()
        self._background_lock = threading.Lock()
        self._lock = threading.Lock()
        self._gates: dict[str, object] = {}
        self._compacting: dict[str, object] = {}
        self._instance = uuid.uuid4().hex
        self.lease_ttl = lease_ttl
        self._epochs: dict[str, int] = {}
        self._epoch_clock = itertools.count(1)  # epochs are never reused, even after forget
        if isinstance(cached_conversations, bool) or not isinstance(cached_conversations, int):
            raise ConfigError(f"cached_conversations: must be an int, got {cached_conversations!r}")
        if cached_conversations < 1:
            raise ConfigError(f"cached_conversations: must be >= 1, got {cached_conversations}")
        self._views: OrderedDict[str, _View] = OrderedDict()
        self._views_max = cached_conversations

    # -- describing messages -------------------------------------------------------------

    def describe(
        self, role: Any, text: str, *, opens: Sequence[str] = (), answers: str | None = None
    ) -> MessageRecord:
        """Describe one message for the planner (adapters call this from ``to_core``)."""
        opens = tuple(opens)
        fp = fingerprint(role, text, opens, answers)
        return MessageRecord(role, text, fp, self.tokens.count(fp, text), opens, answers)

    def _records(
        self,
        conversation_id: str,
        messages: Sequence[T],
        lo: int,
        describe: Callable[[T], MessageRecord],
    ) -> _View:
        """A new view of ``messages[lo:]``, reusing the cached records of the same objects.

        The common case, the cached messages from ``lo`` on are the same objects and
        messages were appended, is checked in one C-level pass and describes only the
        appended messages; it also keeps the cached group index. Anything else (a message
        replaced, the history shorter, ``lo`` before the cache) reuses records one by one
        and drops the index.
        """
        lo = min(lo, len(messages))
        # A list's slice is a fresh list; anything else is copied so the cache owns it.
        raws = messages[lo:] if type(messages) is list else list(messages[lo:])
        view = self._views.get(conversation_id)
        index = None
        if view is None:
            records = [describe(m) for m in raws]
        else:
            vb, vraws, vrecs = view.base, view.raws, view.records
            skip = lo - vb
            kept = len(vraws) - skip  # cached messages from lo on
            if (
                skip >= 0
                and 0 <= kept <= len(raws)
                and all(map(operator.is_, raws, itertools.islice(vraws, skip, None)))
            ):
                records = vrecs[skip:]
                if kept < len(raws):
                    records.extend(map(describe, raws[kept:]))
                index = view.index
            else:
                vn = len(vraws)
                records = []
                for i, m in enumerate(raws, lo):
                    j = i - vb
                    records.append(vrecs[j] if 0 <= j < vn and vraws[j] is m else describe(m))
        left_base, left = (0, ()) if view is None else (view.left_base, view.left)
        if view is not None and 0 < lo - view.base <= len(view.records):
            left = (*left, *(r.fingerprint for r in view.records[: lo - view.base]))
            left = left[-_LEFT_KEPT:]
            left_base = lo - len(left)
        view = _View(lo, raws, records, index, left_base, left)
        with self._lock:
            views = self._views
            views[conversation_id] = view
            views.move_to_end(conversation_id)
            if len(views) > self._views_max:
                views.popitem(last=False)
        return view

    def _is_stale(
        self,
        cid: str,
        messages: Sequence[T],
        describe: Callable[[T], MessageRecord],
        state: ConversationState,
    ) -> bool:
        """Is ``messages`` an older copy of the history (its last message is one we saw)?

        Only a copy shorter than the window start or than the history the view last saw
        can be one; the common load, as long as both, costs two comparisons.
        """
        n = len(messages)
        view = self._views.get(cid)
        if n >= state.window_start and (view is None or n >= view.base + len(view.records)):
            return False
        if n == 0:
            return True
        if view is None:
            return False
        i, fp = n - 1, describe(messages[n - 1]).fingerprint
        if view.base <= i < view.base + len(view.records):
            return view.records[i - view.base].fingerprint == fp
        j = i - view.left_base
        return 0 <= j < len(view.left) and view.left[j] == fp

    def _snapshot_window(
        self,
        cid: str,
        messages: Sequence[T],
        describe: Callable[[T], MessageRecord],
        state: ConversationState,
    ) -> Window[T]:
        """The window of a stale copy: nothing delivered or committed.

        A copy shorter than the window start is planned on its own (what its cut leaves
        out was demoted); a longer one gets the committed window, ending where it ends.
        """
        n = len(messages)
        if n < state.window_start:
            p = plan(self.policy, ConversationState(), [describe(m) for m in messages])
            summary = state.summary if state.summarized <= n else None
            return self._window(cid, messages, p.pinned, p.window_start, summary)
        if state.window_start > state.pinned:
            return self._window(cid, messages, state.pinned, state.window_start, state.summary)
        pinned = 0  # nothing demoted yet: the window starts after the pinned prefix as it is
        if self.policy.pin_system:
            while pinned < n and describe(messages[pinned]).role == "system":
                pinned += 1
        return self._window(cid, messages, pinned, pinned, state.summary)

    # -- loading --------------------------------------------------------------------------

    def load(
        self,
        conversation_id: str,
        messages: Sequence[T],
        describe: Callable[[T], MessageRecord],
    ) -> Window[T]:
        """Plan the window, deliver newly demoted messages, commit, return the window."""
        return drive_sync(self._flow(conversation_id, messages, describe))

    async def aload(
        self,
        conversation_id: str,
        messages: Sequence[T],
        describe: Callable[[T], MessageRecord],
    ) -> Window[T]:
        """Async :meth:`load`: the hook is awaited (a sync hook runs in a thread)."""
        return await drive_async(self._flow(conversation_id, messages, describe))

    def _flow(
        self,
        conversation_id: str,
        messages: Sequence[T],
        describe: Callable[[T], MessageRecord],
    ) -> Flow[Window[T]]:
        cid = conversation_id
        if type(cid) is not str or cid not in self._epochs:  # known ids were validated
            cid = validate_conversation_id(conversation_id)
        token = object()
        epoch, holder = self._enter(cid, token)
        resynced = unconfirmed = False  # re-synced, and not (yet) committed
        view: _View | None = None
        try:
            stored = self.state.get(cid)
            state = stored or ConversationState()
            if self._is_stale(cid, messages, describe, state):
                # A request that read the history before a newer one appended to it: not a
                # rewrite, and not the current history either. Serve it, change nothing.
                return self._snapshot_window(cid, messages, describe, state)
            view = self._records(cid, messages, needed_from(state), describe)
            records, base = view.records, view.base
            p = plan(self.policy, state, records, base=base, index=view.index)
            if p.rewritten:
                logger.warning(
                    "demote: history of conversation %r no longer matches its demotion "
                    "state (%d messages, window started at %d); re-syncing",
                    cid,
                    len(messages),
                    state.window_start,
                )
                state = ConversationState(generation=state.generation + 1)
                view = self._records(cid, messages, 0, describe)
                records, base = view.records, view.base
                p = plan(self.policy, state, records, base=0)  # no index: rewritten
                resynced = unconfirmed = True
            view.index = p.index
            new_state = self._advance(state, p, records, base)
            # The committed window: before anything is demoted it starts right after the
            # pinned prefix as it is now (as the plan's does), which may have shrunk.
            committed = p.pinned if state.window_start <= state.pinned else state.window_start
            if not holder:  # another caller is delivering: the committed window, at once
                return self._window(cid, messages, p.pinned, committed, state.summary)
            compacting = self.summarizer is not None and isinstance(self.policy.eviction, Compact)
            if compacting and p.window_start > committed:
                logger.warning(
                    "demote: conversation %r reached limit + 2 x compact_count before "
                    "a summary was ready; falling back to bulk eviction (messages go to the hook)",
                    cid,
                )
            demoted = 0
            if p.deliver and type(self.hook) is NoopHook:  # it keeps nothing: no batch
                demoted = len(p.deliver)
            elif p.deliver:
                # After a re-sync the watermark restarted at 0: what the hook already holds
                # from before the rewrite must not be offered again, now or on later loads.
                known = resynced or state.generation > 0
                batch = self._batch(cid, messages, records, base, p.deliver, skip_known=known)
                if batch.messages:
                    try:
                        yield Deliver(self.hook, batch, self.hook_timeout)
                    except Exception as exc:
                        self._hook_failed(cid, batch, exc)
                        return self._window(cid, messages, p.pinned, committed, state.summary)
                    demoted = len(batch.messages)
            # _advance returns ``state`` itself when nothing moved, and ``state`` is the
            # stored one (or a fresh one, when none is stored) unless we re-synced.
            changed = resynced or new_state is not state
            if changed and not self._commit(cid, epoch, stored, new_state):
                return self._window(
                    cid, messages, p.pinned, p.window_start, new_state.summary, demoted
                )
            if changed:
                stored = new_state
                unconfirmed = False
            if p.compact is not None and self.summarizer is not None:
                job_token = object()
                with self._lock:
                    idle = cid not in self._compacting
                    if idle:
                        self._compacting[cid] = job_token
                if idle:
                    job = self._compact(
                        cid, job_token, epoch, stored, new_state, records, base, p, messages
                    )
                    try:
                        yield Spawn(job, self._background, self._background_lock)
                    except Exception:
                        self._release(self._compacting, cid, job_token)
                        raise
            return self._window(cid, messages, p.pinned, p.window_start, new_state.summary, demoted)
        finally:
            if unconfirmed:
                # The view holds a history the committed state does not describe: a later
                # load of it must not pass for a stale copy (whose window hides messages).
                with self._lock:
                    if self._views.get(cid) is view:
                        del self._views[cid]
            if holder:
                self._release_gate(cid, token)

    def _compact(
        self,
        cid: str,
        token: object,
        epoch: int,
        expected: ConversationState | None,
        state: ConversationState,
        records: list[MessageRecord],
        base: int,
        p: Plan,
        messages: Sequence[Any],
    ) -> Flow[None]:
        """Background job: summarize the pending groups, then commit and deliver them.

        Summarizing holds only the conversation's compaction slot (one summary at a time),
        so loads keep delivering meanwhile and the bulk fallback stays possible. Committing
        and delivering take the in-flight gate like a load does; if the state moved on
        while the summary was written, the summary is discarded and a later load retries.
        """
        assert p.compact is not None
        lo, hi = p.compact
        gate = object()
        holder = False
        try:
            try:
                summary = yield Summarize(
                    self.summarizer, state.summary, records[lo - base : hi - base]
                )
            except Exception as exc:
                logger.warning(
                    "demote: summarizer failed for conversation %r (retried on a later load): %r",
                    cid,
                    exc,
                )
                return
            for _ in range(_GATE_POLLS):
                with self._lock:
                    if self._epochs.get(cid) != epoch:
                        return
                holder = self._try_gate(cid, gate)
                if holder:
                    break
                yield Sleep(_GATE_POLL_SECONDS)
            if not holder:
                logger.info("demote: summary for %r discarded (conversation busy)", cid)
                return
            compacted = replace(
                state,
                summary=summary,
                summarized=hi,
                window_start=hi,
                anchor=records[hi - 1 - base].fingerprint,
            )
            if not self._commit(cid, epoch, expected, compacted):
                return
            batch = self._batch(cid, messages, records, base, range(state.delivered, hi))
            if batch.messages:
                try:
                    yield Deliver(self.hook, batch, self.hook_timeout)
                except Exception as exc:  # covered by the summary; next load retries
                    self._hook_failed(cid, batch, exc, reraise=False)
                    return
            self._commit(cid, epoch, compacted, replace(compacted, delivered=hi))
        finally:
            if holder:
                self._release_gate(cid, gate)
            self._release(self._compacting, cid, token)

    def _enter(self, cid: str, token: object) -> tuple[int, bool]:
        """The conversation's epoch (made on first use), and :meth:`_try_gate`, in one lock."""
        with self._lock:
            epoch = self._epochs.get(cid)
            if epoch is None:
                epoch = self._epochs[cid] = next(self._epoch_clock)
            if cid in self._gates:
                return epoch, False
            self._gates[cid] = token
        return epoch, self._lease(cid, token)

    def _try_gate(self, cid: str, token: object) -> bool:
        """Take the conversation's in-flight gate, and the store's lease if it has them."""
        with self._lock:
            if cid in self._gates:
                return False
            self._gates[cid] = token
        return self._lease(cid, token)

    def _lease(self, cid: str, token: object) -> bool:
        """Take the store's lease for a gate ``token`` holds; on failure, free the gate."""
        acquire = getattr(self.state, "acquire_lease", None)
        if acquire is None:
            return True
        try:
            leased = bool(acquire(cid, f"{self._instance}:{id(token)}", self.lease_ttl))
        except BaseException:
            self._release(self._gates, cid, token)
            raise
        if not leased:
            self._release(self._gates, cid, token)
        return leased

    def _release_gate(self, cid: str, token: object) -> None:
        release = getattr(self.state, "release_lease", None)
        try:
            if release is not None:
                release(cid, f"{self._instance}:{id(token)}")
        finally:
            self._release(self._gates, cid, token)

    def _release(self, slots: dict[str, object], cid: str, token: object) -> None:
        with self._lock:
            if slots.get(cid) is token:
                del slots[cid]

    def _hook_failed(
        self, cid: str, batch: Demotion, exc: Exception, *, reraise: bool = True
    ) -> None:
        if reraise and self.on_hook_error == "raise":
            if isinstance(exc, HookError):
                raise exc
            raise HookError(f"hook failed for conversation {cid!r}: {exc}") from exc
        logger.warning(
            "demote: hook failed for conversation %r (%d messages not yet delivered, "
            "retried on the next load): %r",
            cid,
            len(batch.messages),
            exc,
        )

    def _advance(
        self, state: ConversationState, p: Plan, records: list[MessageRecord], base: int
    ) -> ConversationState:
        start = p.window_start
        anchor = records[start - 1 - base].fingerprint if start > p.pinned else None
        fresh = state.window_start <= state.pinned  # nothing was demoted before
        delivered = start if fresh else max(state.delivered, start)
        moved = (start, delivered, p.pinned, anchor)
        if moved == _watermarks(state):
            return state
        values = list(_state_values(state))  # dataclasses.replace, without its introspection
        for at, value in zip(_WATERMARK_AT, moved, strict=True):
            values[at] = value
        return ConversationState(*values)

    def _batch(
        self,
        cid: str,
        messages: Sequence[Any],
        records: list[MessageRecord],
        base: int,
        indexes: range,
        *,
        skip_known: bool = False,
    ) -> Demotion:
        out = []
        for i in indexes:
            rec = records[i - base]
            key = make_key(cid, i, rec.fingerprint)
            out.append(DemotedMessage(rec.role, rec.text, i, key, messages[i]))
        if skip_known and out:
            probe = getattr(self.hook, "has_keys", None)
            if probe is not None:
                known = set(probe(cid, [m.key for m in out]))
                out = [m for m in out if m.key not in known]
        return Demotion(cid, tuple(out))

    def _commit(
        self,
        cid: str,
        epoch: int,
        stored: ConversationState | None,
        new: ConversationState,
    ) -> bool:
        with self._lock:
            if self._epochs.get(cid) != epoch:
                logger.info("demote: discarding a stale commit for cleared conversation %r", cid)
                return False
            ok = self.state.compare_and_set(cid, stored, new)
        if not ok:
            logger.info("demote: conversation %r was advanced elsewhere; keeping theirs", cid)
        return ok

    @staticmethod
    def _window(
        cid: str,
        messages: Sequence[T],
        pinned: int,
        start: int,
        summary: str | None,
        demoted: int = 0,
    ) -> Window[T]:
        n = len(messages)
        start = min(start, n)
        if type(messages) is list:  # a list's slices are already fresh lists
            head, kept = messages[:pinned], messages[start:]
        else:
            head, kept = list(messages[:pinned]), list(messages[start:])
        return Window(cid, head, summary, kept, start, n, demoted)

    # -- lifecycle -------------------------------------------------------------------------

    def clear(self, conversation_id: str) -> None:
        """Reset the conversation's state (adapters call this when they clear history).

        A delivery still in flight for it finishes but commits nothing.
        """
        cid = validate_conversation_id(conversation_id)
        with self._lock:
            self._epochs[cid] = next(self._epoch_clock)
            self._gates.pop(cid, None)
            self._compacting.pop(cid, None)
            self._views.pop(cid, None)
            self.state.delete(cid)

    def forget(self, conversation_id: str) -> None:
        """Drop everything tracked for the conversation (state, caches, reservation)."""
        self.clear(conversation_id)
        with self._lock:
            self._epochs.pop(conversation_id, None)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait for background work started by sync loads (summaries); ``True`` if idle.

        Async loads run their background work as tasks: await :meth:`adrain` instead.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._background_lock:
                threads = [t for t in self._background if isinstance(t, threading.Thread)]
            if not threads:
                return True
            for thread in threads:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                thread.join(left)
                if thread.is_alive():
                    return False

    async def adrain(self, timeout: float | None = None) -> bool:
        """Await background tasks started by async loads (and threads of sync loads)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._background_lock:
                tasks = [t for t in self._background if isinstance(t, asyncio.Task)]
            if not tasks:
                break
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            _, pending = await asyncio.wait(tasks, timeout=left)
            if pending:
                return False
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return await asyncio.to_thread(self.drain, left)

    def tracked_conversations(self) -> int:
        """How many conversations have demotion state."""
        return self.state.count()

    def state_of(self, conversation_id: str) -> ConversationState:
        """The committed state of a conversation (a fresh one if it has none)."""
        cid = validate_conversation_id(conversation_id)
        return self.state.get(cid) or ConversationState()
