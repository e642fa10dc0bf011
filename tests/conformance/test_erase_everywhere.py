"""Erase end to end, through each adapter, over every kind of tier at once.

A conversation holding a unique secret is written through the LangChain history, the
agents middleware and the LlamaIndex memory, over one hook: a ``FanOutHook`` of an
``SQLiteArchive``, a ``Recorder`` with an ``SQLiteOutbox`` in front of mem0 (a real
offline ``Memory``, configured as in tests/demote/mem0/test_mem0.py; it refuses one batch,
which the outbox dead-letters) and a ``VectorStoreHook`` on langchain-core's
``InMemoryVectorStore``; the demotion state is an ``SQLiteStateStore``. The two chat
adapters also capture user turns into a second mem0 through a Recorder with its own
outbox. Then the adapter erases the conversation, and:

- no API returns the secret: archive search and messages, the archive retriever, mem0
  search and get_all, the vector store's similarity search, the outboxes' queues and dead
  letters, the adapter's own history;
- the secret's bytes are in none of the SQLite files (main file, ``-wal``, ``-shm``) of
  the archive, the outboxes and the state store, nor in any file of mem0's (its history
  database, the embedded Qdrant's storage);
- a second conversation, written the same way, is untouched everywhere.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest
from langchain_core._api.deprecation import LangChainDeprecationWarning
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.vectorstores import InMemoryVectorStore
from llama_index.core.base.llms.types import ChatMessage, MessageRole

from demote import Demoter, Demotion, FanOutHook, Recorder, SlidingWindow, SQLiteStateStore
from demote.archive.sqlite import SQLiteArchive
from demote.capture import RetryPolicy, SQLiteOutbox
from demote.erase import EraseReport
from demote.mem0 import Mem0Capture, Mem0Hook, Mem0Recall
from langchain_demote import DemotingChatMessageHistory, VectorStoreHook, archive_retriever
from llamaindex_demote import DemotingMemory
from tests.demote.capture.test_capture_erase import leaks, wait_for
from tests.demote.mem0 import test_mem0
from tests.demote.mem0.test_mem0 import stored

mem0_module = test_mem0.mem0_module
make_memory = test_mem0.make_memory
network_attempts = test_mem0.network_attempts

SECRET, KEPT = "quokka7741vault", "heron3390kite"
ERASED, OTHER = "tenant-5521-erased", "tenant-o"  # its id must not survive either
POISON = "poison"  # mem0 refuses the batch holding it: the outbox dead-letters it
TURNS = 8


class Refusing(Mem0Hook):
    """mem0 behind the Recorder, refusing every batch that holds the poison."""

    def deliver(self, batch: Demotion) -> None:
        if any(POISON in m.text for m in batch.messages):
            raise RuntimeError("mem0 refuses this batch")
        super().deliver(batch)


@dataclass
class Tiers:
    """Every store the conversations reach, and the files that must not keep a secret."""

    folder: Path
    archive: SQLiteArchive
    outbox: SQLiteOutbox
    recorder: Recorder
    memory: Any
    vectors: InMemoryVectorStore
    state: SQLiteStateStore
    demoter: Demoter
    capture_memory: Any = None
    capture: Mem0Capture | None = None
    closers: list[Any] = field(default_factory=list)

    def files(self) -> list[Path]:
        names = ["archive.db", "outbox.db", "state.db"]
        names += ["capture.db"] if self.capture is not None else []
        # mem0's own files: its history database and the embedded Qdrant's storage.
        mem0 = sorted(p for p in self.folder.glob("mem0-*/**/*") if p.is_file())
        return [self.folder / n for n in names] + [p for p in mem0 if "-" not in p.suffix]

    def settle(self) -> None:
        """Wait until the Recorders have delivered (or dead-lettered) everything queued."""
        wait_for(lambda: self.outbox.pending() == 0, timeout=30)
        if self.capture is not None:
            wait_for(lambda: self.capture.stats.queued == self.capture.stats.delivered, 30)


def turn(cid: str, i: int) -> tuple[str, str]:
    word = SECRET if cid == ERASED else KEPT
    user = f"{POISON} {word} turn {i}" if i == 1 else f"note {i}: my locker code is {word}"
    return user, f"Noted {i}, the code is {word}."


class Chat(Protocol):
    """One adapter: writes a turn (and reads, which demotes), erases a conversation."""

    def say(self, cid: str, user: str, reply: str) -> None: ...

    def history(self, cid: str) -> list[str]: ...

    def erase(self, cid: str) -> EraseReport: ...


class LangChainChat:
    def __init__(self, tiers: Tiers) -> None:
        self.tiers = tiers
        self.histories: dict[str, DemotingChatMessageHistory] = {}

    def _history(self, cid: str) -> DemotingChatMessageHistory:
        if cid not in self.histories:
            with warnings.catch_warnings():
                # Ignored by the test settings, but mem0's import (mem0.client.main) turns
                # every DeprecationWarning back to "default" in the test that imports it.
                warnings.simplefilter("ignore", LangChainDeprecationWarning)
                inner = InMemoryChatMessageHistory()
            self.histories[cid] = DemotingChatMessageHistory(
                inner, self.tiers.demoter, cid, capture=self.tiers.capture
            )
        return self.histories[cid]

    def say(self, cid: str, user: str, reply: str) -> None:
        history = self._history(cid)
        history.add_messages([HumanMessage(user), AIMessage(reply)])
        history.messages  # noqa: B018 - the read demotes

    def history(self, cid: str) -> list[str]:
        return [str(m.content) for m in self._history(cid).all_messages]

    def erase(self, cid: str) -> EraseReport:
        return self._history(cid).erase()


class AgentChat:
    def __init__(self, tiers: Tiers) -> None:
        from langchain.agents import create_agent
        from langchain_core.language_models.fake_chat_models import FakeListChatModel
        from langgraph.checkpoint.memory import InMemorySaver

        from langchain_demote import DemotingMiddleware

        self.saver = InMemorySaver()
        self.middleware = DemotingMiddleware(tiers.demoter, recall=tiers.archive)
        self.replies: list[str] = []
        self.model = FakeListChatModel(responses=self.replies)
        self.agent = create_agent(self.model, checkpointer=self.saver, middleware=[self.middleware])

    def say(self, cid: str, user: str, reply: str) -> None:
        self.model.responses = [reply]
        self.model.i = 0
        self.agent.invoke({"messages": [("user", user)]}, {"configurable": {"thread_id": cid}})

    def history(self, cid: str) -> list[str]:
        state = self.agent.get_state({"configurable": {"thread_id": cid}})
        return [str(m.content) for m in state.values.get("messages", [])]

    def erase(self, cid: str) -> EraseReport:
        return self.middleware.erase(cid, checkpointer=self.saver)


class LlamaIndexChat:
    def __init__(self, tiers: Tiers) -> None:
        self.tiers = tiers
        self.memories: dict[str, DemotingMemory] = {}

    def _memory(self, cid: str) -> DemotingMemory:
        if cid not in self.memories:
            self.memories[cid] = DemotingMemory.from_defaults(
                demoter=self.tiers.demoter, chat_store_key=cid, capture=self.tiers.capture
            )
        return self.memories[cid]

    def say(self, cid: str, user: str, reply: str) -> None:
        memory = self._memory(cid)
        memory.put_messages(
            [
                ChatMessage(role=MessageRole.USER, content=user),
                ChatMessage(role=MessageRole.ASSISTANT, content=reply),
            ]
        )
        memory.get()

    def history(self, cid: str) -> list[str]:
        return [str(m.content) for m in self._memory(cid).get_all()]

    def erase(self, cid: str) -> EraseReport:
        return self._memory(cid).erase()


ADAPTERS: dict[str, tuple[type[Any], bool]] = {
    "langchain-history": (LangChainChat, True),  # (adapter, has a capture)
    "agents-middleware": (AgentChat, False),
    "llamaindex-memory": (LlamaIndexChat, True),
}


@pytest.fixture
def build(make_memory: Callable[..., Any], tmp_path: Path) -> Iterator[Callable[[bool], Tiers]]:
    made: list[Tiers] = []

    def tiers(with_capture: bool) -> Tiers:
        once = RetryPolicy(max_attempts=1, base_delay=0, max_delay=0)
        archive = SQLiteArchive(tmp_path / "archive.db")
        outbox = SQLiteOutbox(tmp_path / "outbox.db", retry=once)
        memory = make_memory()
        recorder = Recorder(Refusing(memory), outbox=outbox)
        vectors = InMemoryVectorStore(DeterministicFakeEmbedding(size=32))
        state = SQLiteStateStore(tmp_path / "state.db")
        hook = FanOutHook(archive, recorder, VectorStoreHook(vectors))
        demoter = Demoter(SlidingWindow.last_messages(4), hook, state=state)
        t = Tiers(tmp_path, archive, outbox, recorder, memory, vectors, state, demoter)
        if with_capture:
            t.capture_memory = make_memory()
            t.capture = Mem0Capture(
                t.capture_memory,
                infer=False,
                recorder=lambda sink: Recorder(sink, outbox=SQLiteOutbox(tmp_path / "capture.db")),
            )
        made.append(t)
        return t

    yield tiers
    for t in made:
        if t.capture is not None:
            t.capture.close()
        t.demoter.close()
        t.recorder.close()
        for store in (t.outbox, t.archive, t.state):
            store.close()


def vector_texts(vectors: InMemoryVectorStore, cid: str) -> list[str]:
    return sorted(
        d["text"] for d in vectors.store.values() if d["metadata"]["conversation_id"] == cid
    )


def everything_of(t: Tiers, cid: str, word: str) -> dict[str, int]:
    """How many items each API returns for ``cid`` (or that hold ``word``)."""
    recall = Mem0Recall(t.memory)
    dead = [d for d in t.outbox.dead_letters() if word in str(d.item)]
    counts = {
        "archive.messages": len(t.archive.messages(cid)),
        "archive.search": len(t.archive.search(cid, f"locker code {word}", k=10)),
        "retriever": len(archive_retriever(t.archive, cid, k=10).invoke(word)),
        "mem0.search": len(recall.search(cid, f"locker code {word}", k=10)),
        "mem0.get_all": len(stored(t.memory, cid)),
        "vector_store": sum(
            word in d.page_content for d in t.vectors.similarity_search(word, k=1000)
        ),
        "outbox": len([r for r in t.outbox.load() if word in r.payload]) + len(dead),
    }
    if t.capture is not None:
        counts["capture.mem0"] = len(stored(t.capture_memory, cid))
    return counts


@pytest.mark.parametrize("adapter", list(ADAPTERS))
def test_erase_forgets_the_secret_everywhere_and_keeps_the_other_conversation(
    adapter: str, build: Callable[[bool], Tiers]
) -> None:
    kind, with_capture = ADAPTERS[adapter]
    tiers = build(with_capture)
    chat: Chat = kind(tiers)
    for i in range(TURNS):
        for cid in (ERASED, OTHER):
            chat.say(cid, *turn(cid, i))
    tiers.settle()
    before_c, before_o = everything_of(tiers, ERASED, SECRET), everything_of(tiers, OTHER, KEPT)
    assert all(before_c.values()), f"every API holds the secret before: {before_c}"
    archive_file, outbox_file = tiers.files()[:2]
    assert leaks(archive_file, SECRET) and leaks(outbox_file, SECRET)
    history = tiers.folder / "mem0-0" / "history.db"
    assert history in tiers.files() and leaks(history, SECRET)
    o_vectors = vector_texts(tiers.vectors, OTHER)
    o_history = chat.history(OTHER)

    report = chat.erase(ERASED)

    assert report.complete, report
    assert report.inner is not None and report.inner.removed == 2 * TURNS
    assert report.inner.kind in ("history", "checkpoint", "chat store")
    assert (report.state.tier, report.state.removed) == ("SQLiteStateStore", 1)
    assert {t.status for t in report.touched} == {"erased"} and report.found
    expected = ["FanOutHook[0].SQLiteArchive", "FanOutHook[1].Recorder",
                "FanOutHook[1].Recorder[0].Refusing", "FanOutHook[2].VectorStoreHook"]  # fmt: skip
    if with_capture:
        expected += ["Mem0Capture[0].Recorder", "Mem0Capture[0].Recorder[0].Mem0Writer"]
    assert [t.tier for t in report.tiers] == expected
    after_c = everything_of(tiers, ERASED, SECRET)
    assert set(after_c.values()) == {0}, f"an API still returns the secret: {after_c}"
    assert chat.history(ERASED) == []
    for f in tiers.files():
        assert leaks(f, SECRET) == [], f"{f.name} keeps the secret's bytes"
        assert leaks(f, ERASED) == [], f"{f.name} keeps the erased conversation's id"
    assert tiers.state.get(ERASED) is None
    # The other conversation, untouched everywhere.
    assert everything_of(tiers, OTHER, KEPT) == before_o
    assert vector_texts(tiers.vectors, OTHER) == o_vectors and chat.history(OTHER) == o_history
    assert tiers.state.get(OTHER) is not None
