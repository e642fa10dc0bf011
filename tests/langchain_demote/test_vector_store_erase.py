"""VectorStoreHook.erase: by the ids it wrote (the dedup keys) and by metadata, fenced."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding, Embeddings
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore

from demote import DemotedMessage, Demoter, Demotion, FencedOut, InMemoryStateStore
from demote import SlidingWindow as SW
from demote.erase import TierReport
from langchain_demote import VectorStoreHook
from tests.strategies import Msg, describer

EMBED = DeterministicFakeEmbedding(size=16)


def batch(cid: str, *texts: str, start: int = 0, fence: int | None = None) -> Demotion:
    return Demotion(
        cid,
        tuple(DemotedMessage("user", t, i, f"{cid}-k{i}") for i, t in enumerate(texts, start)),
        fence,
    )


class KeysOnlyStore(VectorStore):
    """A vector store that deletes by id but can neither look ids up nor filter by metadata
    (as many hosted stores): ``get_by_ids`` is left to the base class, which refuses."""

    def __init__(self, *, can_delete: bool = True) -> None:
        self.docs: dict[str, Document] = {}
        self.can_delete = can_delete

    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict[Any, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        texts = list(texts)
        ids = ids or [str(len(self.docs) + i) for i in range(len(texts))]
        for i, text, meta in zip(ids, texts, metadatas or [{}] * len(texts), strict=True):
            self.docs[i] = Document(page_content=text, metadata=meta, id=i)
        return ids

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        if not self.can_delete:
            return super().delete(ids)
        for i in ids or []:
            self.docs.pop(i, None)
        return True

    def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return [d for d in self.docs.values() if query in d.page_content][:k]

    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Embeddings,
        metadatas: list[dict[Any, Any]] | None = None,
        **kwargs: Any,
    ) -> KeysOnlyStore:
        store = cls()
        store.add_texts(texts, metadatas)
        return store


def texts(vs: InMemoryVectorStore, cid: str) -> list[str]:
    return sorted(d["text"] for d in vs.store.values() if d["metadata"]["conversation_id"] == cid)


def test_an_in_memory_store_is_erased_by_metadata_without_any_key() -> None:
    vs = InMemoryVectorStore(EMBED)
    hook = VectorStoreHook(vs)
    hook.deliver(batch("c", "my locker code is 4417", "hiking", "rain"))
    hook.deliver(batch("o", "my bike code is 9931", "tea"))
    assert hook.erase("c") == 3
    assert texts(vs, "c") == [] and texts(vs, "o") == ["my bike code is 9931", "tea"]
    hits = vs.similarity_search("my locker code is 4417", k=10)
    assert all(d.metadata["conversation_id"] == "o" for d in hits) and len(hits) == 2
    assert hook.erase("c") == 0


def test_keys_reach_a_store_that_cannot_be_searched_and_what_they_miss_stays() -> None:
    vs = KeysOnlyStore()
    hook = VectorStoreHook(vs)
    hook.deliver(batch("c", "old text the history no longer has", "kept", "kept too"))
    hook.deliver(batch("o", "other"))
    # The history was rewritten since: its keys no longer name the first message.
    assert hook.erase("c", keys=["c-k1", "c-k2", "c-k9"]) is None  # it cannot count
    assert sorted(vs.docs) == ["c-k0", "o-k0"]
    # find_ids= reaches it (Chroma: store.get(where={"conversation_id": cid})["ids"]).
    finder = VectorStoreHook(vs, find_ids=lambda cid: [i for i in vs.docs if i.startswith(cid)])
    assert finder.erase("c") is None and sorted(vs.docs) == ["o-k0"]


def test_only_the_conversations_documents_are_deleted_and_counted() -> None:
    vs = InMemoryVectorStore(EMBED)
    hook = VectorStoreHook(vs, find_ids=lambda cid: ())  # no metadata lookup: keys alone
    hook.deliver(batch("c", "a", "b"))
    hook.deliver(batch("o", "x"))
    assert hook.erase("c", keys=["c-k0", "c-k1", "c-k7", "o-k0"]) == 2
    assert texts(vs, "o") == ["x"]


async def test_aerase_and_a_late_batch_older_than_the_erase_is_fenced_out() -> None:
    vs = InMemoryVectorStore(EMBED)
    hook = VectorStoreHook(vs)
    hook.deliver(batch("c", "a", "b", fence=3))
    assert await hook.aerase("c", fence=5) == 2
    with pytest.raises(FencedOut, match="fencing token 4, older than its erase"):
        hook.deliver(batch("c", "late", fence=4))
    with pytest.raises(FencedOut):
        await hook.adeliver(batch("c", "late", fence=4))
    hook.erase("c", fence=2)  # an older erase keeps the newer fence
    with pytest.raises(FencedOut):
        hook.deliver(batch("c", "late", fence=4))
    hook.deliver(batch("o", "other", fence=1))  # other conversations are not fenced
    hook.deliver(batch("c", "new", fence=6))
    hook.deliver(batch("c", "no lease", start=1))
    assert texts(vs, "c") == ["new", "no lease"]


def test_a_store_that_cannot_delete_is_reported_failed_by_the_demoter() -> None:
    vs = KeysOnlyStore(can_delete=False)
    demoter = Demoter(SW.last_messages(2), VectorStoreHook(vs))
    msgs = [Msg("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(6)]
    demoter.load("c", msgs, describer(demoter))
    report = demoter.erase("c", messages=msgs, describe=describer(demoter))
    (tier,) = report.tiers
    assert tier.tier == "VectorStoreHook" and tier.status == "failed"
    assert "NotImplementedError" in (tier.error or "") and not report.complete
    assert len(vs.docs) == 4


def test_the_demoter_hands_the_keys_of_the_history_to_the_hook() -> None:
    vs = KeysOnlyStore()
    store = InMemoryStateStore()
    demoter = Demoter(SW.last_messages(2), VectorStoreHook(vs), state=store)
    msgs = [Msg("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(8)]
    demoter.load("c", msgs, describer(demoter))
    assert len(vs.docs) == 6
    report = demoter.erase("c", messages=msgs, describe=describer(demoter))
    assert report.tiers == (TierReport("VectorStoreHook", "erased", None),)
    assert vs.docs == {}
