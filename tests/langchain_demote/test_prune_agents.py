"""``prune_state=True`` on the agent runs that broke it (issue 31): plain regressions.

LangChain's own ``test_agent_hooks_run_once_with_multiple_model_calls`` (agent hooks once
per ``invoke``, model hooks at every one of its model calls) and a run that interrupts
for a human and is resumed, each on a checkpointed thread whose window cuts inside the
tool turns, sync and async. Each must run as it does without ``prune_state``, send the
model the same requests, and prune the checkpoint. And a pruned thread whose state store
is down degrades (a bounded window, planned after the pruned prefix) instead of failing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import (
    HumanInTheLoopMiddleware,
    after_agent,
    after_model,
    before_agent,
    before_model,
)
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from pydantic import Field

from demote import Backoff, CallbackHook, Demoter, InMemoryStateStore, SlidingWindow
from langchain_demote import DemotingMiddleware

TURNS = 3


@tool
def sample_tool_agent(query: str) -> str:
    """A sample tool for testing."""
    return f"Result for: {query}"


@tool
def delete_file(path: str) -> str:
    """Delete a file (a human approves it first)."""
    return f"deleted {path}"


class RecordingModel(FakeMessagesListChatModel):
    """LangChain's list-of-responses fake, recording what it is sent; tools bind as is."""

    seen: list[list[BaseMessage]] = Field(default_factory=list)

    def bind_tools(self, tools: Any, **kwargs: Any) -> RecordingModel:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.seen.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


def _call(name: str, args: dict[str, Any], n: int) -> AIMessage:
    # Every call its own id (LangChain's FakeToolCallingModel reuses "1" and "2").
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": f"call-{n}"}])


def _sent(model: RecordingModel) -> list[list[tuple[str, Any, Any]]]:
    return [
        [(m.type, m.content, getattr(m, "tool_calls", None)) for m in request]
        for request in model.seen
    ]


def _run(flavour: str, agent: Any, payload: Any, config: Any) -> Any:
    if flavour == "sync":
        return agent.invoke(payload, config)
    return asyncio.run(agent.ainvoke(payload, config))


def hooks_run(flavour: str, prune: bool) -> tuple[list[str], RecordingModel, Any]:
    """LangChain's hooks scenario, three invokes on one thread under a 4-message window."""
    log: list[str] = []

    @before_agent
    def log_before_agent(*_args: Any, **_kwargs: Any) -> None:
        log.append("before_agent")

    @before_model
    def log_before_model(*_args: Any, **_kwargs: Any) -> None:
        log.append("before_model")

    @after_model
    def log_after_model(*_args: Any, **_kwargs: Any) -> None:
        log.append("after_model")

    @after_agent
    def log_after_agent(*_args: Any, **_kwargs: Any) -> None:
        log.append("after_agent")

    responses = []
    for t in range(TURNS):
        responses += [
            _call("sample_tool_agent", {"query": "first"}, 2 * t),
            _call("sample_tool_agent", {"query": "second"}, 2 * t + 1),
            AIMessage(f"answer {t}"),
        ]
    model = RecordingModel(responses=responses)
    demoting = DemotingMiddleware(Demoter(SlidingWindow.last_messages(4)), prune_state=prune)
    agent = create_agent(
        model=model,
        tools=[sample_tool_agent],
        checkpointer=InMemorySaver(),
        middleware=[demoting, log_before_agent, log_before_model, log_after_model, log_after_agent],
    )
    config = {"configurable": {"thread_id": "abc"}}
    for t in range(TURNS):
        _run(flavour, agent, {"messages": [HumanMessage(f"Test {t}")]}, config)
    return log, model, agent.get_state(config).values


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_agent_hooks_run_once_with_multiple_model_calls_when_pruning(flavour: str) -> None:
    log, model, values = hooks_run(flavour, prune=True)
    once = ["before_agent", *["before_model", "after_model"] * 3, "after_agent"]
    assert log == once * TURNS
    kept_log, kept_model, kept_values = hooks_run(flavour, prune=False)
    assert log == kept_log
    assert _sent(model) == _sent(kept_model), "pruning changed what the model was sent"
    assert values["demote_pruned"]["removed"] > 0, "the checkpoint was pruned"
    removed = values["demote_pruned"]["removed"]
    assert [m.content for m in values["messages"]] == [
        m.content for m in kept_values["messages"][removed:]
    ]


