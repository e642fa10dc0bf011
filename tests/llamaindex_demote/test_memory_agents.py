"""DemotingMemory under a long FunctionAgent run: what the model is sent, call by call.

A ``FunctionAgent`` (llama-index-core's own workflow, a mock function-calling LLM) makes
``STEPS`` tool calls in one run, each answered by a ~1,450-token result. LlamaIndex reads
the memory before every model call (``aget(input=...)``) but keeps the run's own steps in
its scratchpad, sent after the memory's messages, and puts them into memory when the run
ends. So with the memory alone, the memory's part of every request is bounded and the
scratchpad is not (the last call is sent 41,248 tokens); with the LLM wrapped in
``DemotingLLM`` every call is within the limit. After the run, the memory's window cuts
at steps like every other window (the opener, the newest steps, cleared results as
placeholders) and what left it reaches the hook once.

``python -m tests.llamaindex_demote.test_memory_agents`` prints the per-call figures.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock, ToolCallBlock
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.tools import FunctionTool

from demote import Demoter, SlidingWindow
from demote.window.policy import ClearToolResults
from llamaindex_demote import DemotingLLM, DemotingMemory
from llamaindex_demote.messages import opened_calls, text_of, to_core
from tests.support.counting import CountingArchive

pytestmark = pytest.mark.filterwarnings(
    "ignore::pydantic.warnings.PydanticDeprecationWarning:inspect"
)

STEPS = 30
LIMIT = 3000
RESULT_CHARS = 5_800  # about 1,450 tokens under the approximate count
TASK = "Read the whole report, page by page."


def page(n: int) -> str:
    """Return page ``n`` of the report."""
    return f"page {n}: " + " ".join(f"w{n}x{k}" for k in range(RESULT_CHARS // 8))


def fetch(n: int) -> str:
    """Fetch page ``n`` of the report."""
    return page(n)[:RESULT_CHARS]


def approx_tokens(messages: list[ChatMessage]) -> int:
    """Characters / 4 per message plus 3, tool-call arguments included."""
    total = 0
    for m in messages:
        chars = len(text_of(m))
        chars += sum(
            len(str(b.tool_kwargs)) + len(b.tool_name)
            for b in m.blocks
            if isinstance(b, ToolCallBlock)
        )
        total += math.ceil(chars / 4) + 3
    return total


def tool_loop_llm(seen: list[list[ChatMessage]], steps: int = STEPS) -> MockFunctionCallingLLM:
    """Calls ``fetch`` for pages 0..steps-1, the one after the newest it sees, then answers."""

    def respond(messages: Any, **kwargs: Any) -> ChatMessage:
        seen.append(list(messages))
        done = [int(m.additional_kwargs["tool_call_id"][5:]) for m in messages if m.role == "tool"]
        step = max(done) + 1 if done else 0
        if step >= steps:
            return ChatMessage(role=MessageRole.ASSISTANT, blocks=[TextBlock(text="read it all")])
        call = ToolCallBlock(
            tool_call_id=f"call-{step}", tool_name="fetch", tool_kwargs={"n": step}
        )
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=[call])

    return MockFunctionCallingLLM(response_generator=respond, is_chat_model=True)


def check_window(window: list[ChatMessage]) -> None:
    """User first after system messages, every result with its call and every call answered."""
    body = [m for m in window if m.role != MessageRole.SYSTEM]
    assert body and body[0].role == MessageRole.USER
    calls = {cid for m in body for cid in opened_calls(m)}
    results = {m.additional_kwargs.get("tool_call_id") for m in body if m.role == MessageRole.TOOL}
    assert results <= calls and calls <= results


async def running(agent: FunctionAgent, task: str, memory: DemotingMemory, most: int) -> Any:
    """One agent run (it must start inside a running event loop)."""
    return await agent.run(task, memory=memory, max_iterations=most)


def run(
    tmp_path: Path, policy: SlidingWindow, steps: int = STEPS
) -> tuple[DemotingMemory, CountingArchive, Demoter, list[list[ChatMessage]], list[int]]:
    """One FunctionAgent run; also returns the length of the memory's part of each call."""
    hook = CountingArchive(tmp_path / "archive.db")
    # The default hook_wait: on a loaded machine the run's last load (which delivers what
    # left the window) may stop waiting before the archive has it, and asyncio.run closes
    # that load's event loop at the run's end; the call is followed on in a thread.
    demoter = Demoter(policy, hook)
    memory = DemotingMemory.from_defaults(demoter=demoter, chat_store_key="agent")
    seen: list[list[ChatMessage]] = []
    parts: list[int] = []
    original = memory.aget

    async def aget(*args: Any, **kwargs: Any) -> list[ChatMessage]:
        window = await original(*args, **kwargs)
        parts.append(approx_tokens(window))
        return window

    object.__setattr__(memory, "aget", aget)
    agent = FunctionAgent(
        tools=[fetch], llm=tool_loop_llm(seen, steps), system_prompt="be thorough"
    )
    answer = asyncio.run(running(agent, TASK, memory, steps + 10))
    assert str(answer) == "read it all"
    assert demoter.drain(30), "a delivery that outlived its load ended"
    object.__setattr__(memory, "aget", original)
    return memory, hook, demoter, seen, parts


