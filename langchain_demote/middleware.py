"""``DemotingMiddleware``: demote's active window for LangChain v1 agents (``create_agent``).

Theory of operation
-------------------
The agent's checkpointer owns the full history (``state["messages"]``); the conversation
is the LangGraph thread. On every model call of a turn (a tool loop calls the model several
times on the same, growing state) :meth:`DemotingMiddleware.wrap_model_call`:

1. names the conversation: ``conversation_id(runtime)`` if given, else the LangGraph
   thread id, else (an agent invoked without a thread id, hence without a checkpointer)
   ``"first-message:" + id`` of the state's first message. LangGraph gives every message
   an id when it enters the state and the agent returns the messages with their ids, so
   passing ``result["messages"]`` back (plus the new turn) continues the same
   conversation, and every fresh ``invoke`` starts a new one. A history rebuilt without
   ids on every call is a new conversation every call: give it a thread id;
2. runs :meth:`demote.Demoter.load` over the messages the model node was given. The
   engine delivers what fell out of the window to the hook and commits its watermark, so a
   message re-read on the next model call of the same loop is not delivered again;
3. sends the model only the window: pinned system messages, the committed summary as one
   ``SystemMessage``, the kept messages, and (with ``recall``) one ``SystemMessage`` of
   recalled archive messages right before the newest human message. ``create_agent``'s
   ``system_prompt`` is not part of ``messages``; the model node puts it first;
4. leaves the state alone (``prune_state=False``, the default) or, with
   ``prune_state=True``, returns a ``Command`` alongside the model response that removes
   the messages the hook has already accepted.

What middleware after this one (inner) sees
-------------------------------------------
When the window holds every message of the request (nothing demoted yet, no summary, no
recall), the request is handed on untouched: the same ``ModelRequest`` object, the same
``messages`` list. An inner middleware's in-place edits then reach exactly what they
reach without demote (``create_agent`` writes a changed ``request.messages`` list back
to the agent state).

Otherwise the inner middleware gets ``request.override(messages=window)``: a new request
holding a new list (pinned, summary, kept messages, recall), whose messages are the
state's own objects. Of its in-place edits to that list:

- messages appended at its end are appended to the list this middleware was given, once
  the model call returns (as if the inner middleware had appended to it), so they reach
  the agent state as they would without demote;
- any other edit of the list (insert, remove, replace, reorder) reaches only that model
  call; to change the state, return a ``Command`` or use a ``before_model`` hook;
- edits to a message object itself are edits of the state's message (demote does not
  copy messages); demote describes each message object once, so such an edit does not
  change what demote has already recorded for it.

Windows start on turn-group boundaries, so the model is never sent a tool result without
its call, nor a call without its results (parallel calls included).

Sync and async share all of this: :meth:`DemotingMiddleware._prepare` is a generator that
yields its two I/O operations (the load, the recall search) and two short drivers run it,
one blocking, one awaiting (STYLE.md, habit 2).

Pruning and stable positions
----------------------------
Dedup keys hold a message's absolute position, so pruning the front of the history must
not shift positions. The state records the pruned prefix in a private field,
``demote_pruned = {"pinned": p, "removed": n}``: the ``p`` leading system messages are
kept, the next ``n`` messages were removed. The engine is given a view of length
``n + len(messages)`` whose absolute index ``i`` maps to ``messages[i]`` below ``p`` and to
``messages[i - n]`` from ``p + n`` on. The engine reads only from ``needed_from(state)``,
which never goes below the watermark minus one, and a prune removes only messages below
``delivered - 1`` (the message just before the watermark is kept: it is the engine's
anchor for rewrite detection), so the pruned positions are never read.

Where the count lives: in the checkpoint, written by the same ``Command`` that removes the
messages. Removal and count are therefore one atomic state update, are per thread by
construction, survive restarts with a durable checkpointer, and rewind together under
LangGraph time travel. (The count cannot be derived from the demotion state alone: the
watermark moves on after a prune, and the next prune happens one model call later.) If
the demotion state does not cover the pruned prefix (a non-durable state store after a
restart, ``Demoter.clear``), it is re-seeded from the checkpoint: everything up to the
kept anchor was delivered before it was pruned.
"""

