"""Erasing an agent's conversation: its LangGraph thread, its demotion state, its long tail.

``DemotingMiddleware.erase`` runs :func:`demote.engine.erase_conversation` with the
thread as the inner store: the messages are read from the thread's latest checkpoint
(at their absolute positions: with ``prune_state=True`` the pruned prefix is counted, so
the dedup keys of the kept messages are the ones they were delivered under), then the
thread is deleted through the checkpointer's ``delete_thread`` (every checkpoint of it,
in every namespace), then the engine erases the state and every tier. The report names
the checkpointer as the ``checkpoint`` tier (its ``removed``: the thread's messages). An
agent without a checkpointer has no thread to delete: its report is the engine's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.messages import BaseMessage
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple

from demote.engine import Demoter, erase_conversation
from demote.erase import EraseReport
from demote.errors import ConfigError
from demote.flow import Call, Flow, Twin
from demote.records import MessageRecord
from demote.state.base import validate_conversation_id
from langchain_demote._pruning import PRUNED_KEY

__all__ = ["demoter_erase", "erase_thread", "thread_messages"]


def thread_messages(saved: CheckpointTuple | None) -> list[tuple[int, BaseMessage]]:
    """The thread's messages at their absolute positions (the pruned prefix skipped)."""
    if saved is None:
        return []
    values: dict[str, Any] = saved.checkpoint.get("channel_values", {})
    messages = [m for m in values.get("messages", []) if isinstance(m, BaseMessage)]
    pruned = values.get(PRUNED_KEY) or {"pinned": 0, "removed": 0}
    pinned, removed = int(pruned["pinned"]), int(pruned["removed"])
    return [(i if i < pinned else i + removed, m) for i, m in enumerate(messages)]


def erase_thread(
    demoter: Demoter,
    describe: Callable[[BaseMessage], MessageRecord],
    named: bool,
    thread_id: str,
    checkpointer: BaseCheckpointSaver[Any] | None,
    conversation_id: str | None,
    wait: float | None,
) -> Flow[EraseReport]:
    """The erase flow of one agent conversation (see the module docstring).

    Raises:
        ConfigError: The middleware names conversations with a ``conversation_id``
            callable and no ``conversation_id`` was given, or ``checkpointer`` is not a
            LangGraph checkpointer.
    """
    if conversation_id is None and named:
        raise ConfigError(
            "erase: this middleware names conversations with conversation_id=...; "
            "pass the conversation's id: erase(thread_id, conversation_id=...)"
        )
    if conversation_id is None:
        cid = validate_conversation_id(thread_id, "thread_id")
    else:
        cid = validate_conversation_id(conversation_id)
        validate_conversation_id(thread_id, "thread_id")
    if checkpointer is None:  # (no inner store: the engine's report as it is)
        return demoter_erase(demoter, cid, wait)
    if not isinstance(checkpointer, BaseCheckpointSaver):
        raise ConfigError(f"checkpointer: expected a LangGraph checkpointer, got {checkpointer!r}")
    config: Any = {"configurable": {"thread_id": thread_id}}

    def held() -> list[tuple[int, BaseMessage]]:
        return thread_messages(checkpointer.get_tuple(config))

    async def aheld() -> list[tuple[int, BaseMessage]]:
        return thread_messages(await checkpointer.aget_tuple(config))

    return erase_conversation(
        demoter,
        cid,
        describe,
        read=Twin(held, aheld),
        clear=Twin(checkpointer.delete_thread, checkpointer.adelete_thread, (thread_id,)),
        inner=(checkpointer, "checkpoint"),
        wait=wait,
    )


def demoter_erase(demoter: Demoter, cid: str, wait: float | None) -> Flow[EraseReport]:
    """The engine's erase of ``cid`` alone, as a flow (an agent without a checkpointer)."""
    report: EraseReport = yield Call(demoter, "erase", (cid,), {"wait": wait})
    return report
