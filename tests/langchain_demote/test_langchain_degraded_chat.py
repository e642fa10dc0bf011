"""A LangChain chat never fails because its memory layer does.

``RunnableWithMessageHistory`` chains over ``DemotingChatMessageHistory`` (a fake chat
model, one Demoter shared by 16 threads) keep answering while the Redis or PostgreSQL state
store is cut or black-holed through a TCP proxy: no exception reaches LangChain, no read
of the window takes more than 1.5 s, the model is never sent more than the window's
bound, the outage is reported as ``demote.degraded`` custom events in the turns' runs,
and after the store is back nothing is lost and nothing was delivered twice. A capture
that fails (a hung sink behind a full ``Recorder``) leaves the turn uncaptured and
reported, never failed, and an agent whose recall fails (a closed archive) answers without
recall, reported.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from langchain.agents import create_agent
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.chat_history import BaseChatMessageHistory, InMemoryChatMessageHistory
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory
from langgraph.checkpoint.memory import InMemorySaver

from demote import Demoter, Recorder, SlidingWindow
from demote.archive.sqlite import SQLiteArchive
from demote.records import make_key
from langchain_demote import DemotingChatMessageHistory, with_demotion
from langchain_demote.messages import to_core
from langchain_demote.middleware import DemotingMiddleware
from tests.langchain_demote.support import RecordingChatModel
from tests.support.outage import HOWS, KeySink, fault, proxied, settled
from tests.support.tcp_proxy import TcpProxy

LIMIT = 6
THREADS = 16
SLOWEST = 1.5


class Degraded(BaseCallbackHandler):
    """Every ``demote.degraded`` custom event, with the run it came in."""

    def __init__(self) -> None:
        self.events: list[tuple[dict[str, Any], UUID]] = []
        self.lock = threading.Lock()

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kwargs: Any) -> None:
        if name == "demote.degraded":
            with self.lock:
                self.events.append((data, run_id))


class TimedHistory(DemotingChatMessageHistory):
    """Records how long each read of the window took (the memory layer's share of a turn:
    the rest is LangChain's and the fake model's, which a loaded machine slows down)."""

    reads: list[float]

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        began = time.monotonic()
        try:
            return super().messages
        finally:
            TimedHistory.reads.append(time.monotonic() - began)


TimedHistory.reads = []


def chain_for(demoter: Demoter, histories: dict[str, InMemoryChatMessageHistory], **kw: Any) -> Any:
    def get_session_history(session_id: str) -> BaseChatMessageHistory:
        return histories.setdefault(session_id, InMemoryChatMessageHistory())

    def timed(session_id: str) -> DemotingChatMessageHistory:
        return TimedHistory(get_session_history(session_id), demoter, session_id)

    model = RecordingChatModel()
    prompt = ChatPromptTemplate.from_messages(
        [MessagesPlaceholder("history"), ("human", "{question}")]
    )
    chain = RunnableWithMessageHistory(
        prompt | model,
        with_demotion(get_session_history, demoter, **kw) if kw else timed,
        input_messages_key="question",
        history_messages_key="history",
    )
    return chain, model


@pytest.fixture(params=["redis", "postgres"])
def outage_store(request: pytest.FixtureRequest) -> Iterator[tuple[TcpProxy, Any]]:
    url = request.getfixturevalue(f"{request.param}_url")
    proxy, store, cleanup = proxied(request.param, url)
    try:
        yield proxy, store
    finally:
        cleanup()


@pytest.mark.parametrize("how", HOWS)
def test_sixteen_chains_keep_answering_through_a_state_store_outage(
    outage_store: tuple[TcpProxy, Any], how: str
) -> None:
    proxy, store = outage_store
    sink = KeySink()
    demoter = Demoter(SlidingWindow.last_messages(LIMIT), sink, state=store, hook_threads=THREADS)
    histories: dict[str, InMemoryChatMessageHistory] = {}
    handler = Degraded()
    errors: list[BaseException] = []
    TimedHistory.reads = []
    models: list[RecordingChatModel] = []
    stop = threading.Event()

    def chat(n: int) -> None:
        chain, model = chain_for(demoter, histories)
        models.append(model)
        config: Any = {"configurable": {"session_id": f"s{n}"}, "callbacks": [handler]}
        i = 0
        while not stop.is_set():
            try:
                chain.invoke({"question": f"question {i} of s{n}"}, config)
            except BaseException as exc:
                errors.append(exc)
                return
            i += 1
            stop.wait(0.02)

    threads = [threading.Thread(target=chat, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        fault(proxy, how)
        time.sleep(1.5)
        proxy.restore()
        time.sleep(2.0)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert errors == [], errors[:3]
    assert len(TimedHistory.reads) > 3 * THREADS
    slowest = max(TimedHistory.reads)
    assert slowest <= SLOWEST, f"a read of the window took {slowest:.2f} s"
    # history (the window) plus the question: never more than the bound allows
    assert max(len(seen) for m in models for seen in m.seen) <= LIMIT + 1
    assert handler.events and {d["source"] for d, _ in handler.events} == {"state"}
    for session, inner in histories.items():  # after recovery: nothing lost, once each
        history = DemotingChatMessageHistory(inner, demoter, session)
        raw = inner.messages
        window = settled(partial(demoter.load, session, raw, history._describe), store)
        assert not window.degraded and window.pending == 0
        for i in range(window.start):
            key = make_key(session, i, to_core(raw[i], demoter.describe).fingerprint)
            assert key in sink.keys, f"lost message {i} of {session}"
    assert sink.twice() == []
    demoter.close()


def test_a_capture_that_fails_leaves_the_turn_uncaptured_and_reported() -> None:
    release = threading.Event()
    received: list[object] = []

    def hung(item: object) -> None:  # the sink hangs: the recorder fills up
        received.append(item)
        release.wait(10)

    recorder = Recorder(hung, max_queued=1)
    demoter = Demoter(SlidingWindow.last_messages(LIMIT))
    histories: dict[str, InMemoryChatMessageHistory] = {}
    chain, _ = chain_for(demoter, histories, capture=recorder)
    handler = Degraded()
    config: Any = {"configurable": {"session_id": "s"}, "callbacks": [handler]}
    try:
        for i in range(4):
            reply = chain.invoke({"question": f"question {i}"}, config)
            assert isinstance(reply, BaseMessage)
    finally:
        release.set()
        recorder.close()
    sources = [d["source"] for d, _ in handler.events]
    assert sources and set(sources) == {"capture"}
    assert "HookBusy" in handler.events[0][0]["error"]
    assert len(histories["s"].messages) == 8  # every turn is stored all the same


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_agent_whose_recall_fails_answers_without_recall(tmp_path: Path, mode: str) -> None:
    archive = SQLiteArchive(tmp_path / "archive.db")
    demoter = Demoter(SlidingWindow.last_messages(LIMIT), archive)
    middleware = DemotingMiddleware(demoter=demoter, recall=archive)
    agent = create_agent(
        RecordingChatModel(), [], checkpointer=InMemorySaver(), middleware=[middleware]
    )
    handler = Degraded()
    config: Any = {"configurable": {"thread_id": "t"}, "callbacks": [handler]}
    archive.close()  # the long tail's backend is gone
    for i in range(3):
        turn = {"messages": [HumanMessage(f"question {i}")]}
        if mode == "sync":
            out = agent.invoke(turn, config)
        else:
            out = asyncio.run(agent.ainvoke(turn, config))
        assert isinstance(out["messages"][-1], AIMessage)
    assert len(handler.events) == 3
    assert {d["source"] for d, _ in handler.events} == {"recall"}
    assert "closed" in handler.events[0][0]["error"]
