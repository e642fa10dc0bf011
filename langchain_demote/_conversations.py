"""Which conversation a LangGraph run is: its thread id, or its first message's id.

The middleware names the conversation of a model call, and the recall tool the
conversation of a tool call, the same way: the thread id of the run (from the runtime's
execution info, the runtime's config, the config passed in, or, for the middleware, the
config of the runnable being run), else, for an agent invoked without a thread id,
``"first-message:"`` and the id LangGraph gave the first message of the state. Nothing
the model writes enters it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import BaseMessage

from demote.errors import ConversationIdError

__all__ = [
    "FIRST_MESSAGE_PREFIX",
    "first_message_conversation_id",
    "first_message_id",
    "run_thread_id",
    "thread_conversation_id",
]

#: How the conversation id of an agent invoked without a thread id begins.
FIRST_MESSAGE_PREFIX = "first-message:"


def run_thread_id(
    runtime: Any, config: Mapping[str, Any] | None = None, *, from_context: bool = True
) -> str | None:
    """The thread id of the run ``runtime`` belongs to, or ``None`` when it has none.

    Args:
        runtime: A model node's ``Runtime`` or a tool's ``ToolRuntime`` (or ``None``).
        config: The run's config, when the caller has it.
        from_context: Also look in the config of the runnable being run (LangGraph's
            ``get_config``), when the runtime and ``config`` name no thread.
    """
    info = getattr(runtime, "execution_info", None)
    thread_id = getattr(info, "thread_id", None)
    for source in (getattr(runtime, "config", None), config):
        if thread_id is None and isinstance(source, Mapping):
            configurable = source.get("configurable")
            if isinstance(configurable, Mapping):
                thread_id = configurable.get("thread_id")
    if thread_id is None and from_context:
        from langgraph.config import get_config

        try:
            thread_id = get_config().get("configurable", {}).get("thread_id")
        except RuntimeError:  # not inside a runnable
            thread_id = None
    return None if thread_id is None else str(thread_id)


def thread_conversation_id(runtime: Any) -> str:
    """The LangGraph thread id of the running agent.

    Args:
        runtime: The model node's runtime.

    Returns:
        The thread id as a string.

    Raises:
        ConversationIdError: The agent was invoked without a thread id.
    """
    thread_id = run_thread_id(runtime)
    if thread_id is None:
        raise ConversationIdError(
            "the agent was invoked without a thread id: invoke it with "
            "config={'configurable': {'thread_id': ...}}"
        )
    return thread_id


def first_message_id(messages: object) -> str | None:
    """``"first-message:"`` and the id of the first of ``messages``, if it has one."""
    first = messages[0] if isinstance(messages, Sequence) and messages else None
    first_id = getattr(first, "id", None)
    return FIRST_MESSAGE_PREFIX + first_id if isinstance(first_id, str) and first_id else None


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
    named = first_message_id(messages)
    if named is None:
        raise ConversationIdError(
            "DemotingMiddleware: the agent has no thread id and its first message no id to "
            "name the conversation by; invoke it with config={'configurable': "
            "{'thread_id': ...}}, or pass conversation_id="
        )
    return named