def test_inside_a_run_every_call_is_within_the_limit_with_demoting_llm(tmp_path: Path) -> None:
    """With ``DemotingLLM`` the whole request is bounded, the run's scratchpad included."""
    hook = CountingArchive(tmp_path / "archive.db")
    demoter = Demoter(SlidingWindow.last_tokens(LIMIT), hook, hook_wait=None)
    memory = DemotingMemory.from_defaults(demoter=demoter, chat_store_key="agent")
    overhang: list[int] = []
    demoter.observe(lambda e: overhang.append(e.tokens_after or 0) if e.kind == "overhang" else 0)
    seen: list[list[ChatMessage]] = []
    llm = DemotingLLM(tool_loop_llm(seen))
    agent = FunctionAgent(tools=[fetch], llm=llm, system_prompt="be thorough")
    assert str(asyncio.run(running(agent, TASK, memory, STEPS + 10))) == "read it all"
    assert len(seen) == STEPS + 1
    tools = FunctionTool.from_defaults(fetch).metadata.to_openai_tool()
    counter = demoter.policy.resolved_counter()
    reserved = counter(json.dumps(tools, default=str, separators=(",", ":")))
    sent = [sum(to_core(m, demoter.describe).tokens for m in s) + reserved for s in seen]
    assert max(sent) <= LIMIT + max(overhang, default=0)
    # Without the wrapper the last call was sent 41,248 tokens in 62 messages.
    assert len(seen[-1]) < 10
    assert max(hook.deliveries.values()) == 1


def test_after_the_run_the_window_cuts_at_steps_and_archives_once(tmp_path: Path) -> None:
    memory, hook, demoter, _, _ = run(tmp_path, SlidingWindow.last_tokens(LIMIT))
    history = memory.get_all()
    assert len(history) == 2 + 2 * STEPS, "the run's steps went into the chat store"
    window = asyncio.run(memory.aget())
    check_window(window)
    assert approx_tokens(window) <= LIMIT
    assert text_of(window[0]) == TASK, "the opener stays in front of the kept steps"
    state = demoter.state_of("agent")
    assert state.window_start > 1
    assert max(hook.deliveries.values()) == 1
    assert sorted(hook.indexes) == list(range(state.delivered))
    assert hook.archive.count("agent") == state.delivered
    stored = [text_of(m) for m in memory.get_all() if m.role == MessageRole.TOOL]
    assert stored == [fetch(n) for n in range(STEPS)], "the chat store keeps every result whole"
    # The next run starts from a bounded window, with a user message first.
    agent = FunctionAgent(tools=[fetch], llm=tool_loop_llm(seen := [], 1), system_prompt="go")
    asyncio.run(running(agent, "And the summary page?", memory, 10))
    check_window(seen[0][1:])
    assert approx_tokens(seen[0]) <= LIMIT


def test_after_the_run_old_results_are_placeholders_copied_not_changed(tmp_path: Path) -> None:
    policy = SlidingWindow(
        unit="tokens", limit=LIMIT, clearing=ClearToolResults(trigger=2000, keep=1)
    )
    memory, hook, _, _, _ = run(tmp_path, policy, steps=12)
    window = asyncio.run(memory.aget())
    check_window(window)
    cleared = [m for m in window if m.role == MessageRole.TOOL and "cleared" in text_of(m)]
    assert cleared, "nothing was cleared"
    for m in cleared:
        assert m.additional_kwargs["tool_call_id"].startswith("call-")
        key = text_of(m).split("archived as key ")[1].split(";")[0]
        assert hook.deliveries[key] == 1
    stored = [text_of(m) for m in memory.get_all() if m.role == MessageRole.TOOL]
    assert stored == [fetch(n) for n in range(12)], "the chat store keeps every result whole"


