"""Which ``DemotingMemory`` read a request's messages came from (for :class:`DemotingLLM`).

A LlamaIndex agent builds each LLM request as ``[system prompt, *memory.aget(), *scratchpad]``
(``ReActAgent``: ``[ReAct header, *memory.aget(), *reasoning]``): the memory's messages go
in as the very objects the read returned. Every ``DemotingMemory`` read therefore records
what it returned (:func:`note`), and :func:`find` looks a request's messages up by identity:
the read they came from names the memory (its conversation, demoter, chat store) and where
the memory's part of the request begins and ends. Everything after it is the run's own
steps; everything before it, the agent's prefix.

While a run goes on, the memory's own reads (the agent reads it before every LLM call) see
only the stored history, shorter than what the LLM's load numbered (stored history plus
the run's steps). :func:`note_run` records that longer history per conversation, and the
memory's read loads it instead (:func:`run_history`), then shows only its stored part
(:func:`stored_part`): a load consistent with the committed state, which changes nothing,
where a shorter copy the engine cannot recognize as such would look like a rewrite. This
is per process: a run resumed elsewhere (``Context.to_dict``) may have one such read
re-synced, and the hook's idempotence on dedup keys keeps anything from being archived
twice.

The registry keeps the newest reads only (:data:`KEPT`), each holding its messages (so an
object's ``id`` cannot be reused while it is registered); a message returned by several
reads (a chat store's own object) points at the newest. A read is indexed by message
only at the first lookup after it (most reads are never looked up), so noting one is an
append. Lookups, and dropping the oldest reads, take one lock.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from llama_index.core.base.llms.types import ChatMessage

from demote.engine import Demoter, Window
from demote.records import MessageRecord

if TYPE_CHECKING:
    from llamaindex_demote._rendering import Parts


class ReadingMemory(Protocol):
    """What a read needs of the memory it came from (``DemotingMemory`` is one).

    A protocol, so this module does not import the memory that imports it.
    """

    chat_store_key: str

    @property
    def _p(self) -> Parts: ...

    def get_all(self) -> list[ChatMessage]: ...

    async def aget_all(self) -> list[ChatMessage]: ...


__all__ = [
    "KEPT",
    "RUNS",
    "Read",
    "ReadingMemory",
    "Run",
    "find",
    "note",
    "note_run",
    "run_history",
    "stored_part",
]

#: How many reads the registry keeps (the newest; a run needs only its memory's last).
KEPT = 256


@dataclass(frozen=True, slots=True, eq=False)
class Read:
    """One memory read: the memory, what it returned, and the caller's ``input``."""

    memory: ReadingMemory
    messages: tuple[ChatMessage, ...]
    input: str | None


_Noted = tuple[ReadingMemory, tuple[ChatMessage, ...], str | None]  # a Read not indexed yet

_lock = threading.Lock()
# The registered reads, oldest first: the indexed ones as Read, then the newest, not
# indexed yet, as plain tuples. A read is indexed by the first :func:`find` after it
# (most reads are never looked up: a chat engine's, or the memory's own read of a turn),
# so noting one costs a tuple and an append, not a dictionary entry per message.
_reads: deque[Read | _Noted] = deque()
_by_message: dict[int, Read] = {}  # id(message) -> the newest indexed read that returned it


def note(memory: ReadingMemory, messages: Sequence[ChatMessage], input: str | None) -> None:
    """Record that ``memory`` returned ``messages`` (the newest read of each object wins)."""
    # A deque's append is atomic, and an index stays put under it: _index (under the lock)
    # sees the newest reads now or at the next find. Only dropping takes the lock.
    _reads.append((memory, tuple(messages), input))
    if len(_reads) > KEPT:
        with _lock:
            _forget_oldest()


