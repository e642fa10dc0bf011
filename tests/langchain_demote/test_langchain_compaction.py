"""Compaction end to end through RunnableWithMessageHistory (issue 9)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.chat_history import BaseChatMessageHistory, InMemoryChatMessageHistory
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.outputs import ChatResult
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory
from pydantic import Field

from demote import Compact, Demoter, Demotion, SlidingWindow
from demote.engine import SUMMARY_PREFIX
from langchain_demote import with_demotion
from langchain_demote.summarizer import ChatModelSummarizer
from tests.langchain_demote.support import RecordingChatModel

LIMIT, K = 8, 4


class SlowSummaryModel(GenericFakeChatModel):
    """A fake summarizer model: 'covers' what it was asked to fold, after a delay."""

    messages: Iterator[AIMessage | str] = Field(default_factory=lambda: iter(()))
    delay: float = 0.0
    calls: int = 0

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        time.sleep(self.delay)
        self.calls += 1
        body = messages[-1].text
        folded = [line for line in body.splitlines() if line.startswith(("user:", "assistant:"))]
        previous = body.split("Previous summary:\n", 1)[1].split("\n\nNew messages:", 1)[0]
        kept = "" if previous == "(none)" else previous + " | "
        text = kept + " ; ".join(folded)
        self.messages = iter([AIMessage(text)])
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


class Archive:
    def __init__(self) -> None:
        self.keys: list[str] = []

    def deliver(self, batch: Demotion) -> None:
        self.keys.extend(m.key for m in batch.messages)


def build(delay: float) -> tuple[RunnableWithMessageHistory, RecordingChatModel, Demoter, Archive]:
    archive = Archive()
    demoter = Demoter(
        SlidingWindow.last_messages(LIMIT, eviction=Compact(compact_count=K)),
        archive,
        summarizer=ChatModelSummarizer(SlowSummaryModel(delay=delay), max_summary_tokens=10**6),
    )
    store: dict[str, BaseChatMessageHistory] = {}

    def factory(session_id: str) -> BaseChatMessageHistory:
        return store.setdefault(session_id, InMemoryChatMessageHistory())

    model = RecordingChatModel()
    prompt = ChatPromptTemplate.from_messages(
        [("system", "be brief"), MessagesPlaceholder("history"), ("human", "{q}")]
    )
    chain = RunnableWithMessageHistory(
        prompt | model,
        with_demotion(factory, demoter),
        input_messages_key="q",
        history_messages_key="history",
    )
    return chain, model, demoter, archive


def test_summary_reaches_the_model_in_place() -> None:
    chain, model, demoter, archive = build(delay=0.0)
    config: Any = {"configurable": {"session_id": "s1"}}
    for i in range(40):
        chain.invoke({"q": f"fact number {i}"}, config=config)
        assert demoter.drain(5)
    with_summary = [sent for sent in model.seen if any(SUMMARY_PREFIX in m.text for m in sent[1:2])]
    assert with_summary, "the summary never reached the model"
    for sent in model.seen:
        assert isinstance(sent[0], SystemMessage) and sent[0].text == "be brief"
        summaries = [m for m in sent if SUMMARY_PREFIX in m.text]
        assert len(summaries) <= 1
        if summaries:  # one user message right after the prompt's system message: the
            # system block is never changed by demote
            assert sent.index(summaries[0]) == 1 and isinstance(summaries[0], HumanMessage)
        assert not any(isinstance(m, SystemMessage) for m in sent[1:])
        body = [m for m in sent[1:-1] if SUMMARY_PREFIX not in m.text]
        assert len(body) <= LIMIT + 2 * K  # the history part stays bounded
    last = with_summary[-1][1].text
    assert "fact number 0" in last  # running summary carried forward from the start
    state = demoter.state_of("s1")
    assert state.summarized > 0
    assert len(archive.keys) == len(set(archive.keys)) == state.delivered


def test_slow_summarizer_does_not_slow_turns() -> None:
    chain, _, demoter, _ = build(delay=2.0)
    config: Any = {"configurable": {"session_id": "s1"}}
    durations = []
    for i in range(9):  # compaction starts at turn 7; turn 8 stays under the bulk fallback
        t0 = time.perf_counter()
        chain.invoke({"q": f"fact number {i}"}, config=config)
        durations.append(time.perf_counter() - t0)
    # loose: a turn that had to wait for a 2 s summary would take >= 2 s
    assert max(durations) < 1.0, durations
    assert demoter.drain(10)
    assert demoter.state_of("s1").summary is not None


def test_counts_stay_consistent_when_summary_and_turns_interleave() -> None:
    chain, _, demoter, archive = build(delay=0.3)
    config: Any = {"configurable": {"session_id": "s1"}}
    for i, _ in zip(range(30), itertools.count(), strict=False):
        chain.invoke({"q": f"fact number {i}"}, config=config)
    assert demoter.drain(10)
    chain.invoke({"q": "last"}, config=config)
    assert demoter.drain(10)
    assert len(archive.keys) == len(set(archive.keys))
