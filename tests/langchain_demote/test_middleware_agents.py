"""DemotingMiddleware on one long agent run: the window is cut at every model call.

A real ``create_agent`` graph with a scripted tool-calling model makes 30 tool calls in
one ``invoke``, each answered by a ~1,450-token result, under ``last_tokens(3000)``. At
every model call the request (system prompt, tool definitions and messages, counted with
LangChain's ``count_tokens_approximately``) stays within the limit apart from the overhang
the window reports; it starts with a user message after the system message; every tool
call has its results and every result its call; what left the model's view reaches the
hook (a SQLite archive) exactly once; and the agent state keeps every message whole.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver

from demote import Demoter, SlidingWindow
from demote.window.policy import ClearToolResults
from langchain_demote.history import DemotingChatMessageHistory
from langchain_demote.messages import to_core
from langchain_demote.middleware import DemotingMiddleware
from tests.langchain_demote.support import ScriptedToolModel, record_windows
from tests.support.counting import CountingArchive

STEPS = 30
LIMIT = 3000
SYSTEM = "You are a careful research agent. Fetch every page before you answer."
RESULT_CHARS = 5_800  # about 1,450 tokens under the approximate count


def page(n: int) -> str:
    words = " ".join(f"w{n}x{k}" for k in range(RESULT_CHARS // 8))
    return f"page {n}: {words}"[:RESULT_CHARS]


@tool
def fetch(n: int) -> str:
    """Fetch page ``n`` of the report."""
    return page(n)


TOOLS = [fetch]


class ToolLoopModel(ScriptedToolModel):
    """Calls ``fetch`` for pages 0..steps-1, one per model call, then answers.

    It decides from what it is sent: the newest tool result names its page (its content
    may be a placeholder, which names the tool call's page in the call's arguments).
    Every list of messages it receives is recorded in ``calls``.
    """

    steps: int = STEPS

    def reply(self, messages: list[BaseMessage], last_user: int) -> AIMessage:
        done = [m for m in messages[last_user + 1 :] if isinstance(m, AIMessage) and m.tool_calls]
        step = int(done[-1].tool_calls[0]["args"]["n"]) + 1 if done else 0
        if step >= self.steps:
            reply = AIMessage(f"read {self.steps} pages")
        else:
            # An id of its own for every call (providers require it), whatever the turn.
            cid = f"call-{len(self.calls)}-{step}"
            call = {"name": "fetch", "args": {"n": step}, "id": cid, "type": "tool_call"}
            reply = AIMessage("", tool_calls=[call])
        return reply


def check_request(messages: list[BaseMessage]) -> None:
    """The provider rules: user first after system messages, every call paired."""
    body = [m for m in messages if not isinstance(m, SystemMessage)]
    assert body and isinstance(body[0], HumanMessage), "the first message is not a user message"
    assert all(isinstance(m, SystemMessage) for m in messages[: len(messages) - len(body)])
    opened: dict[str, int] = {}
    for i, m in enumerate(body):
        if isinstance(m, AIMessage):
            for call in m.tool_calls:
                opened[call["id"]] = i
        if isinstance(m, ToolMessage):
            assert m.tool_call_id in opened, f"result {m.tool_call_id} without its call"
    answered = {m.tool_call_id for m in body if isinstance(m, ToolMessage)}
    assert set(opened) <= answered, "a call without its result"


def run_agent(
    tmp_path: Path,
    policy: SlidingWindow,
    flavour: str = "sync",
) -> tuple[ToolLoopModel, CountingArchive, Demoter, dict[str, Any], list[dict[str, Any]]]:
    model = ToolLoopModel()
    hook = CountingArchive(tmp_path / "archive.db")
    demoter = Demoter(policy, hook)
    middleware = DemotingMiddleware(demoter)
    windows = record_windows(middleware)
    agent = create_agent(
        model, TOOLS, system_prompt=SYSTEM, checkpointer=InMemorySaver(), middleware=[middleware]
    )
    config: Any = {"configurable": {"thread_id": "job-1"}, "recursion_limit": 200}
    state = {"messages": [HumanMessage("Read the whole report, page by page.")]}
    if flavour == "sync":
        result = agent.invoke(state, config)
    else:
        result = asyncio.run(agent.ainvoke(state, config))
    return model, hook, demoter, result, windows


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_one_long_tool_loop_is_bounded_at_every_model_call(flavour: str, tmp_path: Path) -> None:
    policy = SlidingWindow.last_tokens(LIMIT)
    model, hook, demoter, result, windows = run_agent(tmp_path, policy, flavour)
    assert len(model.calls) == STEPS + 1, "one model call per tool call, then the answer"
    assert result["messages"][-1].content == f"read {STEPS} pages"
    peak = 0
    for sent, meta in zip(model.calls, windows, strict=True):
        tokens = count_tokens_approximately(sent, tools=TOOLS)
        peak = max(peak, tokens)
        assert tokens <= LIMIT + meta["overhang"], f"{tokens} tokens sent at a limit of {LIMIT}"
        check_request(sent)
        assert isinstance(sent[0], SystemMessage) and sent[0].content == SYSTEM
        assert meta["reserved"] > 0, "the system prompt and tools count toward the limit"
    assert peak < LIMIT
    assert len(model.calls[-1]) < 10, "the last call is not sent the whole run"

    # What left the window reached the archive exactly once; the state keeps it all.
    thread = result["messages"]
    state = demoter.state_of("job-1")
    assert state.window_start > 1
    assert hook.deliveries and max(hook.deliveries.values()) == 1
    assert sorted(hook.indexes) == list(range(state.delivered))
    assert hook.archive.count("job-1") == state.delivered
    assert len(thread) == 2 + 2 * STEPS
    results = [m for m in thread if isinstance(m, ToolMessage)]
    assert [m.content for m in results] == [page(n) for n in range(STEPS)], "state untouched"


def test_clearing_sends_placeholders_and_archives_the_content_first(tmp_path: Path) -> None:
    policy = SlidingWindow(
        unit="tokens", limit=LIMIT, clearing=ClearToolResults(trigger=2000, keep=1)
    )
    model, hook, demoter, result, _ = run_agent(tmp_path, policy)
    assert len(model.calls) == STEPS + 1
    placeholder_seen = 0
    for sent in model.calls:
        check_request(sent)
        for m in sent:
            if isinstance(m, ToolMessage) and "cleared" in str(m.content):
                placeholder_seen += 1
                key = re.search(r"archived as key ([0-9a-f]{32})", str(m.content))
                assert key is not None, m.content
                assert hook.deliveries[key.group(1)] == 1, "sent a placeholder before archiving"
                assert m.name == "fetch" and m.tool_call_id.startswith("call-")
    assert placeholder_seen > 0, "clearing never cleared"
    assert max(hook.deliveries.values()) == 1
    state = demoter.state_of("job-1")
    assert hook.archive.count("job-1") == state.delivered
    results = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert [m.content for m in results] == [page(n) for n in range(STEPS)], "state untouched"


def test_clearing_keeps_every_model_call_within_the_limit(tmp_path: Path) -> None:
    policy = SlidingWindow(
        unit="tokens", limit=LIMIT, clearing=ClearToolResults(trigger=2000, keep=1)
    )
    model, _, _, _, windows = run_agent(tmp_path, policy)
    for sent, meta in zip(model.calls, windows, strict=True):
        tokens = count_tokens_approximately(sent, tools=TOOLS)
        assert tokens <= LIMIT + meta["overhang"], f"{tokens} tokens sent at a limit of {LIMIT}"


# -- a custom loop over DemotingChatMessageHistory ------------------------------------------


@pytest.mark.parametrize("clearing", [False, True])
def test_a_custom_loop_reading_the_history_at_every_step_is_bounded(
    clearing: bool, tmp_path: Path
) -> None:
    limit, steps = 4000, 40
    policy = SlidingWindow(
        unit="tokens",
        limit=limit,
        clearing=ClearToolResults(trigger=3000, keep=1) if clearing else None,
    )
    hook = CountingArchive(tmp_path / "archive.db")
    demoter = Demoter(policy, hook)
    inner = InMemoryChatMessageHistory()
    history = DemotingChatMessageHistory(inner, demoter, "loop-1")
    model = ToolLoopModel(steps=steps)
    history.add_message(HumanMessage("Read the whole report, page by page."))
    for _ in range(steps + 1):  # bounded: one model call per step, then the answer
        sent = history.messages
        check_request(sent)
        # The bound under the engine's own count, and under LangChain's within the
        # default counter's tolerance (15% of count_tokens_approximately).
        assert sum(to_core(m, demoter.describe).tokens for m in sent) <= limit
        assert count_tokens_approximately(sent) <= limit * 1.15
        reply = model.invoke(sent)
        history.add_message(reply)
        if not reply.tool_calls:
            break
        call = reply.tool_calls[0]
        history.add_message(ToolMessage(fetch.invoke(call["args"]), tool_call_id=call["id"]))
    assert len(model.calls) == steps + 1 and "read 40 pages" in str(reply.content)
    assert len(inner.messages) == 2 + 2 * steps
    stored = [m.content for m in inner.messages if isinstance(m, ToolMessage)]
    assert stored == [page(n) for n in range(steps)], "the inner store keeps every result whole"
    assert max(hook.deliveries.values()) == 1
    state = demoter.state_of("loop-1")
    assert sorted(hook.indexes) == list(range(state.delivered))
    assert hook.archive.count("loop-1") == state.delivered > 1
    assert clearing or state.window_start > 1
    if clearing:
        last = model.calls[-1]
        assert any(isinstance(m, ToolMessage) and "cleared" in str(m.content) for m in last)


# -- rendering a window (fed directly) ------------------------------------------------------


def test_render_window_sends_copies_with_placeholders_and_the_progress_note() -> None:
    from demote.engine import PROGRESS_PREFIX, SUMMARY_PREFIX, Window
    from langchain_demote.history import render_window

    pinned = [SystemMessage("rules")]
    opener = HumanMessage("do the job", id="u1")
    call = AIMessage("", tool_calls=[{"name": "fetch", "args": {"n": 1}, "id": "c1"}], id="a1")
    result = ToolMessage(
        "long content",
        tool_call_id="c1",
        name="fetch",
        artifact={"raw": 1},
        status="error",
        id="t1",
    )
    kept = [call, result, AIMessage("done", id="a2")]
    window = Window(
        "c", pinned, "read page 0", kept, start=5, total=8,
        opener=opener, placeholders={6: "[fetch result cleared]"}, opener_index=0,
    )  # fmt: skip
    out = render_window(window)
    assert out[0] is pinned[0]
    # The opener as stored (byte-identical when the summary changes), then the note.
    assert out[1] is opener
    note = out[2]
    assert isinstance(note, HumanMessage) and note.content == PROGRESS_PREFIX + "read page 0"
    assert opener.content == "do the job", "the stored opener is not changed"
    assert out[3] is call and out[5] is kept[2]
    sent = out[4]
    assert isinstance(sent, ToolMessage) and sent.content == "[fetch result cleared]"
    assert (sent.tool_call_id, sent.name, sent.artifact, sent.status, sent.id) == (
        "c1", "fetch", {"raw": 1}, "error", "t1",
    )  # fmt: skip
    assert result.content == "long content", "the stored result is not changed"
    assert not any(SUMMARY_PREFIX in str(m.content) for m in out), "no mid-conversation system"
    # Without an opener: the summary is one user message after the pinned ones (never a
    # system message: the system block stays as it is).
    plain = render_window(Window("c", pinned, "gist", [opener], start=3, total=4))
    assert isinstance(plain[1], HumanMessage) and plain[1].content == SUMMARY_PREFIX + "gist"
    assert plain[2] is opener


def test_the_middleware_counts_the_system_prompt_and_tools_as_reserved(tmp_path: Path) -> None:
    from langchain.agents.middleware.types import ModelRequest

    demoter = Demoter(SlidingWindow.last_tokens(LIMIT))
    middleware = DemotingMiddleware(demoter)
    request = ModelRequest(
        model=ToolLoopModel(), messages=[HumanMessage("hi")], system_prompt=SYSTEM, tools=TOOLS
    )
    reserved = middleware._reserved(request)
    system = to_core(SystemMessage(SYSTEM), demoter.describe).tokens
    assert reserved > system
    assert reserved - system >= count_tokens_approximately([], tools=TOOLS) - 5
    # At least LangChain's count of the definitions the provider is sent (wrapped), too.
    sent = [convert_to_openai_tool(t) for t in TOOLS]
    assert count_tokens_approximately([], tools=sent) > count_tokens_approximately([], tools=TOOLS)
    assert reserved - system >= count_tokens_approximately([], tools=sent)
    assert middleware._reserved(request) == reserved, "the same on every call"
    by_messages = DemotingMiddleware(Demoter(SlidingWindow.last_messages(10)))
    assert by_messages._reserved(request) == 0, "only a token window counts tokens"