from __future__ import annotations

import asyncio
import logging
import operator
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NotRequired, TypedDict, cast, overload

try:
    import langchain.agents  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    from demote.errors import MissingExtraError

    raise MissingExtraError("langchain", "agents") from exc

from langchain.agents.middleware.types import (
    AgentMiddleware,
    AgentState,
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
    PrivateStateAttr,
)
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
)
from langgraph.config import get_config
from langgraph.runtime import Runtime
from langgraph.types import Command

from demote._flow import drive_async, drive_sync
from demote.engine import Demoter, Window
from demote.errors import ConfigError, ConversationIdError, DemoteError
from demote.hooks.base import Recall
from demote.records import ConversationState, MessageRecord, Recalled
from langchain_demote.messages import from_core, message_role, message_text, to_core

__all__ = [
    "FIRST_MESSAGE_PREFIX",
    "RECALL_PREFIX",
    "DemotingAgentState",
    "DemotingMiddleware",
    "PrunedPrefix",
    "first_message_conversation_id",
    "render_recall",
    "thread_conversation_id",
]

logger = logging.getLogger("demote")

#: How recalled archive messages are introduced to the model (one system message).
RECALL_PREFIX = "Relevant earlier messages from this conversation:\n"

_PRUNED_KEY = "demote_pruned"

#: How the conversation id of an agent invoked without a thread id begins.
FIRST_MESSAGE_PREFIX = "first-message:"


class PrunedPrefix(TypedDict):
    """What ``prune_state=True`` removed from the front of a thread's messages.

    Attributes:
        pinned: Leading system messages kept in front (never pruned).
        removed: Messages removed right after them, all delivered to the hook.
    """

    pinned: int
    removed: int


class DemotingAgentState(AgentState[Any]):
    """The agent state with the middleware's private pruning record (never input/output)."""

    demote_pruned: NotRequired[Annotated[PrunedPrefix, PrivateStateAttr]]


def render_recall(recalled: Sequence[Recalled]) -> str:
    """The text of the one system message that carries recalled archive messages.

    Args:
        recalled: Messages read back from the long tail, in any order.

    Returns:
        ``RECALL_PREFIX`` then one ``[role] text`` line per message, oldest first.
    """
    ordered = sorted(recalled, key=lambda r: r.index)
    return RECALL_PREFIX + "\n".join(f"[{r.role}] {r.text}" for r in ordered)


def _thread_id(runtime: Runtime[Any]) -> str | None:
    info = getattr(runtime, "execution_info", None)
    thread_id = getattr(info, "thread_id", None)
    if thread_id is None:
        try:
            thread_id = get_config().get("configurable", {}).get("thread_id")
        except RuntimeError:  # not inside a runnable
            thread_id = None
    return None if thread_id is None else str(thread_id)


def thread_conversation_id(runtime: Runtime[Any]) -> str:
    """The LangGraph thread id of the running agent.

    Args:
        runtime: The model node's runtime.

    Returns:
        The thread id as a string.

    Raises:
        ConversationIdError: The agent was invoked without a thread id.
    """
    thread_id = _thread_id(runtime)
    if thread_id is None:
        raise ConversationIdError(
            "the agent was invoked without a thread id: invoke it with "
            "config={'configurable': {'thread_id': ...}}"
        )
    return thread_id


def first_message_conversation_id(messages: Sequence[BaseMessage]) -> str:
    """The conversation id of an agent invoked without a thread id.

    ``"first-message:"`` followed by the id of the first message in the agent state.
    LangGraph gives every message an id as it enters the state, so the id holds for as
    long as the caller passes the returned messages back, and differs between two
    conversations even when they start with the same words.

    Args:
        messages: The agent state's messages (``state["messages"]``).

    Returns:
        The conversation id.

    Raises:
        ConversationIdError: There is no message, or the first one has no id.
    """
    first = messages[0] if messages else None
    if first is None or not first.id:
        raise ConversationIdError(
            "DemotingMiddleware: the agent has no thread id and its first message no id to "
            "name the conversation by; invoke it with config={'configurable': "
            "{'thread_id': ...}}, or pass conversation_id="
        )
    return FIRST_MESSAGE_PREFIX + first.id


