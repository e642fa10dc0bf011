"""LangChain adapter for demote (``pip install 'demote[langchain]'``).

Wrap any ``BaseChatMessageHistory`` so that ``RunnableWithMessageHistory`` sends the model
a bounded window and everything that falls out of it is demoted, once, to a hook::

    demoter = Demoter(SlidingWindow.last_turns(10), SQLiteArchive("archive.db"),
                      state=SQLiteStateStore("state.db"))
    chain = RunnableWithMessageHistory(
        prompt | model, with_demotion(get_session_history, demoter),
        input_messages_key="question", history_messages_key="history",
    )

Modules: :mod:`~langchain_demote.history` (the chat history and ``with_demotion``),
:mod:`~langchain_demote.messages` (pure conversion to and from the core's records),
:mod:`~langchain_demote.hooks` (a vector-store hook and an archive retriever).
"""

try:
    import langchain_core  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    from demote.errors import MissingExtraError

    raise MissingExtraError("langchain-core", "langchain") from exc

from langchain_demote.history import DemotingChatMessageHistory, with_demotion
from langchain_demote.hooks import ArchiveRetriever, VectorStoreHook, archive_retriever
from langchain_demote.messages import from_core, to_core

__all__ = [
    "ArchiveRetriever",
    "DemotingChatMessageHistory",
    "VectorStoreHook",
    "archive_retriever",
    "from_core",
    "to_core",
    "with_demotion",
]
