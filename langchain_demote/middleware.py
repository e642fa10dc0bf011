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
3. sends the model only the request built from the window
   (:func:`langchain_demote.history.render_window`, that is :func:`demote.request.compose`):
   pinned system messages, the turn's opener when the window starts inside a turn, the
   committed summary or digest as a note in a ``HumanMessage`` of its own, the kept
   messages with old tool results cleared to placeholders, and (with ``recall``) one
   ``HumanMessage`` of recalled archive messages right after the newest human message,
   the same at every model call of the turn until a cut. demote adds no system message:
   the system block (``create_agent``'s ``system_prompt``, the model node puts it first,
   and the thread's pinned system messages) is never changed. The system prompt and the
   tool definitions (their JSON schemas, as the provider is sent them) are counted under
   the policy's counter and passed to the load as ``reserved``, with the recall's token
   budget, so in a token window the whole request stays within the limit;
4. leaves the state alone (``prune_state=False``, the default) or, with
   ``prune_state=True``, returns a ``Command`` alongside the model response that removes
   the messages the hook has already accepted.

What middleware after this one (inner) sees
-------------------------------------------
When the window holds every message of the request (nothing demoted yet, no summary, no
recall), the request is handed on untouched: the same ``ModelRequest`` object (with
``prompt_cache_key``, a copy with the key in its settings), the same ``messages`` list.
An inner middleware's in-place edits then reach exactly what they reach without demote
(``create_agent`` writes a changed ``request.messages`` list back
to the agent state).

Otherwise the inner middleware gets ``request.override(messages=window)``: a new request
holding a new list (pinned, summary, opener, kept messages, recall), whose messages are
the state's own objects, except copies made for the model: the opener carrying a progress
note, and cleared or clipped tool results carrying their placeholder. Of its in-place
edits to that list:

- messages appended at its end are appended to the list this middleware was given, once
  the model call returns (as if the inner middleware had appended to it), so they reach
  the agent state as they would without demote;
- any other edit of the list (insert, remove, replace, reorder) reaches only that model
  call; to change the state, return a ``Command`` or use a ``before_model`` hook;
- edits to a message object itself are edits of the state's message (demote copies
  only the messages it changes for the model, whose edits reach that call only); demote
  describes each message object once, so such an edit does not change what demote has
  already recorded for it.

This runs at every model call of one ``invoke``: a tool loop of a hundred calls is cut a
hundred times, at step boundaries inside the turn (an assistant message and the results
of its calls), so the model is never sent a tool result without its call, nor a call
without its results (parallel calls included), and the first message after the system
messages is always a user message (the opener, when the window starts inside a turn).

What it reports
---------------
Each load's events (:attr:`demote.Window.events`: demoted, delivered, delivery_failed,
resynced) and a ``recalled`` event when recall placed messages in the prompt are
dispatched as LangChain custom events (``"demote.demoted"``, ...; see
:mod:`langchain_demote.callbacks`) in the model node's run, before the model is called.
The model call's own run carries ``metadata["demote"]``: the conversation, how many
messages the model is sent (``pinned``, ``window``), how many of the thread's messages
were cut (``cut``: demoted or pending, not sent), the thread's length (``total``),
``pending``, whether a summary was sent, and how many messages were ``recalled``.

