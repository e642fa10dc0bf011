"""``DemotingLLM``: every LLM call of a LlamaIndex agent run, bounded by demote's window.

Why a wrapping LLM
------------------
LlamaIndex's agents (``FunctionAgent``, ``CodeActAgent``, ``ReActAgent``, and each agent
of an ``AgentWorkflow``) read the memory before every LLM call of a run, then send the
run's own steps (the scratchpad, ``ctx.store["scratchpad"]``, or ReAct's reasoning) after
it, in full, and put them into the memory only when the run ends. A memory therefore
bounds only the part of the request before the run: a run of thirty large tool results
sends 41,248 tokens at its last call with a 3,000-token ``DemotingMemory``. Nothing the
memory is handed can change that: the scratchpad never passes through it until the end.

The one object every request passes through whole is the LLM. LlamaIndex has no model
call hook (its instrumentation sees a request, it cannot change it), and the agents'
steps (``take_step``, ``setup_agent``) are different per agent class, so a hook there
would be a subclass of every agent. A wrapping ``FunctionCallingLLM`` works with every
agent shape as it is, including the user's own, and is one line::

    agent = FunctionAgent(tools=tools, llm=DemotingLLM(llm), system_prompt="...")
    await agent.run("...", memory=memory)  # memory: a DemotingMemory

How it knows the conversation
-----------------------------
The wrapper holds no memory: each request names its own. An agent builds its request
from the very message objects a ``DemotingMemory`` read returned, and every read records
them (:mod:`llamaindex_demote._conversations`); the read found in a request names the memory, so
its conversation (``chat_store_key``), its Demoter and its chat store. So one wrapped LLM
serves any number of conversations, a memory restored from ``Context.to_dict`` or pickle
is found as the original was, and the LLM pickles as the LLM it wraps does. A request
built from no ``DemotingMemory`` read (another memory, a direct call) is handed on as it
is.

What it sends
-------------
At every ``chat``/``achat``, ``stream_chat``/``astream_chat`` and the ``*_with_tools``
twins, the request's messages are windowed (:mod:`llamaindex_demote._request`): the stored
history and then the run's steps, at the positions the memory gives them when the run
ends, are loaded through the memory's Demoter, with the agent's system prompt and the
tool schemas counted toward a token limit (``reserved``), and rendered as the memory
renders its window: cuts at steps inside the run, the opener kept, cleared results as
placeholders, oversized results clipped, whatever eviction the policy has. What leaves
the window reaches the hook once, in order, while the run goes on (``recall_tool`` finds
it); when the run ends and the agent puts its steps into the memory, they are where they
were numbered, and nothing is handed over again. The load's events go to LlamaIndex
instrumentation (:mod:`llamaindex_demote.instrumentation`), ``overhang`` among them when
what cannot be cut exceeds the limit.

Everything else is the wrapped LLM's: ``metadata``, ``get_tool_calls_from_response``, the
chat-with-tools preparation and validation, completions (no history to window). Structured
output (``structured_predict``, ``as_structured_llm``) runs LlamaIndex's own programs over
this LLM, so its requests are windowed too.

One limitation: ``ReActAgent`` puts a whole run into the memory as one message, the text
of all its steps joined. A run whose window cut into its own steps therefore hands the
memory a history that differs from the one the steps were numbered in: the engine
re-syncs it (what the hook holds is not delivered again), and that joined message, when
it later leaves the window, is archived as one more message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import LLM, ToolSelection
from llama_index.core.tools import BaseTool

from demote.errors import ConfigError
from demote.flow import drive_async, drive_sync
from demote.window.tokens import schema_tokens
from llamaindex_demote._request import Prepared, prepare

__all__ = ["DemotingLLM"]

# How many tools' token counts an LLM remembers (by tool object).
_TOOLS_KEPT = 1024


class DemotingLLM(FunctionCallingLLM):
    """Wraps an LLM so that every agent request is demote's window of its conversation.

    Example::

        memory = DemotingMemory.from_defaults(demoter=demoter, chat_store_key="user-42")
        agent = FunctionAgent(tools=tools, llm=DemotingLLM(llm))
        await agent.run("...", memory=memory)

    Each request finds its conversation by the ``DemotingMemory`` read it was built from
    (see the module docstring); requests built otherwise go to ``llm`` as they are.

    Args:
        llm: The model the windowed requests are sent to (a ``FunctionCallingLLM`` for
            the ``*_with_tools`` calls ``FunctionAgent`` makes; any LLM for ``ReActAgent``).

    Raises:
        ConfigError: ``llm`` is not a LlamaIndex ``LLM``.
    """

    llm: LLM = Field(description="The LLM the windowed requests are sent to.")
    _tool_tokens: dict[int, tuple[object, int]] = PrivateAttr(default_factory=dict)

    def __init__(self, llm: LLM, **kwargs: Any) -> None:
        if not isinstance(llm, LLM):
            raise ConfigError(f"llm: expected a LlamaIndex LLM, got {type(llm).__name__}")
        if isinstance(llm, DemotingLLM):
            llm = llm.llm  # wrapping twice would window twice
        super().__init__(llm=llm, callback_manager=llm.callback_manager, **kwargs)

    @classmethod
    def class_name(cls) -> str:
        """The name LlamaIndex serializes this LLM under."""
        return "DemotingLLM"

    @property
    def metadata(self) -> LLMMetadata:
        """The wrapped LLM's metadata (context window, function calling, model name)."""
        return self.llm.metadata

    # -- windowing ---------------------------------------------------------------------

    def _tools_count(self, tools: Sequence[BaseTool]) -> Callable[[Callable[[str], int]], int]:
        def count(counter: Callable[[str], int]) -> int:
            return sum(self._tool_count(tool, counter) for tool in tools)

        return count

    def _tool_count(self, tool: BaseTool, counter: Callable[[str], int]) -> int:
        """Tokens of one tool's schema as function-calling providers are sent it.

        Counted as :func:`demote.window.tokens.schema_tokens` counts it: under the default
        counter, as LangChain counts the same definition (so both paths cut alike).
        """
        cache = self._tool_tokens
        hit = cache.get(id(tool))
        if hit is not None and hit[0] is tool:
            return hit[1]
        meta = getattr(tool, "metadata", None)
        try:
            schema: Any = meta.to_openai_tool()["function"]  # type: ignore[union-attr]
        except Exception:  # a tool without a schema LlamaIndex can build: its name
            schema = {"name": getattr(meta, "name", None) or repr(tool)}
        tokens = schema_tokens(
            str(schema.get("name") or ""),
            str(schema.get("description") or ""),
            schema.get("parameters") or {},
            counter,
        )
        if len(cache) >= _TOOLS_KEPT:
            cache.clear()
        cache[id(tool)] = (tool, tokens)  # the object too: its id stays its own
        return tokens

    @staticmethod
    def _no_tools(counter: Callable[[str], int]) -> int:
        return 0

    def _window(self, messages: Sequence[ChatMessage], tools: Sequence[BaseTool] = ()) -> Prepared:
        count = self._tools_count(tools) if tools else self._no_tools
        return drive_sync(prepare(list(messages), count))

    async def _awindow(
        self, messages: Sequence[ChatMessage], tools: Sequence[BaseTool] = ()
    ) -> Prepared:
        count = self._tools_count(tools) if tools else self._no_tools
        return await drive_async(prepare(list(messages), count))

    def _function_calling(self) -> FunctionCallingLLM:
        llm = self.llm
        if not isinstance(llm, FunctionCallingLLM):
            raise ConfigError(
                f"DemotingLLM: {type(llm).__name__} is not a FunctionCallingLLM, so it cannot "
                "chat with tools (use it with ReActAgent, or wrap a function-calling LLM)"
            )
        return llm

    # -- chat: the request windowed, then the wrapped LLM's own call ---------------------

    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """The wrapped LLM's ``chat`` over the window of ``messages``."""
        return self.llm.chat(self._window(messages).messages, **kwargs)

    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """The wrapped LLM's ``achat`` over the window of ``messages``."""
        return await self.llm.achat((await self._awindow(messages)).messages, **kwargs)

    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        """The wrapped LLM's ``stream_chat`` over the window of ``messages``."""
        return self.llm.stream_chat(self._window(messages).messages, **kwargs)

    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        """The wrapped LLM's ``astream_chat`` over the window of ``messages``."""
        return await self.llm.astream_chat((await self._awindow(messages)).messages, **kwargs)

    def chat_with_tools(  # type: ignore[override]
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        **kwargs: Any,
    ) -> ChatResponse:
        """The wrapped LLM's ``chat_with_tools``, ``chat_history`` windowed (tools counted)."""
        llm = self._function_calling()
        sent = self._window(chat_history or [], tools).messages
        return llm.chat_with_tools(tools, user_msg=user_msg, chat_history=sent, **kwargs)

    async def achat_with_tools(  # type: ignore[override]
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        **kwargs: Any,
    ) -> ChatResponse:
        """Async :meth:`chat_with_tools`."""
        llm = self._function_calling()
        sent = (await self._awindow(chat_history or [], tools)).messages
        return await llm.achat_with_tools(tools, user_msg=user_msg, chat_history=sent, **kwargs)

    def stream_chat_with_tools(  # type: ignore[override]
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        **kwargs: Any,
    ) -> ChatResponseGen:
        """The wrapped LLM's ``stream_chat_with_tools``, ``chat_history`` windowed."""
        llm = self._function_calling()
        sent = self._window(chat_history or [], tools).messages
        return llm.stream_chat_with_tools(tools, user_msg=user_msg, chat_history=sent, **kwargs)

    async def astream_chat_with_tools(  # type: ignore[override]
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        **kwargs: Any,
    ) -> ChatResponseAsyncGen:
        """Async :meth:`stream_chat_with_tools`."""
        llm = self._function_calling()
        sent = (await self._awindow(chat_history or [], tools)).messages
        return await llm.astream_chat_with_tools(
            tools, user_msg=user_msg, chat_history=sent, **kwargs
        )

    # -- the wrapped LLM's own -----------------------------------------------------------

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The wrapped LLM's preparation (the ``chat`` it prepares for windows the request)."""
        return self._function_calling()._prepare_chat_with_tools_compat(
            tools,
            user_msg=user_msg,
            chat_history=chat_history,
            verbose=verbose,
            allow_parallel_tool_calls=allow_parallel_tool_calls,
            tool_required=tool_required,
            **kwargs,
        )

    def _validate_chat_with_tools_response(
        self,
        response: ChatResponse,
        tools: Sequence[BaseTool],
        allow_parallel_tool_calls: bool = False,
        **kwargs: Any,
    ) -> ChatResponse:
        return self._function_calling()._validate_chat_with_tools_response(
            response, tools, allow_parallel_tool_calls=allow_parallel_tool_calls, **kwargs
        )

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[ToolSelection]:
        """The wrapped LLM's reading of the tool calls in ``response``."""
        return self._function_calling().get_tool_calls_from_response(
            response, error_on_no_tool_call=error_on_no_tool_call, **kwargs
        )

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """The wrapped LLM's ``complete`` (a prompt has no history to window)."""
        return self.llm.complete(prompt, formatted=formatted, **kwargs)

    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        """The wrapped LLM's ``acomplete``."""
        return await self.llm.acomplete(prompt, formatted=formatted, **kwargs)

    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        """The wrapped LLM's ``stream_complete``."""
        return self.llm.stream_complete(prompt, formatted=formatted, **kwargs)

    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        """The wrapped LLM's ``astream_complete``."""
        return await self.llm.astream_complete(prompt, formatted=formatted, **kwargs)
