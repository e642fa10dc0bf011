"""``recall_tool``: an agent searches its own long tail, and fetches cleared tool results.

``DemotingMiddleware(recall=archive)`` injects recall right after the newest human message,
which suits a chat. An agent also needs to look something up when *it* decides to, and to
get back a tool result the window cleared (its placeholder names the archived key; see
:func:`demote.window.clearing.placeholder_text`). :func:`recall_tool` gives it a LangChain tool
for both::

    archive = SQLiteArchive("archive.db")
    agent = create_agent(
        model,
        [*tools, recall_tool(archive)],
        checkpointer=InMemorySaver(),
        middleware=[DemotingMiddleware(Demoter(policy, archive), recall=archive)],
    )
    agent.invoke({"messages": [...]}, {"configurable": {"thread_id": "t1"}})

Whose archive it reads. The conversation is the run's, never an argument of the model:
the LangGraph thread id (from the ``ToolRuntime`` the tool node injects, or the run's
config ``configurable.thread_id``), or what a ``conversation_id=`` callable (or a
``DemotingMiddleware``'s own) names from that runtime; without a thread id, the id
``DemotingMiddleware`` gives such an agent (``"first-message:" + id`` of the state's first
message). The model passes only a query, a key, ``k`` and a budget: a key of another
conversation is not found, a query is only ever searched for as words, and a run with no
conversation gets a sentence saying so. The answer is always text for the model
(:mod:`demote.archive.render` renders it, the same for LlamaIndex), never an exception.

Sync and async: ``invoke`` runs the archive's ``search`` / ``fetch``, ``ainvoke`` awaits
``asearch`` / ``afetch``; both drive the one flow :func:`demote.archive.recall_tool.answer`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Unpack

from langchain_core.callbacks import AsyncCallbackManagerForToolRun, CallbackManagerForToolRun
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, InjectedToolArg
from pydantic import BaseModel, ConfigDict

from demote.archive.recall_tool import (
    RecallArgs,
    RecallOptions,
    RecallToolOptions,
    answer,
    tool_setup,
)
from demote.errors import ConfigError
from demote.flow import drive_async, drive_sync
from demote.hooks.base import ArchiveRecall
from langchain_demote._conversations import first_message_id, run_thread_id

__all__ = ["RecallInput", "RecallTool", "recall_tool"]

logger = logging.getLogger("demote")


class RecallInput(RecallArgs):
    """What the model passes the recall tool (``runtime`` is injected, never the model's)."""

    runtime: Annotated[Any, InjectedToolArg] = None


@functools.cache
def _tool_runtime_type() -> type | None:
    try:
        from langgraph.prebuilt import ToolRuntime
    except ImportError:  # pragma: no cover - without langgraph there is no tool node
        return None
    return ToolRuntime


class RecallTool(BaseTool):
    """The tool :func:`recall_tool` returns (see the module docstring)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    args_schema: type[BaseModel] = RecallInput
    archive: ArchiveRecall
    options: RecallOptions
    namer: Callable[[Any], str] | None = None

    def conversation(self, runtime: Any, config: Mapping[str, Any] | None) -> str | None:
        """The conversation of this call, from the run (``None`` when it names none).

        Args:
            runtime: What the tool node injected; anything but a ``ToolRuntime`` (say,
                a dict the model slipped into its arguments) is ignored.
            config: The run's config.
        """
        runtime_type = _tool_runtime_type()
        if runtime_type is None or not isinstance(runtime, runtime_type):
            runtime = None
        if self.namer is not None:
            if runtime is None:
                return None
            try:
                return str(self.namer(runtime))
            except Exception as exc:
                logger.warning("demote: the recall tool's conversation_id failed: %r", exc)
                return None
        state = getattr(runtime, "state", None)
        messages = state.get("messages") if isinstance(state, Mapping) else None
        return run_thread_id(runtime, config, from_context=False) or first_message_id(messages)

    def _flow(self, input_: dict[str, Any], config: RunnableConfig | None) -> Any:
        runtime = input_.pop("runtime", None)
        return answer(self.archive, self.conversation(runtime, config), self.options, **input_)

    def _run(
        self,
        query: str | None = None,
        key: str | None = None,
        k: int | None = None,
        budget_tokens: int | None = None,
        start: int | None = None,
        runtime: Any = None,
        *,
        config: RunnableConfig,
        run_manager: CallbackManagerForToolRun | None = None,
    ) -> str:
        args = {"query": query, "key": key, "k": k, "budget_tokens": budget_tokens, "start": start}
        result: str = drive_sync(self._flow({**args, "runtime": runtime}, config))
        return result

    async def _arun(
        self,
        query: str | None = None,
        key: str | None = None,
        k: int | None = None,
        budget_tokens: int | None = None,
        start: int | None = None,
        runtime: Any = None,
        *,
        config: RunnableConfig,
        run_manager: AsyncCallbackManagerForToolRun | None = None,
    ) -> str:
        args = {"query": query, "key": key, "k": k, "budget_tokens": budget_tokens, "start": start}
        result: str = await drive_async(self._flow({**args, "runtime": runtime}, config))
        return result


def recall_tool(
    archive: ArchiveRecall,
    conversation_id: Callable[[Any], str] | object | None = None,
    **options: Unpack[RecallToolOptions],
) -> BaseTool:
    """A LangChain tool with which an agent searches and fetches its own archived messages.

    Example::

        agent = create_agent(model, [search_web, recall_tool(archive)],
                             checkpointer=InMemorySaver(), middleware=[middleware])

    Args:
        archive: The long tail, an :class:`~demote.hooks.base.ArchiveRecall`:
            ``search(conversation_id, query, k)`` and ``fetch(conversation_id, key)``,
            with async twins when it has them (``SQLiteArchive``, ``PostgresArchive``).
        conversation_id: Names the conversation from the tool's ``ToolRuntime``: a
            callable (as ``DemotingMiddleware``'s ``conversation_id=``), or the
            ``DemotingMiddleware`` itself to use the same naming. By default the thread
            id, or ``DemotingMiddleware``'s id for an agent without one.
        **options: The options both adapters' recall tools take, with their defaults
            (``k``, ``max_k``, ``budget_tokens``, ``max_budget_tokens``,
            ``fetch_budget_tokens``, ``counter``, ``snippets``, ``name``,
            ``description``): see :class:`~demote.archive.recall_tool.RecallToolOptions`.

    Returns:
        A ``BaseTool`` (``invoke`` and ``ainvoke``) answering the model in text.

    Raises:
        ConfigError: ``archive`` cannot search and fetch, ``conversation_id`` is neither
            a callable nor a ``DemotingMiddleware``, or an option is unknown or out of
            range.
    """
    setup = tool_setup(archive, options)
    namer = conversation_id
    if namer is not None and not callable(namer):
        if not hasattr(namer, "demoter"):
            raise ConfigError(
                f"conversation_id: must be a callable or a DemotingMiddleware, got {namer!r:.40}"
            )
        namer = getattr(namer, "conversation_id", None)  # a middleware's own naming, if any
    return RecallTool(
        name=setup.name,
        description=setup.description,
        archive=archive,
        options=setup.options,
        namer=namer,
    )