Sync and async share all of this: :meth:`DemotingMiddleware._prepare` is a generator that
yields its I/O operations (the load, the recall search, the pruned prefix's re-seeding;
see :mod:`langchain_demote._request`; the recall's step, :mod:`langchain_demote._recalling`)
and two short drivers run it, one blocking, one awaiting, so no logic is written twice.

Erasing (:meth:`DemotingMiddleware.erase`): the thread is deleted through the
checkpointer, then the demotion state and every tier behind the hook
(:mod:`langchain_demote._erasing`).

Pruning (``prune_state=True``) keeps every message's absolute position: the pruned prefix
is counted in the checkpoint, and the engine reads the thread through a view that puts
the kept messages back at their positions (:mod:`langchain_demote._pruning`).
"""

from __future__ import annotations

import json
import logging
import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, NotRequired, cast

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
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.runtime import Runtime

from demote.engine import Demoter, Window
from demote.erase import EraseReport
from demote.errors import ConfigError, ConversationIdError
from demote.flow import Flow as EraseFlow
from demote.flow import drive_async, drive_sync
from demote.hooks.base import Recall
from demote.records import MessageRecord
from demote.request import RECALL_PREFIX, render_recall
from demote.window.tokens import approximate_tokens
from langchain_demote._caching import CacheKey, cache_key_option, keyed_settings, takes_cache_key
from langchain_demote._conversations import (
    FIRST_MESSAGE_PREFIX,
    first_message_conversation_id,
    run_thread_id,
    thread_conversation_id,
)
from langchain_demote._erasing import erase_thread
from langchain_demote._pruning import (
    PRUNED_KEY,
    PrunedPrefix,
    PrunedView,
    prune_update,
    reconcile,
)
from langchain_demote._recalling import recall_for, recaller
from langchain_demote._request import Load, Preparation, Prepared, model_call_metadata, run_metadata
from langchain_demote._restarts import check_checkpointer
from langchain_demote.callbacks import adispatch_events, dispatch_events
from langchain_demote.history import render_window
from langchain_demote.messages import to_core

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

# How many tool definitions' token counts a middleware remembers (by tool object).
_TOOLS_KEPT = 1024


class DemotingAgentState(AgentState[Any]):
    """The agent state with the middleware's private pruning record (never input/output)."""

    demote_pruned: NotRequired[Annotated[PrunedPrefix, PrivateStateAttr]]


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
            ``SQLiteArchive``); its hits for the newest human message (the question) are
            sent as one message right after it, the same at every model call of the turn
            until the window is cut. A failing search is reported as a ``degraded``
            event and skipped.
        recall_k: How many recalled messages to send at most.
        recall_budget_tokens: Most tokens the recall message may cost as sent (counted
            like the window). In a token window it is reserved out of the limit, so the
            whole request stays within it; ``None`` (default) gives a token window
            :data:`demote.request.RECALL_SHARE` of its limit (1/72: a cached chat then
            costs about 1.1x what it costs without recall; a larger budget recalls more
            for more) and a window counted in messages or turns no token budget (only
            ``recall_k`` bounds it).
        conversation_id: Names the conversation from the model node's runtime. By
            default: the LangGraph thread id, or without one
            :func:`first_message_conversation_id` (see the module docstring). Two agents
            sharing a thread need distinct names
            (``lambda rt: thread_conversation_id(rt) + "/researcher"``).
        prune_state: Remove messages from the agent state once the hook has accepted
            them (the default keeps the full history in the checkpoint). Needs a thread
            id (a checkpointer): an agent invoked without one raises
            :class:`~demote.errors.ConversationIdError`.
        recall_role: The role of the recall message: ``"user"`` (default; ``"human"``
            is the same), valid for every provider; or ``"system"``, for providers that
            take system messages anywhere (OpenAI's). Anthropic's chat models refuse a
            system message after the conversation began (langchain-anthropic raises
            when the agent has a system prompt, and otherwise moves it into the system
            block, which then changes every turn and breaks the prompt cache there).
        prompt_cache_key: Set OpenAI's ``prompt_cache_key`` in each request's model
            settings (when the model is langchain-openai's: other providers' APIs refuse
            the field), so one conversation's calls reach the cache holding its prefix:
            ``True`` uses the conversation id, a callable maps it (to hash or prefix it);
            a key already in the settings is kept. ``False`` (default): none.

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
        recall_budget_tokens: int | None = None,
        conversation_id: Callable[[Runtime[Any]], str] | None = None,
        prune_state: bool = False,
        recall_role: Literal["user", "human", "system"] = "user",
        prompt_cache_key: CacheKey = False,
    ) -> None:
        super().__init__()
        if not isinstance(demoter, Demoter):
            raise ConfigError(f"demoter: expected a Demoter, got {type(demoter).__name__}")
        self.demoter = demoter
        self.recall = recall
        self._recall = recaller(
            recall, recall_k, recall_budget_tokens, recall_role, demoter.policy, self._describe
        )
        self.recall_k = recall_k
        self.recall_budget_tokens = None if self._recall is None else self._recall.settings.budget
        if conversation_id is not None and not callable(conversation_id):
            raise ConfigError(f"conversation_id: {conversation_id!r} is not callable")
        self.conversation_id = conversation_id
        self.prune_state = bool(prune_state)
        self.prompt_cache_key = cache_key_option(prompt_cache_key)
        self._tool_tokens: OrderedDict[int, tuple[object, int]] = OrderedDict()
        self._tool_lock = threading.Lock()

    # -- the two entry points: everything but the awaited I/O is shared ------------------

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]:
        """Send the model the window instead of the whole history (sync agents)."""
        prepared = drive_sync(self._prepare(request))
        dispatch_events(prepared.events)
        with model_call_metadata(prepared.metadata):
            response = handler(prepared.request)
        return prepared.finish(response)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Any],
    ) -> ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]:
        """Send the model the window instead of the whole history (async agents)."""
        prepared = await drive_async(self._prepare(request))
        await adispatch_events(prepared.events)
        with model_call_metadata(prepared.metadata):
            response = await handler(prepared.request)
        return prepared.finish(response)

    # -- erasing a conversation --------------------------------------------------------------

    def erase(
        self,
        thread_id: str,
        *,
        checkpointer: BaseCheckpointSaver[Any] | None = None,
        conversation_id: str | None = None,
        wait: float | None = None,
    ) -> EraseReport:
        """Forget a conversation everywhere: its thread, demotion state and long tail.

        The thread's messages are read (for the dedup keys of tiers that delete by id),
        the thread is deleted with ``checkpointer.delete_thread``, then
        :meth:`demote.Demoter.erase` deletes the state and asks every tier behind the
        hook to delete the conversation.

        Args:
            thread_id: The LangGraph thread; also the conversation id by default.
            checkpointer: The agent's checkpointer (``None``: an agent without one, whose
                conversation, ``"first-message:..."``, is then ``thread_id``).
            conversation_id: The conversation's id when this middleware names
                conversations with ``conversation_id=`` (required then).
            wait: Seconds to wait for a delivery in flight (see
                :meth:`demote.Demoter.erase`).

        Returns:
            What each tier did, and how many messages left the thread.

        Raises:
            ConfigError: A custom ``conversation_id`` callable and no ``conversation_id``.
        """
        return drive_sync(self._erasing(thread_id, checkpointer, conversation_id, wait))

    def _erasing(
        self,
        thread_id: str,
        checkpointer: BaseCheckpointSaver[Any] | None,
        conversation_id: str | None,
        wait: float | None,
    ) -> EraseFlow[EraseReport]:
        named = self.conversation_id is not None
        return erase_thread(
            self.demoter, self._describe, named, thread_id, checkpointer, conversation_id, wait
        )

    async def aerase(
        self,
        thread_id: str,
        *,
        checkpointer: BaseCheckpointSaver[Any] | None = None,
        conversation_id: str | None = None,
        wait: float | None = None,
    ) -> EraseReport:
        """Async :meth:`erase` (``aget_tuple``, ``adelete_thread``, the engine's ``aerase``)."""
        return await drive_async(self._erasing(thread_id, checkpointer, conversation_id, wait))

    # -- shared logic ------------------------------------------------------------------------

    def _describe(self, message: BaseMessage) -> MessageRecord:
        return to_core(message, self.demoter.describe)

    def _reserved(self, request: ModelRequest[Any]) -> int:
        """Tokens of the request outside its messages: system message and tools.

        Counted only for a token window: the system message as a message (like the
        window's own), each tool as the JSON schema the provider is sent, under the
        policy's counter (a tool's count is kept per tool object).
        """
        if self.demoter.policy.unit != "tokens":
            return 0
        system = request.system_message
        total = 0 if system is None else self._describe(system).tokens
        tools = request.tools
        if tools:
            counter = self.demoter.policy.resolved_counter()
            for tool in tools:
                total += self._tool_count(tool, counter)
        return total

    def _tool_count(self, tool: BaseTool | dict[str, Any], counter: Callable[[str], int]) -> int:
        key = id(tool)
        with self._tool_lock:
            hit = self._tool_tokens.get(key)
            if hit is not None and hit[0] is tool:
                self._tool_tokens.move_to_end(key)
                return hit[1]
        tokens = _tool_tokens(tool, counter)
        with self._tool_lock:
            self._tool_tokens[key] = (tool, tokens)  # the object too: its id stays its own
            if len(self._tool_tokens) > _TOOLS_KEPT:
                self._tool_tokens.popitem(last=False)
        return tokens

    def _conversation(self, request: ModelRequest[Any]) -> str:
        """The conversation of this model call (see ``conversation_id``)."""
        if self.conversation_id is not None:
            return self.conversation_id(request.runtime)
        thread_id = run_thread_id(request.runtime)
        if thread_id is not None:
            return thread_id
        if self.prune_state:
            raise ConversationIdError(
                "DemotingMiddleware(prune_state=True) needs a thread id: without one the "
                "agent state ends with the call, so the pruned count cannot be kept; invoke "
                "the agent with config={'configurable': {'thread_id': ...}}"
            )
        return first_message_conversation_id(request.state["messages"])

    def _prepare(self, request: ModelRequest[Any]) -> Preparation:
        check_checkpointer(self, self.demoter)  # first call: a durable saver, state in memory?
        cid = self._conversation(request)
        messages: Sequence[BaseMessage] = request.messages
        pruned = cast("PrunedPrefix | None", request.state.get(PRUNED_KEY))
        absent = range(0)
        if pruned and pruned["removed"]:
            messages = PrunedView(messages, pruned["pinned"], pruned["removed"])
            absent = range(pruned["pinned"], pruned["pinned"] + pruned["removed"])
            yield from reconcile(
                self.demoter, self._describe, cid, messages, pruned["pinned"], pruned["removed"]
            )

        reserved = self._reserved(request)
        recall = self._recall
        if recall is not None:
            reserved += recall.settings.reserve  # the window makes room for the recall message
        window: Window[BaseMessage] = yield Load(
            self.demoter, cid, messages, self._describe, reserved, absent
        )
        recalling, found = yield from recall_for(recall, self.demoter, window)
        events = (*window.events, *found)
        role = recall.settings.role if recall else "user"
        sent = render_window(window, recalling, recall_role=role)
        recalled = len(recalling.hits) if recalling is not None else 0

        update = prune_update(cid, window, request.messages, pruned) if self.prune_state else None
        metadata = {"demote": run_metadata(window, recalled, reserved)}
        settings = None
        if self.prompt_cache_key is not False and takes_cache_key(request.model):
            settings = keyed_settings(self.prompt_cache_key, cid, request.model_settings)
        if len(sent) == len(request.messages) and all(map(operator.is_, sent, request.messages)):
            # The whole request: hand it on untouched (its messages list, at least).
            if settings is not None:
                request = request.override(model_settings=settings)
            return Prepared(request, request, (), update, tuple(events), metadata)
        to_send = request.override(messages=cast("list[AnyMessage]", sent))
        if settings is not None:
            to_send = to_send.override(model_settings=settings)
        return Prepared(to_send, request, tuple(sent), update, tuple(events), metadata)


def _tool_tokens(tool: BaseTool | dict[str, Any], counter: Callable[[str], int]) -> int:
    """A tool definition's tokens under ``counter``, at least what LangChain counts.

    Under the default counter (four characters a token), the larger of
    ``count_tokens_approximately``'s count of the tool as given (a ``BaseTool``: its name,
    description and parameters) and of the definition the provider is sent
    (``convert_to_openai_tool``'s, which wraps them): the window stays within the limit
    whichever of the two a caller counts (eight tools differ by about 70 tokens). Under
    another counter, the JSON schema the provider is sent, counted by it.
    """
    try:
        schema: Any = convert_to_openai_tool(tool)
    except Exception:  # a provider's own tool dict (web search, ...): as given
        schema = tool
    if counter is approximate_tokens:
        given = count_tokens_approximately([], tools=[tool])
        sent = given if schema is tool else count_tokens_approximately([], tools=[schema])
        return max(given, sent)
    return counter(json.dumps(schema, default=str, separators=(",", ":")))
