"""The demotion engine: load -> plan -> deliver -> commit.

Theory of operation
-------------------
Adapters call :meth:`Demoter.load` (or :meth:`Demoter.aload`) on every read with the
conversation's full history and a function that describes one message as a
:class:`~demote.records.MessageRecord`. A load reads the committed state and runs the pure
planner; if the plan moves the window, or messages are *pending* (they left the window but
the hook has not accepted them), it takes the conversation's gate and lease (never waiting
for either), hands the pending messages to the hook in batches and commits with one fenced
compare-and-set; it returns the window: pinned system messages, the committed summary, the
kept messages. A hook failure moves nothing back: the window start is committed anyway,
the watermark stays behind the undelivered messages, and the conversation backs off. The
five steps, one by one, are told in :mod:`demote.engine._loading`.

Every message is therefore, at all times, in the window, covered by the committed
summary, delivered to the hook, or pending and retried. The inner store (the source of
truth) is never touched.

Every I/O of a load (the state read, the lease, the hook, the commit) is an operation
yielded by one generator (``Loader.flow``) and performed by two short drivers, one
blocking, one awaiting (:mod:`demote.flow`), so the async path never blocks an
event loop. A sync hook that must not block past ``hook_timeout`` (or must not block an
event loop) runs on the engine's own threads (:mod:`demote.engine._runner`); a call that
outlives its wait keeps the conversation busy, gate and lease, until it ends, so the same
messages are never handed to the hook twice at once. Leases are renewed by a keeper thread
while a hook runs; ``clear`` revokes them and leaves a tombstone one generation on, so a
delivery begun before it commits nothing after it.

This module holds the :class:`Demoter`'s public methods and its documented signature; its
construction (the arguments checked, the parts made and wired to each other) is its base,
:class:`~demote.engine._making.Making` (:mod:`demote.engine._making`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar

from demote._closing import Closing
from demote.engine._describing import describe_message
from demote.engine._making import Making
from demote.engine._stats import stats_of_conversation, stats_of_demoter
from demote.engine._work import FRESH
from demote.engine.result import Window
from demote.engine.retry import Backoff
from demote.erase import EraseReport
from demote.errors import ConfigError
from demote.events import (
    ConversationStats,
    DegradedSource,
    DemoteEvent,
    DemoterStats,
    Observer,
)
from demote.flow import Flow, drive_async, drive_sync
from demote.records import ConversationState, MessageRecord
from demote.state.base import StateStore, validate_conversation_id
from demote.window.policy import SlidingWindow

__all__ = ["Demoter"]

T = TypeVar("T")


class Demoter(Making, Closing):
    """Keeps each conversation's active window and demotes what falls out, once.

    One Demoter serves any number of conversations; share it across adapters.

    Args:
        policy: The window policy.
        hook: Where demoted messages go (``NoopHook`` if omitted): an object with
            ``deliver(batch)`` and/or ``async adeliver(batch)``, or a plain (or async)
            function, called with each :class:`~demote.records.Demotion` batch
            (``Demoter(policy, print)``; see :mod:`demote.hooks.simple`).
        state: Where watermarks live; ``InMemoryStateStore()`` if omitted, use
            ``SQLiteStateStore(path)`` to survive restarts and ``RedisStateStore`` or
            ``PostgresStateStore`` for a fleet of workers.
        on_hook_error: ``"log"`` (warn and return the window) or ``"raise"``
            (:class:`~demote.errors.HookError` to the caller that drove the delivery,
            after the window move is committed). Either way the messages stay pending and
            a later load retries them.
        hook_timeout: Seconds a hook call may take (``None``: no bound). A call that
            runs longer fails (its messages stay pending, with backoff); a sync hook's
            call cannot be stopped: it runs on in the engine's own thread and the
            conversation is not handed to the hook again until it ends.
        hook_wait: Seconds a load waits for the hook before it returns the window anyway
            (sync and async loads alike; ``None``: up to ``hook_timeout``). The call goes
            on in the background, holding the conversation (gate and lease), and its
            success is committed, so the messages are not handed over again. A local
            archive answers well within it and looks synchronous.
        summarizer: Folds the groups a ``Compact`` policy marks into a running summary,
            off the hot path (see :mod:`demote.summarize`). Without one, ``Compact``
            behaves as bulk eviction at ``limit + 2 * compact_count`` (logged once).
        lease_ttl: Seconds a delivery lease lasts on a shared store before another worker
            may take over; renewed while a hook runs. A finite number > 0.
        cached_conversations: How many conversations keep their described window in
            memory (least recently loaded go first); a conversation without one is
            described again on its next load, which costs time, not correctness.
        retry: How long a conversation whose hook failed waits before the next attempt.
        max_batch: Most messages handed to the hook in one batch (a backlog is delivered
            in several, each committed as it succeeds).
        hook_threads: Threads the engine keeps for sync hook calls with a timeout (or from
            async loads).
        hook_queue: Sync hook calls that may wait for a free hook thread when all are
            busy (more application threads than hook threads); a call beyond them, or one
            that has not started when ``hook_timeout`` runs out, is refused
            (:class:`~demote.errors.HookBusy`) and its messages stay pending.
        on_store_error: ``"degrade"`` (a load whose state store fails, times out, or is
            skipped by its circuit breaker returns a *degraded* window, see
            :attr:`Window.degraded`, reports a ``degraded`` event and logs a warning at
            most once a minute) or ``"raise"`` (the store's
            :class:`~demote.errors.StoreError` to the caller, as before; a store whose
            breaker is open raises :class:`~demote.errors.StoreUnavailable` at once).
            See :mod:`demote.backends.breaker` for the breaker's timings.
    """

    def __init__(
        self,
        policy: SlidingWindow,
        hook: object | None = None,
        *,
        state: StateStore | None = None,
        on_hook_error: Literal["log", "raise"] = "log",
        hook_timeout: float | None = 30.0,
        hook_wait: float | None = 0.25,
        summarizer: object | None = None,
        lease_ttl: float = 30.0,
        cached_conversations: int = 1_000,
        retry: Backoff | None = None,
        max_batch: int = 500,
        hook_threads: int = 8,
        hook_queue: int = 64,
        on_store_error: Literal["degrade", "raise"] = "degrade",
    ) -> None:
        self._make(
            policy,
            hook,
            state=state,
            on_hook_error=on_hook_error,
            hook_timeout=hook_timeout,
            hook_wait=hook_wait,
            summarizer=summarizer,
            lease_ttl=lease_ttl,
            cached_conversations=cached_conversations,
            retry=retry,
            max_batch=max_batch,
            hook_threads=hook_threads,
            hook_queue=hook_queue,
            on_store_error=on_store_error,
        )

    # -- describing messages -------------------------------------------------------------

    @property
    def on_hook_error(self) -> Literal["log", "raise"]:
        """What a failing hook does to a load (set at construction; read-only)."""
        return self._on_hook_error

    @property
    def on_store_error(self) -> Literal["degrade", "raise"]:
        """What a failing state store does to a load (set at construction; read-only)."""
        return self._on_store_error

    def describe(
        self,
        role: Any,
        text: str,
        *,
        opens: Sequence[str] = (),
        answers: str | None = None,
        tool: str | None = None,
        calls: Sequence[Mapping[str, Any]] = (),
        blocks: Sequence[object] = (),
        message: object = None,
        to_data: Callable[[Any], dict[str, Any]] | None = None,
    ) -> MessageRecord:
        """Describe one message for the planner (adapters call this from ``to_core``).

        The record's tokens are what a provider bills (:func:`demote.window.tokens.billed_tokens`:
        the text, ``calls``, ``blocks`` and ``answers``), or, with a
        :class:`~demote.window.tokens.MessageCounter`, that counter's count of ``message``;
        either is counted once per fingerprint, and the fingerprint covers the calls'
        names and arguments and the blocks (a text-only message keeps its old one).

        Args:
            role: ``system``, ``user``, ``assistant`` or ``tool``.
            text: The message text.
            opens: Ids of the tool calls it opens.
            answers: Id of the tool call it answers.
            tool: Name of the tool whose result it is.
            calls: Its tool calls, ``{"id", "name", "args"}`` each.
            blocks: Its content blocks other than text (images, audio, files,
                reasoning), in the neutral form.
            message: The framework message (counted by a whole-message counter only;
                not kept).
            to_data: Makes the neutral form from the framework message at delivery
                (kept on the record: one shared function, see
                ``MessageRecord.to_data``).

        Raises:
            ArgumentTypeError: ``text`` is not a str, ``opens`` not a sequence of str,
                ``answers`` or ``tool`` neither a str nor ``None``, ``calls`` not a
                sequence of mappings, ``blocks`` not a sequence, or ``to_data`` not
                callable.
            ConfigError: ``role`` is not one of the core's roles.
        """
        return describe_message(
            self.tokens, role, text, opens, answers, tool, calls, blocks, message, to_data
        )

    # -- loading --------------------------------------------------------------------------

    def load(
        self,
        conversation_id: str,
        messages: Sequence[T],
        describe: Callable[[T], MessageRecord],
        *,
        reserved: int = 0,
        pruned: range = range(0),
        fixed: int | None = None,
    ) -> Window[T]:
        """Plan the window, deliver what is pending, commit, return the window.

        Args:
            conversation_id: The conversation.
            messages: Its full history, oldest first.
            describe: Describes one message (the adapter's ``to_core``).
            reserved: Tokens the model is sent besides these messages that count toward
                a token limit (an agent's system prompt and tool definitions); the
                window leaves room for them. Ignored in other units.
            pruned: Positions absent from ``messages``, right after its pinned head (pruned
                once the hook accepted them, positions kept); the load reads none of them.
            fixed: The part of ``reserved`` every request carries unchanged (the system
                prompt, the tool definitions), as opposed to what grows (memory blocks).
                In a token window whose clipping size is not given, a message over half
                of what the limit leaves beside it is sent clipped, so the opener and the
                newest step fit beside it (rounded up to 128 tokens, so a prompt edited
                by a few words changes nothing). ``None``: all of ``reserved``.

        A load that leaves messages pending (the hook failed or was busy) hands the
        conversation to the background retries, which load it again until they are
        delivered, without waiting for its next load (see :mod:`demote.engine._pending`).

        Raises:
            ConfigError: ``reserved`` is not an int ``>= 0``, ``fixed`` not one up to
                ``reserved``, or ``pruned`` no range.
        """
        flow = self._retries.load(conversation_id, messages, describe, reserved, pruned, fixed)
        return drive_sync(flow)

    async def aload(
        self,
        conversation_id: str,
        messages: Sequence[T],
        describe: Callable[[T], MessageRecord],
        *,
        reserved: int = 0,
        pruned: range = range(0),
        fixed: int | None = None,
    ) -> Window[T]:
        """Async :meth:`load`: every store round trip and the hook are awaited.

        Its background retries, if any, run as tasks on this event loop while it runs.
        """
        flow = self._retries.load(conversation_id, messages, describe, reserved, pruned, fixed)
        return await drive_async(flow)

    # -- degraded loads -----------------------------------------------------------------------

    def report_degraded(
        self, conversation_id: str, source: DegradedSource, error: BaseException
    ) -> DemoteEvent:
        """Report a part of the memory layer that failed while the chat went on.

        Adapters call it when recall or capture fails: the ``degraded`` event goes to the
        observers (and is returned, for the framework's callbacks), and a warning is
        logged at most once a minute per ``source``.

        Args:
            conversation_id: The conversation.
            source: ``"recall"`` or ``"capture"`` (``"state"`` is the engine's own).
            error: What failed.

        Returns:
            The event.

        Raises:
            ConfigError: ``source`` is not one of those.
        """
        return self._degradation.report(conversation_id, source, error)

    # -- lifecycle -------------------------------------------------------------------------

    def clear(self, conversation_id: str) -> None:
        """Reset the conversation's demotion state (adapters call this when they clear).

        The store keeps a tombstone one generation on and revokes the conversation's
        lease, so a delivery still in flight for it, in any process, commits nothing.
        What the hook already holds stays there (see ``erase`` to remove it).
        """
        drive_sync(self._eraser.reset(conversation_id, "clear"))

    async def aclear(self, conversation_id: str) -> None:
        """Async :meth:`clear`."""
        await drive_async(self._eraser.reset(conversation_id, "clear"))

    def forget(self, conversation_id: str) -> None:
        """Drop everything tracked for the conversation: its state row, lease and caches."""
        drive_sync(self._eraser.reset(conversation_id, "delete"))

    async def aforget(self, conversation_id: str) -> None:
        """Async :meth:`forget`."""
        await drive_async(self._eraser.reset(conversation_id, "delete"))

    def erase(
        self,
        conversation_id: str,
        *,
        messages: Sequence[T] | None = None,
        describe: Callable[[T], MessageRecord] | None = None,
        wait: float | None = None,
        also: Sequence[object] = (),
        keys: Sequence[str] | None = None,
    ) -> EraseReport:
        """Forget the conversation everywhere: its state, and every tier behind the hook.

        Unlike :meth:`clear`, what the hook already holds is deleted too (see
        :mod:`demote.erase`). The adapters' ``erase`` also empties their inner store.

        Args:
            conversation_id: The conversation.
            messages: Its current history, with ``describe``: the keys derived from it
                are handed to tiers that delete by id (a LangChain vector store).
            describe: How to describe one message (as for :meth:`load`).
            wait: Seconds to wait for a delivery in flight to end (``lease_ttl`` by
                default) before taking over (see :attr:`EraseReport.took_over`).
            also: Other holders of the conversation, erased like the hook after it (its
                tiers reported after the hook's): the adapters pass their ``capture``.
            keys: Dedup keys to hand the tiers as well, for a caller that derives them
                itself (an agent thread whose front was pruned).

        Returns:
            What each tier did (:attr:`~demote.erase.EraseReport.tiers`), the state last
            (:attr:`~demote.erase.EraseReport.state`: ``removed`` ``0`` if the store did
            not hold the conversation); :attr:`~demote.erase.EraseReport.found` is
            ``False`` for an id nothing knew.
        """
        return drive_sync(self._eraser.erase(conversation_id, messages, describe, wait, also, keys))

    async def aerase(
        self,
        conversation_id: str,
        *,
        messages: Sequence[T] | None = None,
        describe: Callable[[T], MessageRecord] | None = None,
        wait: float | None = None,
        also: Sequence[object] = (),
        keys: Sequence[str] | None = None,
    ) -> EraseReport:
        """Async :meth:`erase` (stores and tiers are awaited)."""
        flow = self._eraser.erase(conversation_id, messages, describe, wait, also, keys)
        return await drive_async(flow)

    def seed(self, conversation_id: str, state: ConversationState) -> bool:
        """Replace the conversation's committed state with ``state``; ``True`` if stored.

        For adapters that keep their own record of what the hook accepted (the agents
        middleware's pruned prefix). One compare-and-set from the state read just before:
        ``False`` if a load committed in between (then nothing changed).
        """
        return drive_sync(self._seed(conversation_id, state))

    async def aseed(self, conversation_id: str, state: ConversationState) -> bool:
        """Async :meth:`seed`."""
        return await drive_async(self._seed(conversation_id, state))

    def _seed(self, conversation_id: str, state: ConversationState) -> Flow[bool]:
        cid = validate_conversation_id(conversation_id)
        if not isinstance(state, ConversationState):
            raise ConfigError(f"state: expected a ConversationState, got {type(state).__name__}")
        current = yield from self._delivery.store_op("get", cid)
        return bool((yield from self._delivery.store_op("compare_and_set", cid, current, state)))

    def drain(self, timeout: float | None = None) -> bool:
        """Deliver what is pending and wait for background work: at shutdown, or in tests.

        Every conversation this process left with pending messages is loaded again at
        once, whatever its retry backoff, and again while that helps; background work is
        waited for between rounds: a summary being written, a delivery that outlived
        ``hook_wait`` finishing (its commit or its retry), a background retry in
        progress. A hook that keeps failing is tried once, not until ``timeout`` (what is
        left is in :meth:`stats`; the background retries go on). ``timeout`` bounds the
        whole (``None``: no bound). Async loads run theirs as tasks: await
        :meth:`adrain` instead; a sync hook call whose task was cancelled (its event loop
        closed, as at the end of ``asyncio.run``) is followed on in a thread, which this
        waits for. Observers run on their own thread and are not waited for.

        Returns:
            ``True`` if nothing is left pending or running.
        """
        return drive_sync(self._retries.drain(timeout))

    async def adrain(self, timeout: float | None = None) -> bool:
        """Async :meth:`drain`: background tasks of async loads (and threads) are awaited."""
        return await drive_async(self._retries.drain(timeout))

    def tracked_conversations(self) -> int:
        """How many conversations have demotion state."""
        return self.state.count()

    def state_of(self, conversation_id: str) -> ConversationState:
        """The committed state of a conversation (a fresh one if it has none)."""
        cid = validate_conversation_id(conversation_id)
        return self.state.get(cid) or ConversationState()

    async def astate_of(self, conversation_id: str) -> ConversationState:
        """Async :meth:`state_of`."""
        cid = validate_conversation_id(conversation_id)
        return (await drive_async(self._delivery.store_op("get", cid))) or ConversationState()

    # -- observability ---------------------------------------------------------------------

    def observe(self, fn: Observer) -> Callable[[], None]:
        """Call ``fn(event)`` for every :class:`~demote.events.DemoteEvent` from now on.

        Observers run on one daemon thread of this Demoter's, in order: a load never waits
        for them, and one that raises is logged, never raised. Returns a function that
        unsubscribes ``fn``.
        """
        return self._observers.add(fn)

    def emit(self, *events: DemoteEvent) -> None:
        """Hand events made outside the engine (an adapter's recall) to the observers."""
        self._observers.publish(events)

    def stats(self) -> DemoterStats:
        """What this Demoter did since it was made (counts of this process)."""
        retrying, queued = len(self._retries), self._delivery.runner.queued
        return stats_of_demoter(self._tally, self.state.count(), retrying=retrying, queued=queued)

    def conversation_stats(self, conversation_id: str) -> ConversationStats:
        """One conversation's watermarks, pending messages and delivery health."""
        cid = validate_conversation_id(conversation_id)
        state = self.state.get(cid) or FRESH
        return stats_of_conversation(cid, state, self._tally, self._retry)

    async def aconversation_stats(self, conversation_id: str) -> ConversationStats:
        """Async :meth:`conversation_stats` (the store is awaited)."""
        cid = validate_conversation_id(conversation_id)
        state = (await drive_async(self._delivery.store_op("get", cid))) or FRESH
        return stats_of_conversation(cid, state, self._tally, self._retry)

    def close(self) -> None:
        """Stop the engine's threads (hook calls still running finish on their own).

        Messages still pending stay so, for the conversations' next loads: call
        :meth:`drain` first to deliver them.
        """
        self._retries.close()
        self._delivery.keeper.close()
        self._delivery.runner.close()
