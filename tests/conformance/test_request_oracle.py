"""The request oracle: every feature on at once, every request checked as the provider builds it.

Random multi-turn agent threads (questions that come back to earlier topics, tool steps
with parallel calls and results of every size, the recall tool called now and then) run
through a real ``create_agent`` with a system prompt, two tools (a worker and
``recall_tool``), ``DemotingMiddleware`` with injected recall from the archive it demotes
to, clearing, ``prompt_cache_key``, and the default cache-true window (its digest) or a
``Compact`` window with a model-free summarizer; on Anthropic with
``AnthropicPromptCachingMiddleware`` after it. The chat model is the real ``ChatAnthropic``
or ``ChatOpenAI`` building its real payload offline (:mod:`tests.conformance._providers`).

Every request must: raise nothing and warn nothing in the provider's builder; pass the
ordering and pairing rules on the payload; stay within the limit by
``count_tokens_approximately`` (tools included) unless the window reported an overhang;
keep one system block for the whole thread; and between two cuts start with the previous
request (up to its recall, which the next question replaces). Chats (no tools, no steps)
are drawn too.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain.agents import create_agent
from langchain_anthropic.middleware import AnthropicPromptCachingMiddleware
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from demote import ClearToolResults, Compact, Demoter, SlidingWindow, SQLiteArchive
from demote.request import RECALL_PREFIX
from demote.summarize import TemplateSummarizer
from langchain_demote import DemotingMiddleware, recall_tool
from tests.conformance._providers import ScriptedAnthropic, ScriptedOpenAI, check_calls
from tests.strategies import examples

ORACLE = settings(
    max_examples=examples(12, cost=60),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SYSTEM = "You are a careful agent. Use the tools; keep answers short."
TOPICS = ("invoice", "flight", "locker", "deploy", "garden", "ticket")
_serial = itertools.count()


def _words(seed: int, tokens: int) -> str:
    """About ``tokens`` tokens of text holding identifiers an agent would copy."""
    parts = []
    for k in range(max(1, tokens // 3)):
        topic = TOPICS[(seed + k) % len(TOPICS)]
        parts.append(f"{topic} ZX-{seed % 97:02d}{k:03d} value")
    return " ".join(parts)


@tool
def work(q: str) -> str:
    """Do one unit of work on ``q`` (a topic, a seed and a size) and report."""
    topic, seed, size = q.split(":")
    return f"{topic} report: " + _words(int(seed), int(size))


@dataclass(frozen=True)
class Turn:
    topic: str
    steps: tuple[tuple[int, ...], ...]  # per step, the sizes of its parallel results
    recall_step: bool  # one more step that calls the recall tool


@st.composite
def turns(draw: st.DrawFn, *, chat: bool) -> Turn:
    topic = draw(st.sampled_from(TOPICS))
    if chat:
        return Turn(topic, (), False)
    sizes = st.sampled_from((20, 80, 300, 900))
    steps = draw(st.lists(st.lists(sizes, min_size=1, max_size=3), max_size=4))
    return Turn(topic, tuple(tuple(s) for s in steps), draw(st.booleans()))


@st.composite
def threads(draw: st.DrawFn) -> tuple[list[Turn], str, int, str]:
    chat = draw(st.booleans())
    provider = draw(st.sampled_from(("anthropic", "openai")))
    limit = draw(st.sampled_from((1500, 3000)))
    window = draw(st.sampled_from(("default", "compact")))
    return draw(st.lists(turns(chat=chat), min_size=2, max_size=8)), provider, limit, window


def _script(turn: Turn, n: int) -> list[AIMessage]:
    replies = []
    for s, sizes in enumerate(turn.steps):
        calls = [
            {
                "name": "work",
                "args": {"q": f"{turn.topic}:{n * 7 + s * 3 + j}:{size}"},
                "id": f"toolu_{next(_serial):06d}",
                "type": "tool_call",
            }
            for j, size in enumerate(sizes)
        ]
        replies.append(AIMessage("", tool_calls=calls))
    if turn.recall_step:
        call = {
            "name": "recall",
            "args": {"query": f"{turn.topic} value"},
            "id": f"toolu_{next(_serial):06d}",
            "type": "tool_call",
        }
        replies.append(AIMessage("", tool_calls=[call]))
    replies.append(AIMessage(f"Done with the {turn.topic} (turn {n})."))
    return replies


def _policy(limit: int, window: str) -> tuple[SlidingWindow, Any]:
    clearing = ClearToolResults(trigger=limit // 2, keep=2, clear_at_least=limit // 8)
    if window == "compact":
        eviction = Compact(compact_count=limit // 4)
        summarizer = TemplateSummarizer(max_summary_tokens=limit // 10)
        policy = SlidingWindow(unit="tokens", limit=limit, eviction=eviction, clearing=clearing)
        return policy, summarizer
    return SlidingWindow(unit="tokens", limit=limit, clearing=clearing), None


def run_thread(
    tmp_path: Path, plan: list[Turn], provider: str, limit: int, window: str
) -> tuple[list[Any], list[Any], int]:
    archive = SQLiteArchive(tmp_path / f"archive-{next(_serial)}.db")
    policy, summarizer = _policy(limit, window)
    demoter = Demoter(policy, archive, summarizer=summarizer)
    model: Any = ScriptedAnthropic() if provider == "anthropic" else ScriptedOpenAI()
    # A recall budget of a fifth of the limit, so recall has room to place hits (the
    # default share is small: it is priced for cached chats).
    middleware: list[Any] = [
        DemotingMiddleware(
            demoter, recall=archive, recall_budget_tokens=limit // 5, prompt_cache_key=True
        )
    ]
    if provider == "anthropic":
        middleware.append(AnthropicPromptCachingMiddleware(ttl="5m"))
    tools = [work, recall_tool(archive)]
    agent = create_agent(
        model, tools, system_prompt=SYSTEM, checkpointer=InMemorySaver(), middleware=middleware
    )
    config = {"configurable": {"thread_id": "oracle"}, "recursion_limit": 100}
    for n, turn in enumerate(plan):
        model.script(_script(turn, n))
        question = f"Turn {n}: what about the {turn.topic}? Last time it was ZX-{n:02d}."
        agent.invoke({"messages": [HumanMessage(question)]}, config)
        assert demoter.drain(10)  # a summary is ready before the next turn (repeatable)
    archive.close()
    return model.calls, tools, demoter.state_of("oracle").window_start


@pytest.mark.slow
@ORACLE
@given(threads())
def test_every_request_with_every_feature_on(
    tmp_path_factory: pytest.TempPathFactory, drawn: tuple[list[Turn], str, int, str]
) -> None:
    plan, provider, limit, window = drawn
    calls, tools, _ = run_thread(tmp_path_factory.mktemp("oracle"), plan, provider, limit, window)
    # The policy's bound: the limit, or for Compact the limit + 2 x compact_count (the
    # window may run over the limit while a summary is being made).
    bound = limit + 2 * (limit // 4) if window == "compact" else limit
    broken = list(check_calls(calls, provider, bound, tools))
    assert not broken, "\n".join(broken[:10])


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_a_long_thread_with_recall_cuts_and_stays_valid(tmp_path: Path, provider: str) -> None:
    # Deterministic: enough turns that the window is cut several times and recall hits.
    plan = [
        Turn(TOPICS[n % len(TOPICS)], ((300, 80), (900,)) if n % 3 else ((20,),), n % 4 == 1)
        for n in range(16)
    ]
    calls, tools, start = run_thread(tmp_path, plan, provider, 1500, "default")
    assert start > 0, "the window was cut"
    assert any(any(str(m.content).startswith(RECALL_PREFIX) for m in c.messages) for c in calls), (
        "recall placed something"
    )
    broken = list(check_calls(calls, provider, 1500, tools))
    assert not broken, "\n".join(broken[:10])
