"""Demotion events reach LlamaIndex instrumentation handlers, inside the chat's spans.

A real ``SimpleChatEngine`` over ``DemotingMemory`` runs with an event handler and a span
handler registered on LlamaIndex's root dispatcher (what Phoenix, Langfuse and others
do). Every demote event must arrive as its own class, with counts and keys equal to what
the archive holds, under the span of the chat call that caused it (or, with recall, the
memory's own span inside it); the recall event never carries the query text.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.span_handlers import SimpleSpanHandler
from llama_index.core.llms import MockLLM
from pydantic import Field, PrivateAttr

from demote import DemoteEvent, Demoter, SlidingWindow
from demote.archive.sqlite import SQLiteArchive
from llamaindex_demote import DemotingMemory
from llamaindex_demote.instrumentation import (
    DemoteDeliveredEvent,
    DemoteDemotedEvent,
    DemoteRecalledEvent,
    DemotionEvent,
    emit_events,
)


class Collect(BaseEventHandler):
    """Every event, in order."""

    events: list[BaseEvent] = Field(default_factory=list)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @classmethod
    def class_name(cls) -> str:
        return "Collect"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        with self._lock:
            self.events.append(event)

    def demote(self) -> list[DemotionEvent]:
        return [e for e in self.events if isinstance(e, DemotionEvent)]


@pytest.fixture
def handlers() -> Iterator[tuple[Collect, SimpleSpanHandler]]:
    root = get_dispatcher()
    events, spans = Collect(), SimpleSpanHandler()
    root.add_event_handler(events)
    root.add_span_handler(spans)
    try:
        yield events, spans
    finally:
        root.event_handlers.remove(events)
        root.span_handlers.remove(spans)


def span_parents(spans: SimpleSpanHandler) -> dict[str, str | None]:
    return {s.id_: s.parent_id for s in spans.completed_spans}


QUESTIONS = ["The locker code is 4512.", *(f"Small talk {i}." for i in range(5)),
             "What was the locker code?"]  # fmt: skip


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_chat_engine_events_reach_a_registered_handler_inside_the_chat_span(
    mode: str, tmp_path: Path, handlers: tuple[Collect, SimpleSpanHandler]
) -> None:
    collected, spans = handlers
    archive = SQLiteArchive(tmp_path / "archive.db")
    demoter = Demoter(SlidingWindow.last_turns(2), archive)
    memory = DemotingMemory.from_defaults(
        demoter=demoter, chat_store_key="reader-1", recall=archive, recall_k=2
    )
    engine = SimpleChatEngine.from_defaults(llm=MockLLM(max_tokens=4), memory=memory)

    async def run() -> None:
        for q in QUESTIONS:
            if mode == "sync":
                engine.chat(q)
            else:
                await engine.achat(q)

    asyncio.run(run())
    events = collected.demote()
    demoted = [e for e in events if isinstance(e, DemoteDemotedEvent)]
    delivered = [e for e in events if isinstance(e, DemoteDeliveredEvent)]
    recalled = [e for e in events if isinstance(e, DemoteRecalledEvent)]
    assert {e.kind for e in demoted} == {"demoted"} and {e.kind for e in recalled} == {"recalled"}
    # 7 chats of 2 messages; each get reads after the user message is stored, so chat i
    # (0-based) reads 2i + 1 messages and, from chat 2 on, cuts one more turn group.
    assert [e.count for e in demoted] == [2] * 5
    assert sum(e.count for e in delivered) == archive.count("reader-1") == 10
    assert [k for e in delivered for k in e.keys] == [r.key for r in archive.messages("reader-1")]
    assert recalled[-1].count >= 1 and recalled[-1].duration is not None
    assert all("locker" not in json.dumps(e.model_dump(), default=str) for e in recalled)
    # Every event of a recalling memory is inside the memory's span, itself inside the
    # chat call's span.
    parents = span_parents(spans)
    for event in events:
        assert event.span_id is not None and event.span_id.startswith("DemotingMemory.")
        parent = parents[event.span_id]
        assert parent is not None and parent.startswith("SimpleChatEngine.")


def test_without_recall_events_are_in_the_chat_span(
    handlers: tuple[Collect, SimpleSpanHandler],
) -> None:
    collected, spans = handlers
    demoter = Demoter(SlidingWindow.last_messages(2))
    memory = DemotingMemory.from_defaults(demoter=demoter, chat_store_key="plain")
    engine = SimpleChatEngine.from_defaults(llm=MockLLM(max_tokens=4), memory=memory)
    for i in range(3):
        engine.chat(f"message {i}")
    events = collected.demote()
    # Chat 1 reads 3 messages (cut 2), chat 2 reads 5 (cut 2 more).
    assert [(type(e).__name__, e.count) for e in events] == [
        ("DemoteDemotedEvent", 2),
        ("DemoteDemotedEvent", 2),
    ]
    parents = span_parents(spans)
    for event in events:
        assert event.span_id is not None and event.span_id.startswith("SimpleChatEngine.chat")
        assert event.span_id in parents


def test_nothing_is_sent_without_a_handler(handlers: tuple[Collect, SimpleSpanHandler]) -> None:
    event = DemoteEvent("demoted", "quiet", 0, 1, 1)
    assert emit_events([event])  # the fixture's handler listens
    root = get_dispatcher()
    root.event_handlers.remove(handlers[0])
    try:
        assert not emit_events([event])  # only LlamaIndex's NullEventHandler is left
    finally:
        root.add_event_handler(handlers[0])
    assert [e.kind for e in handlers[0].demote()] == ["demoted"]
