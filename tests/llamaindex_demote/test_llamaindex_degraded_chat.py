"""A LlamaIndex chat never fails because its memory layer does.

Sixteen ``SimpleChatEngine`` chats (a ``MockLLM``, each over its own ``DemotingMemory``,
one Demoter shared) run as 16 tasks while the Redis or PostgreSQL state store is cut or
black-holed through a TCP proxy: no exception reaches LlamaIndex, no read of the memory
takes more than 1.5 s, every window stays within the bound, the outage reaches the
instrumentation as ``DemoteDegradedEvent``, and after the store is back nothing is lost and
nothing was delivered twice. A recall that fails (a closed archive) gives the window without
recall, and a capture that fails (a hung sink behind a full ``Recorder``) leaves the turn
uncaptured; both are reported, never raised.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import pytest
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.llms import MockLLM
from llama_index.core.storage.chat_store import SimpleChatStore
from pydantic import Field, PrivateAttr

from demote import Demoter, Recorder, SlidingWindow
from demote.archive.sqlite import SQLiteArchive
from demote.records import make_key
from llamaindex_demote import DemotingMemory
from llamaindex_demote.instrumentation import DemoteDegradedEvent
from llamaindex_demote.messages import to_core
from tests.support.outage import HOWS, KeySink, asettled, fault, proxied
from tests.support.tcp_proxy import TcpProxy

LIMIT = 6
TASKS = 16
SLOWEST = 1.5


class Collect(BaseEventHandler):
    """Every degraded event."""

    events: list[DemoteDegradedEvent] = Field(default_factory=list)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @classmethod
    def class_name(cls) -> str:
        return "CollectDegraded"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if isinstance(event, DemoteDegradedEvent):
            with self._lock:
                self.events.append(event)


@pytest.fixture
def degraded_events() -> Iterator[Collect]:
    root = get_dispatcher()
    handler = Collect()
    root.add_event_handler(handler)
    try:
        yield handler
    finally:
        root.event_handlers.remove(handler)


class TimedMemory(DemotingMemory):
    """Records how long each read took, and how many messages it gave the engine."""

    reads: ClassVar[list[tuple[float, int]]] = []

    async def aget(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        began = time.monotonic()
        out = await super().aget(input, **kwargs)
        TimedMemory.reads.append((time.monotonic() - began, len(out)))
        return out


@pytest.fixture(params=["redis", "postgres"])
def outage_store(request: pytest.FixtureRequest) -> Iterator[tuple[TcpProxy, Any]]:
    url = request.getfixturevalue(f"{request.param}_url")
    proxy, store, cleanup = proxied(request.param, url)
    try:
        yield proxy, store
    finally:
        cleanup()


@pytest.mark.parametrize("how", HOWS)
def test_sixteen_chat_engines_keep_answering_through_a_state_store_outage(
    outage_store: tuple[TcpProxy, Any], how: str, degraded_events: Collect
) -> None:
    proxy, store = outage_store
    sink = KeySink()
    demoter = Demoter(SlidingWindow.last_messages(LIMIT), sink, state=store)
    chat_store = SimpleChatStore()
    TimedMemory.reads = []
    errors: list[BaseException] = []
    keys = [f"s{n}" for n in range(TASKS)]

    async def main() -> None:
        stop = asyncio.Event()

        async def chat(key: str) -> None:
            memory = TimedMemory(demoter=demoter, chat_store=chat_store, chat_store_key=key)
            engine = SimpleChatEngine.from_defaults(llm=MockLLM(max_tokens=4), memory=memory)
            i = 0
            while not stop.is_set():
                try:
                    await engine.achat(f"question {i} of {key}")
                except BaseException as exc:
                    errors.append(exc)
                    return
                i += 1
                await asyncio.sleep(0.2)  # a steady chat (a loaded machine starves the loop)

        tasks = [asyncio.create_task(chat(k)) for k in keys]
        try:
            await asyncio.sleep(0.5)
            fault(proxy, how)
            await asyncio.sleep(1.5)
            proxy.restore()
            await asyncio.sleep(2.0)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
        for key in keys:  # after recovery: nothing lost, nothing twice
            memory = DemotingMemory(demoter=demoter, chat_store=chat_store, chat_store_key=key)
            raw = chat_store.get_messages(key)
            window = await asettled(partial(demoter.aload, key, raw, memory._p.describe), store)
            assert not window.degraded and window.pending == 0, demoter.conversation_stats(key)
            for i in range(window.start):
                fp = to_core(raw[i], describe=demoter.describe).fingerprint
                assert make_key(key, i, fp) in sink.keys, f"lost message {i} of {key}"
        await store.aclose()

    asyncio.run(main())
    demoter.close()
    assert errors == [], errors[:3]
    assert len(TimedMemory.reads) > 3 * TASKS
    slowest = max(t for t, _ in TimedMemory.reads)
    assert slowest <= SLOWEST, f"a read of the memory took {slowest:.2f} s"
    assert max(n for _, n in TimedMemory.reads) <= LIMIT
    assert degraded_events.events
    assert {e.source for e in degraded_events.events} == {"state"}
    assert sink.twice() == []


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_recall_that_fails_gives_the_window_without_recall(
    tmp_path: Path, mode: str, degraded_events: Collect
) -> None:
    archive = SQLiteArchive(tmp_path / "archive.db")
    demoter = Demoter(SlidingWindow.last_messages(LIMIT), archive)
    memory = DemotingMemory.from_defaults(demoter=demoter, chat_store_key="c", recall=archive)
    engine = SimpleChatEngine.from_defaults(llm=MockLLM(max_tokens=4), memory=memory)
    for i in range(4):
        engine.chat(f"warm up {i}")
    archive.close()  # the recall's backend is gone
    for i in range(3):
        if mode == "sync":
            reply = engine.chat(f"question {i}")
        else:
            reply = asyncio.run(engine.achat(f"question {i}"))
        assert reply.response
    assert len(degraded_events.events) == 3
    assert {e.source for e in degraded_events.events} == {"recall"}
    assert "closed" in (degraded_events.events[0].error or "")
    assert len(memory.get_all()) == 14  # the chat went on: every turn is stored


def test_a_capture_that_fails_leaves_the_turn_uncaptured_and_reported(
    degraded_events: Collect,
) -> None:
    release = threading.Event()

    def hung(item: object) -> None:
        release.wait(10)

    recorder = Recorder(hung, max_queued=1)
    demoter = Demoter(SlidingWindow.last_messages(LIMIT))
    memory = DemotingMemory.from_defaults(demoter=demoter, chat_store_key="c", capture=recorder)
    engine = SimpleChatEngine.from_defaults(llm=MockLLM(max_tokens=4), memory=memory)
    try:
        for i in range(4):
            assert engine.chat(f"question {i}").response
    finally:
        release.set()
        recorder.close()
    assert degraded_events.events and {e.source for e in degraded_events.events} == {"capture"}
    assert len(memory.get_all()) == 8
