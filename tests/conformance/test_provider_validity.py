"""Every window and every model request is one the providers accept, checked offline.

Random agent runs (:mod:`tests.agent_strategies`: parallel calls, failed tools, human-in-
the-loop interrupts resumed with approve or reject, streamed ``AIMessageChunk`` replies)
under every strategy and unit, with and without clearing, go through:

- ``DemotingChatMessageHistory`` over an ``InMemoryChatMessageHistory``, as a custom
  LangGraph loop uses it: the window is read at every model call (and at interrupts);
- ``DemotingMiddleware`` in a real ``create_agent`` run with a scripted tool-calling
  model that records every request it is sent (system prompt included).

Each window and request must pass :func:`langchain_demote.provider_rules.violations`: the
documented ordering rules, langchain-anthropic's ``_format_messages`` and langchain-
openai's ``_convert_message_to_dict`` with the pairing rules on what they build.

A call the user left unanswered (an interrupt never resumed, the next request sent
instead) has its own tests. The bound tests (the window's size at most limit + overflow,
apart from what cannot be cut and is reported as ``Window.overhang``) are separate too:
they need the window to cut inside a turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from bench.agent_run import run_agent
from bench.agent_traces import long_request, oversized, parallel
from demote import Bulk, Compact, Demoter, LowWater, PerItem, SlidingWindow
from demote.engine import PROGRESS_PREFIX, SUMMARY_PREFIX
from demote.summarize import TemplateSummarizer
from demote.window.planner import turn_groups
from demote.window.policy import ClearToolResults
from langchain_demote import DemotingChatMessageHistory, DemotingMiddleware
from langchain_demote.messages import to_core
from langchain_demote.provider_rules import (
    anthropic_violations,
    openai_violations,
    ordering_violations,
    violations,
)
from tests.agent_strategies import AgentScript, agent_policies, agent_scripts, events
from tests.strategies import examples

HISTORY = settings(
    max_examples=examples(60, cost=20),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
AGENT = settings(
    max_examples=examples(20, cost=50),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SYSTEM = "You are a test agent."
DRAIN = 10.0  # seconds a summary may take before the next model call (bounded wait)


def demoter_for(policy: SlidingWindow) -> Demoter:
    summarizer = TemplateSummarizer() if isinstance(policy.eviction, Compact) else None
    return Demoter(policy, summarizer=summarizer)


def history_windows(
    script: AgentScript, policy: SlidingWindow
) -> list[tuple[list[BaseMessage], Any]]:
    """Run the script through the history adapter; the window (and Window) at each model call."""
    demoter = demoter_for(policy)
    inner = InMemoryChatMessageHistory()
    inner.add_message(SystemMessage(SYSTEM))
    history = DemotingChatMessageHistory(inner=inner, demoter=demoter, conversation_id="c")
    out = []
    for kind, message in events(script):
        if kind == "add":
            assert message is not None
            history.add_message(message)
        elif kind == "read":
            history.messages  # noqa: B018  (an interrupt shows the pending call)
        else:
            sent = history.messages
            window = demoter.load("c", inner.messages, lambda m: to_core(m, demoter.describe))
            out.append((sent, window))
            assert demoter.drain(DRAIN)
    demoter.close()
    return out


def agent_requests(
    script: AgentScript, policy: SlidingWindow
) -> tuple[list[list[BaseMessage]], Demoter]:
    demoter = demoter_for(policy)
    checkpointer = InMemorySaver() if script.hitl else None
    run = run_agent(
        script.trace,
        [DemotingMiddleware(demoter)],
        hitl=script.hitl,
        checkpointer=checkpointer,
        before_reply=lambda: None if demoter.drain(DRAIN) else pytest.fail("summary stuck"),
    )
    demoter.close()
    resumed = sum(d != "abandon" for d in script.hitl.values())
    assert run.interrupts >= resumed, "every human-in-the-loop call interrupted the run"
    return run.requests, demoter


def assert_valid(requests: Sequence[Sequence[BaseMessage]]) -> None:
    for n, request in enumerate(requests):
        found = violations(request)
        assert not found, f"model call {n}: {found}\n{[m.type for m in request]}"


# -- the checker itself catches each rule ----------------------------------------------------


def test_the_checker_flags_each_documented_rule() -> None:
    call = AIMessage("", tool_calls=[{"name": "t", "args": {}, "id": "a", "type": "tool_call"}])
    result = ToolMessage("r", tool_call_id="a")
    human, system = HumanMessage("hi"), SystemMessage("sys")
    ok = [system, human, call, result, AIMessage("done")]
    assert violations(ok) == []
    cases = {
        "result without its call": [system, human, result],
        "call without its result": [system, human, call, human],
        "call at the end": [system, human, call],
        "first is not a user message": [system, AIMessage("hello"), human],
        "system after a non-system message": [system, human, SystemMessage("late"), AIMessage("x")],
        "a result answers twice": [system, human, call, result, result],
    }
    for label, messages in cases.items():
        assert ordering_violations(messages), label
    # the providers' own converters, and the pairing rules on what they build
    for label in ("result without its call", "call without its result", "call at the end"):
        assert anthropic_violations(cases[label]), label
        assert openai_violations(cases[label]), label
    assert anthropic_violations(cases["system after a non-system message"])
    assert anthropic_violations(cases["first is not a user message"])


# -- validity: whole turns today, so these hold -------------------------------------------------


@HISTORY
@given(script=agent_scripts(), policy=agent_policies())
def test_history_window_is_valid_at_every_model_call(
    script: AgentScript, policy: SlidingWindow
) -> None:
    windows = history_windows(script, policy)
    assert len(windows) == script.trace.calls
    assert_valid([sent for sent, _ in windows])


@AGENT
@given(script=agent_scripts(max_requests=3, max_steps=6), policy=agent_policies())
def test_every_middleware_request_is_valid(script: AgentScript, policy: SlidingWindow) -> None:
    requests, _ = agent_requests(script, policy)
    assert len(requests) == script.trace.calls, "the model was called once per scripted reply"
    for request in requests:
        assert isinstance(request[0], SystemMessage) and request[0].text == SYSTEM
    assert_valid(requests)


@pytest.mark.parametrize(
    "policy",
    [
        SlidingWindow.last_tokens(4000),
        SlidingWindow.last_tokens(4000, eviction=Bulk(overflow=1000)),
        SlidingWindow.last_tokens(4000, eviction=Compact(compact_count=1000)),
        SlidingWindow(
            unit="tokens", limit=4000, clearing=ClearToolResults(trigger=2000, clear_at_least=500)
        ),
        SlidingWindow.last_messages(12),
        SlidingWindow.last_turns(1),
    ],
    ids=["per-item", "bulk", "compact", "clearing", "messages", "turns"],
)
@pytest.mark.parametrize(
    "trace", [parallel(12), oversized(9, every=3)], ids=["parallel", "oversized"]
)
def test_benchmark_traces_give_valid_requests(policy: SlidingWindow, trace: Any) -> None:
    demoter = demoter_for(policy)
    run = run_agent(trace, [DemotingMiddleware(demoter)], before_reply=lambda: demoter.drain(DRAIN))
    demoter.close()
    assert len(run.requests) == trace.calls
    assert_valid(run.requests)


# -- a call left unanswered by an interrupt ------------------------------------------------------


@HISTORY
@given(script=agent_scripts(abandon=True, max_requests=3), policy=agent_policies())
def test_history_window_is_valid_after_an_unanswered_call(
    script: AgentScript, policy: SlidingWindow
) -> None:
    assert "abandon" in script.hitl.values()
    assert_valid([sent for sent, _ in history_windows(script, policy)])


@AGENT
@given(script=agent_scripts(abandon=True, max_requests=3, max_steps=4), policy=agent_policies())
def test_middleware_request_is_valid_after_an_unanswered_call(
    script: AgentScript, policy: SlidingWindow
) -> None:
    requests, _ = agent_requests(script, policy)
    assert_valid(requests)


# -- the bound: needs windows that cut inside a turn ---------------------------------------------


def _slack(policy: SlidingWindow) -> int:
    ev = policy.eviction
    if isinstance(ev, Bulk):
        return ev.overflow
    if isinstance(ev, Compact):
        return 2 * ev.compact_count
    assert isinstance(ev, PerItem | LowWater)
    return 0


def _size(policy: SlidingWindow, demoter: Demoter, sent: Sequence[BaseMessage], skip: int) -> int:
    """The window's size in the policy's unit: summary and the first ``skip`` left out.

    In the token unit the pinned system messages count (they are sent); in the others
    they do not.
    """
    body = [
        m
        for m in sent[skip:]
        if not (
            isinstance(m, HumanMessage) and m.text.startswith((SUMMARY_PREFIX, PROGRESS_PREFIX))
        )
    ]
    records = [to_core(m, demoter.describe) for m in body]
    if policy.unit == "tokens":
        return sum(r.tokens for r in records)
    records = [r for r in records if r.role != "system"]
    if policy.unit == "messages":
        return len(records)
    return len(turn_groups(records)) if records else 0


def _uncuttable(policy: SlidingWindow, demoter: Demoter, history: Sequence[BaseMessage]) -> int:
    """An upper bound on what cannot be cut: the running turn's opener and its newest step."""
    opener = max((i for i, m in enumerate(history) if isinstance(m, HumanMessage)), default=0)
    last_call = max(
        (
            i
            for i, m in enumerate(history)
            if isinstance(m, AIMessage) and m.tool_calls and i > opener
        ),
        default=None,
    )
    part = [history[opener]] + (list(history[last_call:]) if last_call is not None else [])
    return _size(policy, demoter, part, 0)


