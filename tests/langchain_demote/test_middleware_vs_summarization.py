"""The same conversation through LangChain's SummarizationMiddleware and DemotingMiddleware.

Observable differences asserted here:

- theirs summarizes inline, in ``before_model``, right before the model call it delays,
  and replaces the history in the agent state with a summary ``HumanMessage`` plus the
  kept messages: the summarized messages are gone, stored nowhere;
- ours keeps the full history in the checkpoint, sends the model the window with the
  summary as a ``SystemMessage`` after the pinned ones (never written to the state),
  demotes every message that leaves the window to the hook exactly once, and writes the
  summary in a background thread: the agent turn returns while the summarizer is still
  blocked.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import SummarizationMiddleware
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, SystemMessage
from langgraph.checkpoint.memory import InMemorySaver
from test_middleware import (
    PINNED,
    Recorder,
    ScriptedModel,
    add,
    check_archive,
    check_sent,
    config,
    lookup,
    turn_text,
)

from demote import Compact, Demoter, SlidingWindow
from demote.engine import SUMMARY_PREFIX
from demote.records import MessageRecord
from demote.summarize import TemplateSummarizer
from langchain_demote.middleware import DemotingMiddleware

TURNS = 12


class LoggedModel(ScriptedModel):
    """The scripted model, also logging each call (and its thread) to a shared list."""

    log: Any = None  # a shared list[tuple[str, str]] (Any: pydantic would copy a list)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.log.append(("model", threading.current_thread().name))
        return super()._generate(messages, *args, **kwargs)


def first_message(n: int) -> list[BaseMessage]:
    human = HumanMessage(turn_text("t1", n))
    return [SystemMessage(PINNED), human] if n == 0 else [human]


def say(agent: Any, n: int) -> None:
    agent.invoke({"messages": first_message(n)}, config("t1"))


def test_langchain_summarization_is_inline_and_replaces_state() -> None:
    log: list[tuple[str, str]] = []
    model = LoggedModel(log=log)
    summarized: list[int] = []

    def summarize(messages: list[AnyMessage]) -> str:
        log.append(("summarize", threading.current_thread().name))
        summarized.append(len(messages))
        return f"digest of {len(messages)} messages"

    theirs = SummarizationMiddleware(
        model=model, trigger=("messages", 14), keep=("messages", 8), summarizer=summarize
    )
    agent = create_agent(
        model,
        [lookup, add],
        system_prompt="agent prompt",
        checkpointer=InMemorySaver(),
        middleware=[theirs],
    )
    for n in range(TURNS):
        say(agent, n)

    # inline: every summary runs on the agent's path, right before the model call it delays
    kinds = [kind for kind, _ in log]
    assert summarized, "the trigger fired"
    for i, kind in enumerate(kinds):
        if kind == "summarize":
            assert kinds[i + 1] == "model"
    # destructive: the state holds a summary HumanMessage instead of the early history
    history = agent.get_state(config("t1")).values["messages"]
    assert len(history) < 20
    texts = [m.text for m in history]
    assert turn_text("t1", 0) not in texts
    summaries = [m for m in history if m.text.startswith("Here is a summary")]
    assert len(summaries) == 1 and isinstance(summaries[0], HumanMessage)
    assert PINNED not in texts, "even the leading system message was folded away"


class BlockingSummarizer:
    """TemplateSummarizer that logs its thread and waits until the test releases it."""

    def __init__(self, log: list[tuple[str, str]]) -> None:
        self.log = log
        self.started = threading.Event()
        self.release = threading.Event()
        self.inner = TemplateSummarizer()

    def summarize(self, previous: str | None, messages: Sequence[MessageRecord]) -> str:
        self.log.append(("summarize", threading.current_thread().name))
        self.started.set()
        assert self.release.wait(10)
        return self.inner.summarize(previous, messages)


def test_demoting_middleware_keeps_history_and_summarizes_off_the_hot_path() -> None:
    log: list[tuple[str, str]] = []
    model = LoggedModel(log=log)
    recorder = Recorder()
    summarizer = BlockingSummarizer(log)
    policy = SlidingWindow.last_messages(8, eviction=Compact(compact_count=6))
    demoter = Demoter(policy, recorder, summarizer=summarizer)
    agent = create_agent(
        model,
        [lookup, add],
        system_prompt="agent prompt",
        checkpointer=InMemorySaver(),
        middleware=[DemotingMiddleware(demoter=demoter)],
    )
    n = 0
    while not summarizer.started.is_set():
        say(agent, n)
        n += 1
        assert n < TURNS
    # the summarizer is blocked, yet a whole agent turn (several model calls) completes
    calls = len(model.calls)
    say(agent, n)
    assert len(model.calls) > calls
    assert not summarizer.release.is_set()
    summarizer.release.set()
    assert demoter.drain(10)
    for later in range(n + 1, TURNS):
        say(agent, later)
        assert demoter.drain(10)
    assert demoter.state_of("t1").summary is not None
    say(agent, TURNS)

    # off the hot path: summaries never ran on a thread that called the model
    model_threads = {name for kind, name in log if kind == "model"}
    summary_threads = {name for kind, name in log if kind == "summarize"}
    assert summary_threads and not summary_threads & model_threads
    # the model got the summary as a user message right after the pinned one (the system
    # block is never changed by demote)
    sent = model.calls[-1]
    check_sent(sent, policy.limit + 2 * 6)
    assert sent[1].text == PINNED
    assert isinstance(sent[2], HumanMessage) and sent[2].text.startswith(SUMMARY_PREFIX)
    assert [i for i, m in enumerate(sent) if isinstance(m, SystemMessage)] == [0, 1]
    # non-destructive: the checkpoint keeps everything, the summary is not in it
    history = agent.get_state(config("t1")).values["messages"]
    assert history[0].text == PINNED and history[1].text == turn_text("t1", 0)
    assert sum(isinstance(m, HumanMessage) for m in history) == TURNS + 1
    assert sum(isinstance(m, AIMessage) for m in history) > 2 * TURNS
    assert not any(m.text.startswith(SUMMARY_PREFIX) for m in history)
    # every message that left the window reached the hook once
    check_archive(recorder, demoter, "t1", history)
