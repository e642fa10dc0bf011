"""End to end: FunctionAgent with a tool over DemotingMemory, 60+ runs, offline.

FunctionAgent (llama-index-core 0.14.25) calls only the async memory methods:
``aput(user)`` -> ``aget()`` -> ``aget(input=...)`` after the tool calls ->
``aput_messages([assistant with ToolCallBlock, tool(tool_call_id), assistant])`` ->
``aget()``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatMessage

from demote import Demoter, FanOutHook, SlidingWindow
from demote.archive.sqlite import SQLiteArchive
from llamaindex_demote import DemotingMemory
from llamaindex_demote.messages import from_recalled, opened_calls
from tests.conformance.contract import RecordingHook
from tests.llamaindex_demote.support import to_pairs, tool_calling_llm

RUNS = 64

# Building a FunctionAgent runs inspect.getmembers over a pydantic model (llama-index
# workflows' get_steps_from_instance), which touches pydantic's deprecated attributes;
# pydantic attributes those warnings to the inspect module.
pytestmark = pytest.mark.filterwarnings(
    "ignore::pydantic.warnings.PydanticDeprecationWarning:inspect"
)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class CallLog:
    """Wraps a memory's async methods to record the order LlamaIndex calls them in."""

    def __init__(self, memory: DemotingMemory) -> None:
        self.calls: list[str] = []
        self.depth = 0
        for name in ("aput", "aput_messages", "aget", "aget_all", "aset", "areset"):
            self._wrap(memory, name)

    def _wrap(self, memory: DemotingMemory, name: str) -> None:
        original = getattr(memory, name)

        async def logged(*args: Any, **kwargs: Any) -> Any:
            if not self.depth:  # aput delegates to aput_messages: log the outer call
                self.calls.append(name + ("(input)" if kwargs.get("input") else ""))
            self.depth += 1
            try:
                return await original(*args, **kwargs)
            finally:
                self.depth -= 1

        object.__setattr__(memory, name, logged)


def test_function_agent_keeps_tool_groups_and_archives_once(tmp_path: Path) -> None:
    recorder = RecordingHook()
    archive = SQLiteArchive(tmp_path / "archive.db")
    policy = SlidingWindow.last_messages(10)
    demoter = Demoter(policy, FanOutHook(recorder, archive), on_hook_error="raise")
    memory = DemotingMemory.from_defaults(demoter=demoter, chat_store_key="agent")
    log = CallLog(memory)
    seen: list[list[ChatMessage]] = []
    agent = FunctionAgent(tools=[add], llm=tool_calling_llm(seen), system_prompt="use tools")

    async def run_all() -> list[str]:
        return [str(await agent.run(f"what is {i} plus one?", memory=memory)) for i in range(RUNS)]

    answers = asyncio.run(run_all())
    assert answers[5] == "the tool said 6"

    # The call sequence of one run (the memory method names LlamaIndex used).
    assert log.calls[:6] == ["aput", "aget", "aget(input)", "aput_messages", "aget", "aput"]
    assert set(log.calls) == {"aput", "aget", "aget(input)", "aput_messages"}

    history = memory.get_all()
    assert len(history) == 4 * RUNS
    start = demoter.state_of("agent").window_start
    window = to_pairs(asyncio.run(memory.aget()))
    assert window == to_pairs(history[start:])
    assert len(window) <= policy.limit
    # Turn groups whole: the window starts at a user message, every tool result has its call.
    kept = history[start:]
    assert kept[0].role == "user"
    opened = {cid for m in kept for cid in opened_calls(m)}
    for m in kept:
        if m.role == "tool":
            assert m.additional_kwargs["tool_call_id"] in opened
    # Every model call saw a bounded window (plus the system prompt and the scratchpad).
    assert max(len(s) for s in seen) <= 1 + policy.limit + 2
    for s in seen:
        tools = [m for m in s if m.role == "tool"]
        calls = {cid for m in s for cid in opened_calls(m)}
        assert all(t.additional_kwargs["tool_call_id"] in calls for t in tools)
    # Everything before the window was delivered once, in order, and archived.
    delivered = [(m.index, m.text) for b in recorder.batches for m in b.messages]
    assert delivered == [(i, p[1]) for i, p in enumerate(to_pairs(history[:start]))]
    archived = archive.messages("agent")
    assert [(r.role, r.data["text"]) for r in archived if r.data] == to_pairs(history[:start])
    # Whole messages: the agent's tool calls come back as the memory held them.
    assert [from_recalled(r) for r in archived] == history[:start]
    archive.close()
