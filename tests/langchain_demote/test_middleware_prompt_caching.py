"""DemotingMiddleware with the prompt caching users turn on, checked on the providers' payloads.

Anthropic: ``AnthropicPromptCachingMiddleware`` (langchain-anthropic) tags the system prompt
and the last tool and puts ``cache_control`` in the model settings, which ``ChatAnthropic``
sends as the request's top-level ``cache_control`` (the breakpoint at the end of the
request). OpenAI: ``DemotingMiddleware(prompt_cache_key=True)`` puts the conversation id in
the model settings, which ``ChatOpenAI`` sends as ``prompt_cache_key``.

The models are the real ``ChatAnthropic`` and ``ChatOpenAI`` (fake API keys) with one thing
replaced, because it cannot run here: ``_generate`` builds the request with the model's own
``_get_request_payload`` (what would go over the wire), records it, and replies by script
instead of calling the API. A 30-step ``create_agent`` run makes 31 model calls; under a
2,000-token window most of them are sent a cut window, and every one carries the cache
setting.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("langchain.agents", reason="langchain not installed (demote[agents])")
pytest.importorskip("langchain_anthropic", reason="langchain-anthropic not installed (dev extra)")
pytest.importorskip("langchain_openai", reason="langchain-openai not installed (dev extra)")

from langchain.agents import create_agent
from langchain_anthropic import ChatAnthropic
from langchain_anthropic.middleware import AnthropicPromptCachingMiddleware
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field

from demote import Demoter, SlidingWindow
from demote.errors import ConfigError
from langchain_demote.middleware import DemotingMiddleware
from langchain_demote.provider_rules import violations

STEPS = 30
LIMIT = 2000
SYSTEM = "You are a careful research agent. Read every page before you answer."
CACHE = {"type": "ephemeral", "ttl": "5m"}


@tool
def read(n: int) -> str:
    """Read page ``n`` of the report."""
    return f"page {n}: " + " ".join(f"w{n}x{k}" for k in range(150))  # about 300 tokens


def next_step(messages: list[BaseMessage]) -> AIMessage:
    """Read pages 0..STEPS-1, one a call (the newest call is always in the window), then answer."""
    calls = [m for m in messages if isinstance(m, AIMessage) and m.tool_calls]
    step = int(calls[-1].tool_calls[0]["args"]["n"]) + 1 if calls else 0
    if step >= STEPS:
        return AIMessage(f"read {STEPS} pages")
    call = {"name": "read", "args": {"n": step}, "id": f"toolu_{step:04d}", "type": "tool_call"}
    return AIMessage("", tool_calls=[call])


class _Recorded:
    """The request a model would send, recorded; a scripted reply instead of the API call."""

    payloads: list[dict[str, Any]]
    sent: list[list[BaseMessage]]

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.payloads.append(self._get_request_payload(messages, stop=stop, **kwargs))  # type: ignore[attr-defined]
        self.sent.append(list(messages))
        return ChatResult(generations=[ChatGeneration(message=next_step(messages))])


class RecordedAnthropic(_Recorded, ChatAnthropic):
    payloads: list[dict[str, Any]] = Field(default_factory=list)
    sent: list[list[BaseMessage]] = Field(default_factory=list)


class RecordedOpenAI(_Recorded, ChatOpenAI):
    payloads: list[dict[str, Any]] = Field(default_factory=list)
    sent: list[list[BaseMessage]] = Field(default_factory=list)


def anthropic() -> RecordedAnthropic:
    return RecordedAnthropic(model="claude-sonnet-4-5", api_key="sk-ant-offline", max_retries=0)


def openai() -> RecordedOpenAI:
    return RecordedOpenAI(model="gpt-4.1-mini", api_key="sk-offline", max_retries=0)


def demoting(**options: Any) -> DemotingMiddleware:
    return DemotingMiddleware(Demoter(SlidingWindow.last_tokens(LIMIT)), **options)


def run(model: Any, middleware: list[Any], thread: str = "thread-7") -> dict[str, Any]:
    agent = create_agent(
        model, [read], system_prompt=SYSTEM, middleware=middleware, checkpointer=InMemorySaver()
    )
    return agent.invoke(
        {"messages": [HumanMessage("Read the report, all 30 pages.")]},
        {"configurable": {"thread_id": thread}, "recursion_limit": 200},
    )


def _windowed(model: _Recorded) -> int:
    """How many calls were sent fewer messages than the thread held (call k: 1 + 2k)."""
    return sum(len(sent) < 1 + 2 * k for k, sent in enumerate(model.sent))


def test_cache_control_lands_on_every_windowed_anthropic_request_with_demote_first() -> None:
    model = anthropic()
    result = run(model, [demoting(), AnthropicPromptCachingMiddleware()])
    assert result["messages"][-1].content == f"read {STEPS} pages"
    assert len(result["messages"]) == 2 + 2 * STEPS  # the state keeps every message
    assert len(model.payloads) == STEPS + 1
    assert _windowed(model) >= 20
    for k, payload in enumerate(model.payloads):
        assert payload["cache_control"] == CACHE, k  # the breakpoint at the request's end
        assert payload["system"][-1]["cache_control"] == CACHE
        assert payload["system"][-1]["text"] == SYSTEM
        assert payload["tools"][-1]["cache_control"] == CACHE
        assert payload["messages"][0]["role"] == "user"
        assert violations([*model.sent[k]]) == [], k
    # The newest step is what the model was asked about: its call is in the request.
    last = model.payloads[-1]["messages"]
    assert any(
        b.get("type") == "tool_use" and b.get("id") == f"toolu_{STEPS - 1:04d}"
        for m in last
        if isinstance(m["content"], list)
        for b in m["content"]
    )


def test_the_other_order_sends_the_same_requests() -> None:
    first, second = anthropic(), anthropic()
    run(first, [demoting(), AnthropicPromptCachingMiddleware()])
    run(second, [AnthropicPromptCachingMiddleware(), demoting()])
    assert len(second.payloads) == STEPS + 1
    assert second.payloads == first.payloads


def test_min_messages_to_cache_counts_what_it_is_given() -> None:
    # Demote first: the caching middleware sees the window, so a threshold above the
    # window's length stops caching once the window is cut; in the other order it counts
    # the whole thread.
    threshold = 16
    inner, outer = anthropic(), anthropic()
    run(inner, [demoting(), AnthropicPromptCachingMiddleware(min_messages_to_cache=threshold)])
    run(outer, [AnthropicPromptCachingMiddleware(min_messages_to_cache=threshold), demoting()])
    for k in range(STEPS + 1):
        sent = len(inner.sent[k])  # system prompt included
        assert ("cache_control" in inner.payloads[k]) == (sent >= threshold), k
        assert ("cache_control" in outer.payloads[k]) == (2 + 2 * k >= threshold), k
    assert any("cache_control" not in p for p in inner.payloads[threshold:])


def test_prompt_cache_key_is_the_conversation_on_every_openai_request() -> None:
    model = openai()
    result = run(model, [demoting(prompt_cache_key=True)], thread="support-42")
    assert result["messages"][-1].content == f"read {STEPS} pages"
    assert len(model.payloads) == STEPS + 1
    assert _windowed(model) >= 20
    # Whole requests (the first calls) and cut windows alike.
    assert {p["prompt_cache_key"] for p in model.payloads} == {"support-42"}
    assert all(violations([*sent]) == [] for sent in model.sent)


def test_prompt_cache_key_callable_and_an_existing_key() -> None:
    model = openai()
    run(model, [demoting(prompt_cache_key=lambda cid: f"tenant-a:{cid}")], thread="t1")
    assert {p["prompt_cache_key"] for p in model.payloads} == {"tenant-a:t1"}

    # Off by default: no key.
    plain = openai()
    run(plain, [demoting()])
    assert all("prompt_cache_key" not in p for p in plain.payloads)


def test_prompt_cache_key_keeps_a_key_already_in_the_settings() -> None:
    from langchain.agents.middleware import wrap_model_call

    @wrap_model_call
    def own_key(request: Any, handler: Any) -> Any:
        return handler(request.override(model_settings={"prompt_cache_key": "mine"}))

    model = openai()
    run(model, [own_key, demoting(prompt_cache_key=True)])
    assert {p["prompt_cache_key"] for p in model.payloads} == {"mine"}


def test_prompt_cache_key_refuses_what_it_cannot_use() -> None:
    with pytest.raises(ConfigError, match="prompt_cache_key"):
        demoting(prompt_cache_key="yes")
    model = openai()
    with pytest.raises(ConfigError, match="non-empty str"):
        run(model, [demoting(prompt_cache_key=lambda cid: "")])
    assert model.payloads == []


def test_prompt_cache_key_is_not_sent_to_a_provider_that_refuses_it() -> None:
    # ChatAnthropic would put an unknown prompt_cache_key field in its request, which
    # Anthropic's API refuses: with every caching option on, the Anthropic request stays
    # valid (an agent may switch models under the same middleware).
    model = anthropic()
    run(model, [demoting(prompt_cache_key=True), AnthropicPromptCachingMiddleware(ttl="5m")])
    assert len(model.payloads) == STEPS + 1
    assert all("prompt_cache_key" not in p for p in model.payloads)
    assert all(p.get("cache_control") == CACHE for p in model.payloads)
