"""One agent request of 60 tool calls of every kind, through both LangChain adapters.

A real ``create_agent`` graph with a scripted model makes 60 tool calls in one ``invoke``:
single calls with ~1,500-character arguments, bursts of three parallel calls, and a
screenshot tool whose result is an image block. At every model call the request
``DemotingMiddleware`` lets through stays within the limit (``count_tokens_approximately``
over messages and tools) apart from the overhang it reports, and passes the providers' own
message converters (langchain-anthropic's and langchain-openai's, offline). The same thread
read back through ``DemotingChatMessageHistory`` at every step is bounded and valid too,
and every message that left the window reached the archive exactly once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from demote import Demoter, SlidingWindow
from langchain_demote.history import DemotingChatMessageHistory
from langchain_demote.middleware import DemotingMiddleware
from langchain_demote.provider_rules import violations
from tests.langchain_demote.support import ScriptedToolModel, record_windows
from tests.support.counting import CountingArchive

LIMIT = 6000
CALLS = 60


@tool
def write_file(path: str, text: str) -> str:
    """Write ``text`` to ``path``."""
    return f"wrote {len(text)} characters to {path}"


@tool
def search(query: str) -> str:
    """Search the code base."""
    return f"results for {query}: " + " ".join(f"hit{i} line {i * 3}" for i in range(120))


@tool(response_format="content")
def screenshot(page: int) -> list[dict[str, Any]]:
    """A screenshot of a page."""
    return [
        {"type": "text", "text": f"page {page}"},
        {"type": "image", "url": f"https://example.invalid/page-{page}.png"},
    ]


TOOLS = [write_file, search, screenshot]


class MixedModel(ScriptedToolModel):
    """Makes ``CALLS`` tool calls in turns of one big call, three parallel ones, an image.

    It counts what it made itself: the window it is sent holds only the newest steps.
    """

    made: int = 0

    def reply(self, messages: list[BaseMessage], last_human: int) -> AIMessage:
        if self.made >= CALLS:
            return AIMessage(f"made {self.made} calls")
        step = len(self.calls) - 1
        kind = step % 3
        if kind == 0:
            args: dict[str, Any] = {"path": f"src/f{step}.py", "text": f"# {step}\n" + "x" * 1500}
            calls = [{"name": "write_file", "args": args, "id": f"w{step}", "type": "tool_call"}]
        elif kind == 1:
            calls = [
                {"name": "search", "args": {"query": f"q{step}-{j}"}, "id": f"s{step}-{j}"}
                for j in range(3)
            ]
        else:
            calls = [{"name": "screenshot", "args": {"page": step}, "id": f"p{step}"}]
        self.made += len(calls)
        return AIMessage("", tool_calls=[{**c, "type": "tool_call"} for c in calls])


def test_sixty_mixed_tool_calls_stay_bounded_and_valid_in_both_adapters(tmp_path: Path) -> None:
    hook = CountingArchive(tmp_path / "archive.db")
    demoter = Demoter(SlidingWindow.last_tokens(LIMIT), hook)
    middleware = DemotingMiddleware(demoter)
    windows = record_windows(middleware)
    model = MixedModel()
    agent = create_agent(model, TOOLS, checkpointer=InMemorySaver(), middleware=[middleware])
    config: Any = {"configurable": {"thread_id": "mixed"}, "recursion_limit": 300}
    result = agent.invoke({"messages": [HumanMessage("Refactor the whole project.")]}, config)
    thread = result["messages"]
    assert thread[-1].content == f"made {CALLS} calls"
    assert sum(isinstance(m, ToolMessage) for m in thread) == CALLS
    assert len(model.calls) == len(windows) == 37  # 36 steps of 60 calls, then the answer
    for sent, meta in zip(model.calls, windows, strict=True):
        tokens = count_tokens_approximately(sent, tools=TOOLS)
        assert tokens <= LIMIT + meta.get("overhang", 0), f"{tokens} tokens at {LIMIT}"
        assert violations(sent) == [], violations(sent)[:3]
    state = demoter.state_of("mixed")
    assert state.window_start > 1, "the run was cut inside its one turn"
    assert max(hook.deliveries.values()) == 1 and len(hook.deliveries) == state.delivered

    # The same thread through the history adapter, read back at every step.
    inner = InMemoryChatMessageHistory()
    history = DemotingChatMessageHistory(inner, Demoter(SlidingWindow.last_tokens(LIMIT)), "h")
    checked = 0
    for message in thread:
        if isinstance(message, AIMessage):  # a model call: every result is in by now
            shown = history.messages
            assert count_tokens_approximately(shown) <= LIMIT + 2000  # one step at most over
            assert violations(shown) == [], violations(shown)[:3]
            checked += 1
        history.add_messages([message])
    assert checked == 37
    assert inner.messages == thread, "the inner store keeps every message whole"