def hitl_run(flavour: str, prune: bool) -> tuple[RecordingModel, Any]:
    """Per turn: a call a human approves (interrupt, resume), a plain one, the answer."""
    responses = []
    for t in range(TURNS):
        responses += [
            _call("delete_file", {"path": f"/tmp/f{t}"}, 2 * t),
            _call("sample_tool_agent", {"query": f"q{t}"}, 2 * t + 1),
            AIMessage(f"answer {t}"),
        ]
    model = RecordingModel(responses=responses)
    demoting = DemotingMiddleware(Demoter(SlidingWindow.last_messages(3)), prune_state=prune)
    agent = create_agent(
        model=model,
        tools=[sample_tool_agent, delete_file],
        checkpointer=InMemorySaver(),
        middleware=[demoting, HumanInTheLoopMiddleware(interrupt_on={"delete_file": True})],
    )
    config = {"configurable": {"thread_id": "hitl"}}
    for t in range(TURNS):
        out = _run(flavour, agent, {"messages": [HumanMessage(f"clean up {t}")]}, config)
        assert out.get("__interrupt__"), "the delete waits for a human"
        resume = Command(resume={"decisions": [{"type": "approve"}]})
        out = _run(flavour, agent, resume, config)
        assert not out.get("__interrupt__")
        assert out["messages"][-1].content == f"answer {t}"
    return model, agent.get_state(config).values


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_interrupt_and_resume_when_pruning(flavour: str) -> None:
    model, values = hitl_run(flavour, prune=True)
    kept_model, _ = hitl_run(flavour, prune=False)
    assert len(model.seen) == 3 * TURNS
    assert _sent(model) == _sent(kept_model), "pruning changed what the model was sent"
    assert values["demote_pruned"]["removed"] > 0, "the checkpoint was pruned"


class FlakyStore(InMemoryStateStore):
    """An in-memory state store that can be taken down (every call raises)."""

    down = False

    def get(self, conversation_id: str) -> Any:
        if self.down:
            raise ConnectionError("state store down")
        return super().get(conversation_id)

    def compare_and_set(self, *args: Any, **kwargs: Any) -> Any:
        if self.down:
            raise ConnectionError("state store down")
        return super().compare_and_set(*args, **kwargs)


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_pruned_thread_degrades_when_the_state_store_is_down(flavour: str) -> None:
    """The chat goes on, bounded, as it does without prune_state; nothing more is pruned."""
    store = FlakyStore()
    delivered: list[str] = []
    hook = CallbackHook(lambda batch: delivered.extend(m.key for m in batch.messages))
    demoter = Demoter(SlidingWindow.last_messages(4), hook, state=store, retry=Backoff(0, 0))
    responses = []
    for t in range(TURNS + 1):
        responses += [
            _call("sample_tool_agent", {"query": "first"}, 2 * t),
            _call("sample_tool_agent", {"query": "second"}, 2 * t + 1),
            AIMessage(f"answer {t}"),
        ]
    model = RecordingModel(responses=responses)
    agent = create_agent(
        model=model,
        tools=[sample_tool_agent],
        checkpointer=InMemorySaver(),
        middleware=[DemotingMiddleware(demoter, prune_state=True)],
    )
    config = {"configurable": {"thread_id": "down"}}
    for t in range(TURNS):
        _run(flavour, agent, {"messages": [HumanMessage(f"Test {t}")]}, config)
    before = agent.get_state(config).values["demote_pruned"]
    assert before["removed"] > 0
    store.down = True
    out = _run(flavour, agent, {"messages": [HumanMessage("while down")]}, config)
    assert out["messages"][-1].content == f"answer {TURNS}"
    for request in model.seen[-3:]:
        assert 1 <= len(request) <= 4 + 1, "bounded: the window (and an opener)"
        assert isinstance(request[0], HumanMessage)
    assert agent.get_state(config).values["demote_pruned"] == before, "nothing committed"
