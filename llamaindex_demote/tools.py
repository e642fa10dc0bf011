"""``recall_tool``: a LlamaIndex agent searches its own long tail, and fetches cleared results.

``DemotingMemory(recall=archive)`` places recall in the prompt of a chat. An agent also
needs to look something up when *it* decides to, and to read back a tool result by the
key its placeholder names (:func:`demote.window.clearing.placeholder_text`).
:func:`recall_tool` gives it a ``FunctionTool`` for both, bound to one conversation::

    memory = DemotingMemory.from_defaults(demoter=demoter, chat_store_key="user-42")
    agent = FunctionAgent(tools=[*tools, recall_tool(archive, conversation_id=memory)], llm=llm)
    await agent.run("...", memory=memory)

The conversation is fixed when the tool is made (the memory's ``chat_store_key``), never
an argument of the model: a key of another conversation is not found and a query is only
ever searched for as words. The answer is always text for the model, rendered by
:mod:`demote.archive.render` as for LangChain; ``call`` runs the archive's ``search`` /
``fetch`` and ``acall`` awaits ``asearch`` / ``afetch``, both through the one flow
:func:`demote.archive.recall_tool.answer`.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Unpack

from llama_index.core.tools import FunctionTool

from demote.archive.recall_tool import RecallArgs, RecallToolOptions, answer, tool_setup
from demote.flow import Call, drive_async, drive_sync
from demote.hooks.base import ArchiveRecall
from demote.state.base import validate_conversation_id

__all__ = ["recall_tool"]


def recall_tool(
    archive: ArchiveRecall, conversation_id: object, **options: Unpack[RecallToolOptions]
) -> FunctionTool:
    """A LlamaIndex tool with which an agent searches and fetches its archived messages.

    Args:
        archive: The long tail, an :class:`~demote.hooks.base.ArchiveRecall`:
            ``search(conversation_id, query, k)`` and ``fetch(conversation_id, key)``,
            with async twins when it has them (``SQLiteArchive``, ``PostgresArchive``).
        conversation_id: The conversation the tool reads: its id (the memory's
            ``chat_store_key``) or the :class:`~llamaindex_demote.DemotingMemory` itself.
        **options: The options both adapters' recall tools take, with their defaults
            (``k``, ``max_k``, ``budget_tokens``, ``max_budget_tokens``,
            ``fetch_budget_tokens``, ``counter``, ``snippets``, ``name``,
            ``description``): see :class:`~demote.archive.recall_tool.RecallToolOptions`.

    Returns:
        A ``FunctionTool`` with a sync and an async function.

    Raises:
        ConfigError: ``archive`` cannot search and fetch, the conversation id is unusable
            (:class:`~demote.errors.ConversationIdError`), or an option is unknown or out
            of range.
    """
    setup = tool_setup(archive, options)
    key_of = getattr(conversation_id, "chat_store_key", None)  # a DemotingMemory
    cid = validate_conversation_id(key_of if key_of is not None else conversation_id)
    bounds = setup.options

    def flow(
        query: str | None, key: str | None, k: int | None, budget: int | None, start: int | None
    ) -> Generator[Call, Any, str]:
        return answer(
            archive, cid, bounds, query=query, key=key, k=k, budget_tokens=budget, start=start
        )

    def recall(
        query: str | None = None,
        key: str | None = None,
        k: int | None = None,
        budget_tokens: int | None = None,
        start: int | None = None,
    ) -> str:
        """Search this conversation's archived messages (query) or fetch one (key)."""
        return drive_sync(flow(query, key, k, budget_tokens, start))

    async def arecall(
        query: str | None = None,
        key: str | None = None,
        k: int | None = None,
        budget_tokens: int | None = None,
        start: int | None = None,
    ) -> str:
        """Search this conversation's archived messages (query) or fetch one (key)."""
        return await drive_async(flow(query, key, k, budget_tokens, start))

    return FunctionTool.from_defaults(
        fn=recall,
        async_fn=arecall,
        name=setup.name,
        description=setup.description,
        fn_schema=RecallArgs,
    )
