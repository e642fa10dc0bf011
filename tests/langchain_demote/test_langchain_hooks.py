"""VectorStoreHook and the archive retriever."""

from __future__ import annotations

from operator import itemgetter
from pathlib import Path
from typing import Any

import pytest
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore

from demote import (
    ConfigError,
    ConversationIdError,
    DemotedMessage,
    Demoter,
    Demotion,
    Recalled,
    SlidingWindow,
)
from demote.archive.sqlite import SQLiteArchive
from langchain_demote import (
    ArchiveRetriever,
    DemotingChatMessageHistory,
    VectorStoreHook,
    archive_retriever,
)


def batch(cid: str, *texts: str, start: int = 0) -> Demotion:
    return Demotion(
        cid,
        tuple(
            DemotedMessage("user" if i % 2 == 0 else "assistant", t, i, f"{cid}-k{i}")
            for i, t in enumerate(texts, start)
        ),
    )


def store() -> InMemoryVectorStore:
    return InMemoryVectorStore(DeterministicFakeEmbedding(size=16))


def test_vector_store_hook_writes_documents_keyed_by_message_key() -> None:
    vs = store()
    hook = VectorStoreHook(vs)
    hook.deliver(batch("c", "hiking in the alps", "", "it rained"))
    docs = vs.get_by_ids(["c-k0", "c-k1", "c-k2"])
    assert [d.page_content for d in docs] == ["hiking in the alps", "it rained"]  # empty skipped
    assert docs[0].metadata == {"conversation_id": "c", "index": 0, "role": "user", "key": "c-k0"}
    hook.deliver(batch("c", "hiking in the alps", "", "it rained"))  # re-delivery overwrites
    assert len(vs.store) == 2
    assert hook.has_keys("c", ["c-k0", "c-k1", "nope"]) == {"c-k0"}
    assert hook.has_keys("other", ["c-k0"]) == set()


async def test_vector_store_hook_async_path() -> None:
    vs = store()
    hook = VectorStoreHook(vs, skip_empty=False)
    await hook.adeliver(batch("c", "a", ""))
    await hook.adeliver(batch("c", "a", ""))
    assert len(vs.store) == 2


def test_vector_store_hook_behind_a_demoter() -> None:
    vs = store()
    demoter = Demoter(SlidingWindow.last_messages(2), VectorStoreHook(vs), on_hook_error="raise")
    history = DemotingChatMessageHistory(InMemoryChatMessageHistory(), demoter, "v")
    for i in range(5):
        history.add_messages([HumanMessage(f"q{i}"), AIMessage(f"a{i}")])
        history.messages  # noqa: B018 - the read demotes
    docs = vs.get_by_ids(list(vs.store))
    assert sorted(d.metadata["index"] for d in docs) == list(range(8))


def test_vector_store_hook_rejects_non_stores() -> None:
    with pytest.raises(ConfigError, match="vectorstore"):
        VectorStoreHook(object())  # type: ignore[arg-type]


class TinyRecall:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []

    def search(self, conversation_id: str, query: str, k: int = 5) -> list[Recalled]:
        self.calls.append((conversation_id, query, k))
        return [Recalled("user", f"about {query}", 3, "key3", 1.5)]


def test_retriever_over_any_recall() -> None:
    recall = TinyRecall()
    retriever = archive_retriever(recall, "c", k=2)
    assert isinstance(retriever, BaseRetriever) and isinstance(retriever, ArchiveRetriever)
    (doc,) = retriever.invoke("tents")
    assert doc.page_content == "about tents"
    assert doc.metadata == {
        "conversation_id": "c",
        "role": "user",
        "index": 3,
        "key": "key3",
        "score": 1.5,
    }
    assert recall.calls == [("c", "tents", 2)]


async def test_retriever_over_sqlite_archive_in_a_chain(tmp_path: Path) -> None:
    with SQLiteArchive(tmp_path / "a.db") as archive:
        archive.deliver(batch("c", "we hiked the alps in june", "the tent leaked", start=0))
        archive.deliver(batch("other", "alps alps alps"))
        retriever = archive_retriever(archive, "c", k=3)

        def texts(state: dict[str, Any]) -> list[str]:
            return [d.page_content for d in state["context"]]

        chain = RunnablePassthrough.assign(context=itemgetter("question") | retriever) | (
            RunnableLambda(texts)
        )
        assert chain.invoke({"question": "when did we hike the alps?"})[0] == (
            "we hiked the alps in june"
        )
        docs = await retriever.ainvoke("alps")
        assert {d.metadata["conversation_id"] for d in docs} == {"c"}


def test_archive_retriever_validates() -> None:
    with pytest.raises(ConversationIdError):
        archive_retriever(TinyRecall(), "")
    with pytest.raises(ConfigError, match="search"):
        archive_retriever(object(), "c")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="k"):
        archive_retriever(TinyRecall(), "c", k=0)