def main() -> None:  # pragma: no cover - prints the figures for the README
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        _, _, _, seen, parts = run(Path(tmp), SlidingWindow.last_tokens(LIMIT))
        sent = [approx_tokens(s) for s in seen]
        print(f"FunctionAgent, {STEPS} tool calls of ~1,450 tokens, last_tokens({LIMIT}):")
        print(f"  memory's part of each call inside the run: max {max(parts[:-1])} tokens")
        print(f"  memory's window after the run (the steps put in): {parts[-1]} tokens")
        print(f"  sent per call: first {sent[0]}, 10th {sent[9]}, last {sent[-1]} tokens")
        print(f"  messages in the last call: {len(seen[-1])}")
        hook = CountingArchive(Path(tmp) / "wrapped.db")
        demoter = Demoter(SlidingWindow.last_tokens(LIMIT), hook, hook_wait=None)
        memory = DemotingMemory.from_defaults(demoter=demoter, chat_store_key="wrapped")
        seen = []
        llm = DemotingLLM(tool_loop_llm(seen))
        agent = FunctionAgent(tools=[fetch], llm=llm, system_prompt="be thorough")
        asyncio.run(running(agent, TASK, memory, STEPS + 10))
        sent = [approx_tokens(s) for s in seen]
        print("  the same run with llm=DemotingLLM(llm):")
        print(f"  sent per call: first {sent[0]}, 10th {sent[9]}, last {sent[-1]}, max {max(sent)}")
        print(f"  messages in the last call: {len(seen[-1])}; archived {len(hook.deliveries)}")


if __name__ == "__main__":  # pragma: no cover
    main()
    sys.exit(0)


def test_assemble_sends_copies_with_placeholders_and_the_progress_note() -> None:
    from demote.engine import PROGRESS_PREFIX, Window
    from demote.records import Recalled
    from llamaindex_demote._rendering import assemble

    system = ChatMessage(role=MessageRole.SYSTEM, content="rules")
    opener = ChatMessage(role=MessageRole.USER, content="do the job")
    call = ChatMessage(
        role=MessageRole.ASSISTANT,
        blocks=[ToolCallBlock(tool_call_id="c1", tool_name="fetch", tool_kwargs={"n": 1})],
    )
    result = ChatMessage(
        role=MessageRole.TOOL,
        content="long content",
        additional_kwargs={"tool_call_id": "c1", "name": "fetch"},
    )
    window = Window(
        "c", [system], "read page 0", [call, result], start=5, total=7,
        opener=opener, clipped={6: "long\n[clipped]"}, opener_index=0,
    )  # fmt: skip
    out = assemble(window)
    assert [m.role for m in out] == ["system", "user", "user", "assistant", "tool"]
    # The opener as stored (byte-identical when the summary changes), then the note.
    assert out[1] is opener
    assert [b.text for b in out[2].blocks if isinstance(b, TextBlock)] == [
        PROGRESS_PREFIX + "read page 0"
    ]
    assert text_of(opener) == "do the job", "the stored opener is not changed"
    assert out[3] is call
    assert text_of(out[4]) == "long\n[clipped]" and out[4].additional_kwargs["tool_call_id"] == "c1"
    assert text_of(result) == "long content", "the stored result is not changed"
    # Recall for the opener goes after it and its note; a hit on the opener is not sent.
    from demote.request import Recalling, render_recall, visible_hits

    on_opener = Recalled("user", "do the job", 0, "k0")
    hit = Recalled("user", "earlier words", 2, "k2")
    assert visible_hits(window, [on_opener, hit], lambda m: (m.role.value, text_of(m))) == [hit]
    with_recall = assemble(window, Recalling(render_recall([hit]), (hit,), 0))
    assert with_recall[1] is opener and text_of(with_recall[2]).startswith(PROGRESS_PREFIX)
    assert with_recall[3].role == MessageRole.USER and "earlier words" in text_of(with_recall[3])
    assert with_recall[4] is call
