"""``Mem0Capture``: each new user turn to mem0's ``add``, through a background Recorder."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from demote._closing import Closing
from demote.capture.dispatch import RecorderStats
from demote.capture.recorder import Recorder
from demote.errors import HookError
from demote.flow import Flow
from demote.mem0._drivers import _KnownKeys, _Mem0, _Mem0Tier
from demote.mem0.config import CONVERSATION_FIELD, KEY_FIELD, Namespace
from demote.records import CapturedTurn, DemotedMessage

__all__ = ["AsyncMem0Writer", "Mem0Capture", "Mem0Writer"]


class Mem0Capture(Closing):
    """Sends each new user turn to mem0 (``memory.add``) through a background Recorder.

    :meth:`capture` returns at once; the Recorder's worker calls mem0, so a slow extraction
    never blocks a turn. Only ``user`` turns with text are sent, each once per process.

    Args:
        memory: A ``mem0.Memory``, ``mem0.AsyncMemory``, ``mem0.MemoryClient`` or
            ``mem0.AsyncMemoryClient``.
        user_id: Fixed mem0 ``user_id`` (default namespace only).
        agent_id: Fixed mem0 ``agent_id`` (default namespace only).
        infer: Let mem0 extract facts (default) or store the turn verbatim.
        prompt: Custom extraction instructions (mem0's ``prompt``; the hosted API's
            ``custom_instructions``).
        metadata: Extra metadata stored with every memory.
        namespace: Conversation id to mem0 entity ids; see :func:`conversation_namespace`.
        recorder: Builds the Recorder from the sink, e.g.
            ``lambda sink: Recorder(sink, outbox=SQLiteOutbox("capture.db"))``; default
            ``Recorder``. It is started here and closed by :meth:`close`.

    Erase: its part is the Recorder (:meth:`parts`), whose part is the :class:`Mem0Writer`
    (or :class:`AsyncMem0Writer`) that calls mem0, so :func:`demote.erase.tiers` finds two
    tiers: the Recorder drops the conversation's queued turns, then the writer deletes its
    memories.
    """

    def __init__(
        self,
        memory: Any,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        infer: bool = True,
        prompt: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        namespace: Namespace | None = None,
        recorder: Callable[[Any], Recorder] = Recorder,
    ) -> None:
        self._mem = _Mem0(memory, user_id, agent_id, namespace)
        self._infer = infer
        self._prompt = prompt
        self._metadata = dict(metadata or {})
        self._known = _KnownKeys(4096)
        # An async memory gets an async sink: the Recorder runs it on its worker's own loop.
        writer = AsyncMem0Writer(self) if self._mem.is_async else Mem0Writer(self)
        self._recorder = recorder(writer)
        self._recorder.start()

    @property
    def stats(self) -> RecorderStats:
        """The Recorder's counters."""
        return self._recorder.stats

    def parts(self) -> tuple[Recorder]:
        """The Recorder, a tier whose own part is the writer (see :mod:`demote.erase`)."""
        return (self._recorder,)

    def capture(self, turn: CapturedTurn) -> None:
        """Queue ``turn`` for mem0; returns at once. Non-user and blank turns are ignored."""
        if turn.role != "user" or not turn.text.strip():
            return
        self._mem.scope(turn.conversation_id)  # a bad id fails here, not in the worker
        if self._known.claim(turn.conversation_id, turn.key):
            self._recorder.enqueue(turn)

    def write(self, turn: CapturedTurn) -> None:
        """The Recorder's sink: one blocking ``memory.add`` for ``turn``, unless stored.

        Raises:
            HookError: mem0 failed (the Recorder retries or drops it, as configured).
        """
        self._mem.run(self._write(turn), HookError)

    async def awrite(self, turn: CapturedTurn) -> None:
        """Async :meth:`write`.

        Raises:
            HookError: mem0 failed (the Recorder retries or drops it, as configured).
        """
        await self._mem.arun(self._write(turn), HookError)

    def _write(self, turn: CapturedTurn) -> Flow[None]:
        cid = turn.conversation_id
        scope = self._mem.scope(cid)
        # An outbox re-delivers after a crash: skip a turn whose memories are already there.
        stored = yield from self._mem.stored_keys(self._known, cid, scope, KEY_FIELD, [turn.key])
        if turn.key in stored:
            return
        meta = {
            **self._metadata,
            CONVERSATION_FIELD: cid,
            KEY_FIELD: turn.key,
            "demote_index": turn.index,
        }
        message = DemotedMessage(role="user", text=turn.text, index=turn.index, key=turn.key)
        yield self._mem.add_call(scope, [message], meta, self._infer, self._prompt)

    def close(self) -> None:
        """Drain the queue (up to the Recorder's ``flush_timeout``) and stop the worker."""
        self._recorder.close()


class _Writer(_Mem0Tier):
    def __init__(self, capture: Mem0Capture) -> None:
        self._capture = capture
        self._mem = capture._mem
        self._known = capture._known


class Mem0Writer(_Writer):
    """The sink of a :class:`Mem0Capture`'s Recorder (sync memory): writes, erases.

    ``erase`` / ``aerase`` delete the conversation's memories as :meth:`Mem0Hook.erase
    <demote.mem0.Mem0Hook.erase>` does, and forget the capture's keys of it.
    """

    def deliver(self, turn: CapturedTurn) -> None:
        """Write ``turn`` (:meth:`Mem0Capture.write`)."""
        self._capture.write(turn)


class AsyncMem0Writer(_Writer):
    """:class:`Mem0Writer` for an async memory: the Recorder awaits it on its own loop."""

    async def adeliver(self, turn: CapturedTurn) -> None:
        """Write ``turn`` (:meth:`Mem0Capture.awrite`)."""
        await self._capture.awrite(turn)