class _PrunedView(Sequence[BaseMessage]):
    """The thread's messages at their absolute positions, with the pruned prefix absent.

    Index ``i`` is ``messages[i]`` below ``pinned``, and ``messages[i - removed]`` from
    ``pinned + removed`` on. Reading a pruned position is a bug (the engine never reads
    below the watermark), so it raises instead of inventing a message.
    """

    __slots__ = ("_messages", "_pinned", "_removed")

    def __init__(self, messages: Sequence[BaseMessage], pinned: int, removed: int) -> None:
        self._messages = messages
        self._pinned = pinned
        self._removed = removed

    def __len__(self) -> int:
        return len(self._messages) + self._removed

    @overload
    def __getitem__(self, index: int) -> BaseMessage: ...

    @overload
    def __getitem__(self, index: slice) -> list[BaseMessage]: ...

    def __getitem__(self, index: int | slice) -> BaseMessage | list[BaseMessage]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(index)
        if i < self._pinned:
            return self._messages[i]
        if i < self._pinned + self._removed:
            raise DemoteError(
                f"message {i} was pruned from the agent state; the demotion state no longer "
                "covers it (was the thread's history rewritten below its pruned prefix?)"
            )
        return self._messages[i - self._removed]


# -- the I/O a preparation needs, and its two drivers -------------------------------------


@dataclass(slots=True)
class _Load:
    """Load the window (the engine delivers and commits)."""

    demoter: Demoter
    conversation_id: str
    messages: Sequence[BaseMessage]
    describe: Callable[[BaseMessage], MessageRecord]

    def run_sync(self) -> Window[BaseMessage]:
        return self.demoter.load(self.conversation_id, self.messages, self.describe)

    async def run_async(self) -> Window[BaseMessage]:
        return await self.demoter.aload(self.conversation_id, self.messages, self.describe)


@dataclass(slots=True)
class _Search:
    """Search the long tail (``asearch`` when the recall has one, else a worker thread)."""

    recall: Recall
    conversation_id: str
    query: str
    k: int

    def run_sync(self) -> list[Recalled]:
        return list(self.recall.search(self.conversation_id, self.query, self.k))

    async def run_async(self) -> list[Recalled]:
        asearch = getattr(self.recall, "asearch", None)
        if asearch is not None:
            return list(await asearch(self.conversation_id, self.query, self.k))
        return await asyncio.to_thread(self.run_sync)


@dataclass(frozen=True, slots=True)
class _Prepared:
    """The request to send and the state update to return with the response.

    ``request`` is ``origin`` itself when the window is the whole request; otherwise
    ``sent`` is what its list held when it was handed on.
    """

    request: ModelRequest[Any]
    origin: ModelRequest[Any]
    sent: tuple[BaseMessage, ...]
    update: dict[str, Any] | None

    def finish(
        self, response: ModelResponse[Any]
    ) -> ModelResponse[Any] | ExtendedModelResponse[Any]:
        if self.request is not self.origin:
            self._mirror_appends()
        if self.update is None:
            return response
        return ExtendedModelResponse(model_response=response, command=Command(update=self.update))

    def _mirror_appends(self) -> None:
        """Messages an inner middleware appended to the window, appended to the original."""
        now, n = self.request.messages, len(self.sent)
        target = self.origin.messages
        if len(now) > n and isinstance(target, list) and all(map(operator.is_, now, self.sent)):
            target.extend(now[n:])


@dataclass(slots=True)
class _Call:
    """Call an engine method: ``sync(*args)`` blocking, ``asynchronous(*args)`` awaited."""

    sync: Callable[..., Any]
    asynchronous: Callable[..., Any]
    args: tuple[Any, ...]

    def run_sync(self) -> Any:
        return self.sync(*self.args)

    async def run_async(self) -> Any:
        return await self.asynchronous(*self.args)


_Flow = Generator[_Load | _Search | _Call, Any, _Prepared]