@HISTORY
@given(script=agent_scripts(max_steps=12), policy=agent_policies())
def test_history_window_stays_within_the_bound(script: AgentScript, policy: SlidingWindow) -> None:
    demoter = demoter_for(policy)
    for sent, window in history_windows(script, policy):
        overhang = window.overhang
        size = _size(policy, demoter, sent, 0 if policy.unit == "tokens" else 1)
        assert overhang >= 0
        assert size <= policy.limit + _slack(policy) + overhang, (size, overhang, len(sent))


@AGENT
@given(script=agent_scripts(max_requests=2, max_steps=10, hitl=False), policy=agent_policies())
def test_middleware_request_stays_within_the_bound(
    script: AgentScript, policy: SlidingWindow
) -> None:
    requests, demoter = agent_requests(script, policy)
    history: list[BaseMessage] = []
    calls = iter(_histories(script))
    for request in requests:
        history = next(calls)
        cannot = max(0, _uncuttable(policy, demoter, history) - policy.limit)
        size = _size(policy, demoter, request, 1)  # the agent's system prompt apart
        assert size <= policy.limit + _slack(policy) + cannot, (size, cannot, len(request))


@pytest.mark.parametrize("limit", [4000, 8000])
def test_a_long_request_is_cut_at_every_model_call(limit: int) -> None:
    trace = long_request(40, high=2_000)
    policy = SlidingWindow.last_tokens(limit)
    requests, demoter = agent_requests(AgentScript(trace), policy)
    for n, request in enumerate(requests):
        size = _size(policy, demoter, request, 1)
        assert size <= limit + 2_000 + 100, f"model call {n}: {size} tokens"


def _histories(script: AgentScript) -> list[list[BaseMessage]]:
    out: list[list[BaseMessage]] = []
    history: list[BaseMessage] = []
    for kind, message in events(script):
        if kind == "add":
            assert message is not None
            history.append(message)
        elif kind == "call":
            out.append(list(history))
    return out
