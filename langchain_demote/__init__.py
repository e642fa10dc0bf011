"""LangChain adapter for demote.

For agents (LangChain's current path, ``pip install 'demote[agents]'``), one middleware
sends the model a bounded window of the thread and demotes, once, what leaves it::

    agent = create_agent(model, tools, checkpointer=InMemorySaver(),
                         middleware=[DemotingMiddleware(demoter, recall=archive)])

For chains on ``RunnableWithMessageHistory`` (deprecated by LangChain 1.x together with
``BaseChatMessageHistory``, still what most running chains use;
``pip install 'demote[langchain]'``), wrap the history factory::

    chain = RunnableWithMessageHistory(
        prompt | model, with_demotion(get_session_history, demoter),
        input_messages_key="question", history_messages_key="history",
    )

Modules: :mod:`~langchain_demote.middleware` (``DemotingMiddleware`` for ``create_agent``;
needs the ``langchain`` package, extra ``demote[agents]``, and is imported on first use),
:mod:`~langchain_demote.history` (the chat history and ``with_demotion``),
:mod:`~langchain_demote.messages` (pure conversion to and from the core's records),
:mod:`~langchain_demote.hooks` (a vector-store hook and an archive retriever),
:mod:`~langchain_demote.summarizer` (a chat-model summarizer for ``Compact``),
:mod:`~langchain_demote.tools` (``recall_tool``: an agent searches its archive),
:mod:`~langchain_demote.store` and :mod:`~langchain_demote.store_recall` (``StoreHook``
and ``StoreRecall``: the long tail in a LangGraph store; need ``langgraph``, extra
``demote[langgraph]``, and are imported on first use) and
:mod:`~langchain_demote.callbacks` (what demotion did, as custom callback events in the
run that caused it).
"""

import typing as _typing

try:
    import langchain_core  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    from demote.errors import MissingExtraError

    raise MissingExtraError("langchain-core", "langchain") from exc

from langchain_demote.history import DemotingChatMessageHistory, with_demotion
from langchain_demote.hooks import ArchiveRetriever, VectorStoreHook, archive_retriever
from langchain_demote.messages import from_core, to_core
from langchain_demote.summarizer import ChatModelSummarizer
from langchain_demote.tools import recall_tool

if _typing.TYPE_CHECKING:
    from langchain_demote.middleware import DemotingMiddleware
    from langchain_demote.store import StoreHook
    from langchain_demote.store_recall import StoreRecall


def __getattr__(name: str) -> _typing.Any:
    if name == "DemotingMiddleware":  # needs the full `langchain` package: import lazily
        from langchain_demote.middleware import DemotingMiddleware

        return DemotingMiddleware
    if name == "StoreHook":  # needs `langgraph`: import lazily
        from langchain_demote.store import StoreHook

        return StoreHook
    if name == "StoreRecall":
        from langchain_demote.store_recall import StoreRecall

        return StoreRecall
    raise AttributeError(f"module 'langchain_demote' has no attribute {name!r}")


__all__ = [
    "ArchiveRetriever",
    "ChatModelSummarizer",
    "DemotingChatMessageHistory",
    "DemotingMiddleware",
    "StoreHook",
    "StoreRecall",
    "VectorStoreHook",
    "archive_retriever",
    "from_core",
    "recall_tool",
    "to_core",
    "with_demotion",
]