def _forget_oldest() -> None:
    """Drop the oldest reads past :data:`KEPT` (``_lock`` held)."""
    while len(_reads) > KEPT:
        old = _reads.popleft()
        if isinstance(old, Read):  # (else never indexed: no message points at it)
            for m in old.messages:
                if _by_message.get(id(m)) is old:
                    del _by_message[id(m)]


def _index() -> None:
    """Index the reads noted since the last lookup, oldest first (``_lock`` held)."""
    first = len(_reads)
    while first and not isinstance(_reads[first - 1], Read):
        first -= 1
    for k in range(first, len(_reads)):
        noted = _reads[k]
        read = noted if isinstance(noted, Read) else Read(*noted)
        _reads[k] = read
        for m in read.messages:
            _by_message[id(m)] = read


def find(messages: Sequence[ChatMessage]) -> tuple[Read, int, int] | None:
    """The read whose messages ``messages`` holds, and their span ``[start, end)``.

    The newest message of ``messages`` that a registered read returned names the read;
    the read's messages must then sit in ``messages`` in one run, as returned. ``None``
    when no read is found or its messages are not there as one run (the request was not
    built from a ``DemotingMemory`` read).
    """
    with _lock:
        if _reads and not isinstance(_reads[-1], Read):
            _index()
        for j in range(len(messages) - 1, -1, -1):
            read = _by_message.get(id(messages[j]))
            if read is None:
                continue
            held = read.messages
            at = next((k for k, m in enumerate(held) if m is messages[j]), None)
            if at is None:  # pragma: no cover - the registry maps only held objects
                return None
            start = j - at
            end = start + len(held)
            if start < 0 or end > len(messages):
                return None
            if all(a is b for a, b in zip(held, messages[start:end], strict=True)):
                return read, start, end
            return None
    return None


@dataclass(frozen=True, slots=True, eq=False)
class Run:
    """The history an LLM call of a run loaded: ``stored`` messages, then the run's steps."""

    demoter: Demoter
    stored: int
    last: str | None  # fingerprint of the last stored message
    history: list[ChatMessage]
    describe: Callable[[ChatMessage], MessageRecord]
    reserved: int = 0  # what the call counted besides the history (prefix, tools, recall)


_runs: OrderedDict[tuple[int, str], Run] = OrderedDict()
#: The recorded runs: empty (false) until a :class:`DemotingLLM` call records one, so a
#: read without any can skip :func:`run_history`.
RUNS: Mapping[tuple[int, str], Run] = _runs


def note_run(run: Run, conversation_id: str) -> None:
    """Record the history the newest LLM call of ``conversation_id``'s run loaded."""
    key = (id(run.demoter), conversation_id)
    with _lock:
        _runs[key] = run
        _runs.move_to_end(key)
        while len(_runs) > KEPT:
            _runs.popitem(last=False)


def run_history(
    demoter: Demoter,
    conversation_id: str,
    stored: Sequence[ChatMessage],
    describe: Callable[[ChatMessage], MessageRecord],
) -> tuple[list[ChatMessage], Callable[[ChatMessage], MessageRecord], int] | None:
    """``stored`` and the steps of the run in flight over it, as that run's call read them.

    With how to describe them and the tokens that call reserved. ``None`` unless an LLM
    call of a run loaded exactly ``stored`` (its length and last message) followed by
    steps: the memory then reads what that call read, as it read it.
    """
    with _lock:
        run = _runs.get((id(demoter), conversation_id))
    if run is None or run.demoter is not demoter or run.stored != len(stored):
        return None
    if len(run.history) == run.stored:
        return None
    if stored and describe(stored[-1]).fingerprint != run.last:
        return None
    return [*stored, *run.history[run.stored :]], run.describe, run.reserved


def stored_part(window: Window[ChatMessage], stored: int) -> Window[ChatMessage]:
    """``window`` as a read of the first ``stored`` messages shows it (no run steps)."""
    kept = window.messages[: max(0, stored - window.start)]
    return dataclasses.replace(window, messages=kept, total=stored)