class DemotingMiddleware(AgentMiddleware[DemotingAgentState, Any, Any]):
    """Keeps an agent's model calls to demote's active window, on the shared engine.

    Example::

        agent = create_agent(
            model,
            tools,
            checkpointer=InMemorySaver(),
            middleware=[DemotingMiddleware(demoter=demoter, recall=archive)],
        )
        agent.invoke({"messages": [...]}, {"configurable": {"thread_id": "t1"}})

    Put it first in ``middleware`` (outermost), so that the messages it numbers are the
    thread's own and other middleware sees the window.

    Args:
        demoter: The engine: policy, hook and state store (share it across agents).
        recall: Optional long-tail reader (``search(conversation_id, query, k)``, such as
            ``SQLiteArchive``); its hits for the newest human message are sent as one
            system message right before it. A failing search is logged and skipped.
        recall_k: How many recalled messages to send at most.
        conversation_id: Names the conversation from the model node's runtime. By
            default: the LangGraph thread id, or without one
            :func:`first_message_conversation_id` (see the module docstring). Two agents
            sharing a thread need distinct names
            (``lambda rt: thread_conversation_id(rt) + "/researcher"``).
        prune_state: Remove messages from the agent state once the hook has accepted
            them (the default keeps the full history in the checkpoint). Needs a thread
            id (a checkpointer): an agent invoked without one raises
            :class:`~demote.errors.ConversationIdError`.
        recall_role: The role of the recall message: ``"system"`` (default), or
            ``"human"`` for providers that accept system messages only at the start
            (Anthropic's chat models do).

    Raises:
        ConfigError: An option is invalid.
    """

    state_schema = DemotingAgentState

    def __init__(
        self,
        demoter: Demoter,
        *,
        recall: Recall | None = None,
        recall_k: int = 4,
        conversation_id: Callable[[Runtime[Any]], str] | None = None,
        prune_state: bool = False,
        recall_role: Literal["system", "human"] = "system",
    ) -> None:
        super().__init__()
        if not isinstance(demoter, Demoter):
            raise ConfigError(f"demoter: expected a Demoter, got {type(demoter).__name__}")
        if recall is not None and not callable(getattr(recall, "search", None)):
            raise ConfigError(f"recall: {recall!r} has no search(conversation_id, query, k)")
        if isinstance(recall_k, bool) or not isinstance(recall_k, int) or recall_k < 1:
            raise ConfigError(f"recall_k: must be an int >= 1, got {recall_k!r}")
        self.demoter = demoter
        self.recall = recall
        self.recall_k = recall_k
        if conversation_id is not None and not callable(conversation_id):
            raise ConfigError(f"conversation_id: {conversation_id!r} is not callable")
        self.conversation_id = conversation_id
        self.prune_state = bool(prune_state)
        if recall_role not in ("system", "human"):
            raise ConfigError(f"recall_role: must be 'system' or 'human', got {recall_role!r}")
        self._recall_message = SystemMessage if recall_role == "system" else HumanMessage

    # -- the two entry points: everything but the awaited I/O is shared ------------------

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]:
        """Send the model the window instead of the whole history (sync agents)."""
        prepared = drive_sync(self._prepare(request))
        return prepared.finish(handler(prepared.request))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Any],
    ) -> ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]:
        """Send the model the window instead of the whole history (async agents)."""
        prepared = await drive_async(self._prepare(request))
        return prepared.finish(await handler(prepared.request))

    # -- shared logic ------------------------------------------------------------------------

    def _describe(self, message: BaseMessage) -> MessageRecord:
        return to_core(message, self.demoter.describe)

    def _conversation(self, request: ModelRequest[Any]) -> str:
        """The conversation of this model call (see ``conversation_id``)."""
        if self.conversation_id is not None:
            return self.conversation_id(request.runtime)
        thread_id = _thread_id(request.runtime)
        if thread_id is not None:
            return thread_id
        if self.prune_state:
            raise ConversationIdError(
                "DemotingMiddleware(prune_state=True) needs a thread id: without one the "
                "agent state ends with the call, so the pruned count cannot be kept; invoke "
                "the agent with config={'configurable': {'thread_id': ...}}"
            )
        return first_message_conversation_id(request.state["messages"])

    def _prepare(self, request: ModelRequest[Any]) -> _Flow:
        cid = self._conversation(request)
        messages: Sequence[BaseMessage] = request.messages
        pruned = cast("PrunedPrefix | None", request.state.get(_PRUNED_KEY))
        if pruned and pruned["removed"]:
            messages = _PrunedView(messages, pruned["pinned"], pruned["removed"])
            yield from self._reconcile(cid, messages, pruned["pinned"], pruned["removed"])

        window: Window[BaseMessage] = yield _Load(self.demoter, cid, messages, self._describe)
        sent = from_core(window)

        if self.recall is not None:
            at = next(
                (i for i in range(len(sent) - 1, -1, -1) if message_role(sent[i]) == "user"),
                None,
            )
            query = message_text(sent[at]) if at is not None else ""
            if at is not None and query.strip():
                try:
                    hits: list[Recalled] = yield _Search(self.recall, cid, query, self.recall_k)
                except Exception as exc:
                    logger.warning("demote: recall failed for conversation %r: %r", cid, exc)
                    hits = []
                # Only the long tail: a message still in the window is sent anyway.
                hits = [h for h in hits if h.index < window.start]
                if hits:
                    sent.insert(at, self._recall_message(render_recall(hits)))

        update = (
            self._prune_update(cid, window, request.messages, pruned) if self.prune_state else None
        )
        if len(sent) == len(request.messages) and all(map(operator.is_, sent, request.messages)):
            return _Prepared(request, request, (), update)  # the whole request: hand it on
        to_send = request.override(messages=cast("list[AnyMessage]", sent))
        return _Prepared(to_send, request, tuple(sent), update)

    def _prune_update(
        self,
        cid: str,
        window: Window[BaseMessage],
        messages: Sequence[BaseMessage],
        pruned: PrunedPrefix | None,
    ) -> dict[str, Any] | None:
        """The state update removing what the hook accepted, or ``None`` if nothing new.

        ``window.delivered`` is the watermark the load committed (or found): only what
        the hook accepted is pruned, never what is still pending.
        """
        if window.delivered <= len(window.pinned):
            return None  # nothing delivered yet
        pinned = pruned["pinned"] if pruned else len(window.pinned)
        removed = pruned["removed"] if pruned else 0
        # Keep the message just before the watermark: the engine reads it (its anchor).
        count = window.delivered - 1 - (pinned + removed)
        if count <= 0:
            return None
        victims = list(messages[pinned : pinned + count])
        ids = [m.id for m in victims]
        if len(victims) < count or any(i is None for i in ids):
            logger.warning("demote: not pruning conversation %r: messages without ids", cid)
            return None
        return {
            "messages": [RemoveMessage(id=cast(str, i)) for i in ids],
            _PRUNED_KEY: PrunedPrefix(pinned=pinned, removed=removed + count),
        }

    def _reconcile(
        self, cid: str, view: Sequence[BaseMessage], pinned: int, removed: int
    ) -> Generator[_Call, Any, None]:
        """Re-seed a demotion state that does not cover the pruned prefix.

        Everything below ``floor = pinned + removed`` was pruned after the hook accepted
        it, and ``view[floor]`` is the kept anchor, also delivered. A state that would make
        the engine read below ``floor`` (lost with a non-durable store, cleared, or from a
        history rewritten below the prefix) is replaced by one whose window starts right
        after the anchor.
        """
        floor = pinned + removed
        if len(view) <= floor:
            raise DemoteError(
                f"conversation {cid!r}: the agent state is shorter than its pruned prefix"
            )
        d = self.demoter
        s: ConversationState = yield _Call(d.state_of, d.astate_of, (cid,))
        if (
            s.pinned == pinned
            and floor < s.window_start <= len(view)
            and s.delivered >= floor
            and self._describe(view[s.window_start - 1]).fingerprint == s.anchor
        ):
            return
        seeded = ConversationState(
            window_start=floor + 1,
            delivered=floor + 1,
            pinned=pinned,
            anchor=self._describe(view[floor]).fingerprint,
            summary=s.summary,
            summarized=min(s.summarized, floor + 1),
            generation=s.generation + 1,
        )
        logger.warning(
            "demote: demotion state of conversation %r does not cover its pruned prefix "
            "(%d messages); re-seeding it from the agent state",
            cid,
            floor,
        )
        yield _Call(d.seed, d.aseed, (cid, seeded))
