"""LlamaIndex agents and workflows over DemotingMemory, as LlamaIndex documents them.

``FunctionAgent`` with parallel tool calls and ``ReActAgent`` with a tool loop (it emits
one action per step) must not tell a never-demoting ``DemotingMemory`` from a
``ChatMemoryBuffer``; with a small window, a tool call and its results stay together. An
``AgentWorkflow`` paused for human input is saved with ``Context.to_dict`` (JSON and
pickle serializers), resumed in a new process, and keeps demoting there; a reused
context, which LlamaIndex round-trips through ``to_dict`` on every run, keeps the memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent, ReActAgent
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.llms.mock import MockFunctionCallingLLM, MockLLM
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.core.memory.types import BaseMemory
from llama_index.core.workflow import Context

from demote import Demoter, SlidingWindow
from llamaindex_demote import RECALL_PREFIX, DemotingMemory
from llamaindex_demote.messages import opened_calls, text_of
from tests.conformance._child import run_child
from tests.conformance._llamaindex import pairs
from tests.conformance.contract import RecordingHook

# Building an agent runs inspect.getmembers over a pydantic model (llama-index workflows'
# get_steps_from_instance), which touches pydantic's deprecated attributes.
pytestmark = pytest.mark.filterwarnings(
    "ignore::pydantic.warnings.PydanticDeprecationWarning:inspect"
)

CHILD = Path(__file__).with_name("_workflow_child.py")
NEVER = SlidingWindow.last_messages(10_000)
RUNS = 6


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def parallel_llm(seen: list[list[tuple[str, str]]]) -> MockFunctionCallingLLM:
    """A user turn gets two tool calls in one message; the tool results, an answer."""

    def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        seen.append(pairs(messages))
        last = messages[-1]
        if last.role == MessageRole.TOOL:
            results = [text_of(m) for m in messages if m.role == MessageRole.TOOL][-2:]
            return ChatMessage(role="assistant", content=f"results {sorted(results)}")
        n = len(messages)
        calls = [
            ToolCallBlock(tool_call_id=f"a{n}", tool_name="add", tool_kwargs={"a": n, "b": 1}),
            ToolCallBlock(tool_call_id=f"m{n}", tool_name="multiply", tool_kwargs={"a": n, "b": 2}),
        ]
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=calls)

    return MockFunctionCallingLLM(response_generator=respond, is_chat_model=True)


def react_llm(seen: list[list[tuple[str, str]]]) -> MockLLM:
    """Two actions (one per step, as ReAct does), then the answer."""

    def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        seen.append(pairs(messages))
        observations = 0
        for m in reversed(messages):
            if not text_of(m).startswith("Observation"):
                if m.role == MessageRole.USER:
                    break
                continue
            observations += 1
        if observations == 0:
            text = 'Thought: add first.\nAction: add\nAction Input: {"a": 2, "b": 3}'
        elif observations == 1:
            text = 'Thought: now multiply.\nAction: multiply\nAction Input: {"a": 5, "b": 7}'
        else:
            text = "Thought: I can answer.\nAnswer: 35"
        return ChatMessage(role=MessageRole.ASSISTANT, content=text)

    return MockFunctionCallingLLM(response_generator=respond, is_chat_model=True)


def run_agent(kind: str, memory: BaseMemory) -> tuple[Any, ...]:
    seen: list[list[tuple[str, str]]] = []
    if kind == "function":
        agent: Any = FunctionAgent(tools=[add, multiply], llm=parallel_llm(seen), system_prompt="s")
    else:
        agent = ReActAgent(tools=[add, multiply], llm=react_llm(seen), system_prompt="s")

    async def chat() -> list[str]:
        return [str(await agent.run(f"question {i}", memory=memory)) for i in range(RUNS)]

    answers = asyncio.run(chat())
    return answers, seen, pairs(memory.get_all())


@pytest.mark.parametrize("kind", ["function", "react"])
def test_never_demoting_window_is_invisible(kind: str) -> None:
    buffer = ChatMemoryBuffer.from_defaults(token_limit=1_000_000, tokenizer_fn=str.split)
    hook = RecordingHook()
    expected = run_agent(kind, buffer)
    answers, _, history = expected
    if kind == "function":
        assert answers[0] == "results ['3', '4']" and len(history) == 5 * RUNS
        calls = next(m for m in buffer.get_all() if m.role == MessageRole.ASSISTANT)
        assert len(opened_calls(calls)) == 2, "two tool calls in one message"
    else:
        assert answers[0] == "35" and len(history) == 2 * RUNS
    ours = DemotingMemory.from_defaults(demoter=Demoter(NEVER, hook))
    assert run_agent(kind, ours) == expected
    assert hook.batches == []


def test_parallel_tool_calls_stay_with_their_results() -> None:
    hook = RecordingHook()
    memory = DemotingMemory.from_defaults(demoter=Demoter(SlidingWindow.last_messages(6), hook))
    _, seen, history = run_agent("function", memory)
    start = memory.demoter.state_of(memory.chat_store_key).window_start
    assert start > 0
    # The window starts at a turn, or at a step inside one with the turn's opener in front:
    # either way the model is sent a user message first.
    window = memory.get()
    assert next(m for m in window if m.role != "system").role == "user"
    for sent in seen:
        assert len(sent) <= 1 + 6 + 4, "system prompt, window, the run's own scratchpad"
    kept = memory.get_all()[start:]
    opened = {c for m in kept for c in opened_calls(m)}
    assert all(m.additional_kwargs["tool_call_id"] in opened for m in kept if m.role == "tool")
    assert [(m.role, m.text) for b in hook.batches for m in b.messages] == history[:start]


# -- saving and resuming a workflow --------------------------------------------------------


def child(folder: Path, phase: str, serializer: str, *extra: str) -> dict[str, Any]:
    return run_child(CHILD, folder, phase, serializer, *extra)


@pytest.mark.slow
@pytest.mark.parametrize("serializer", ["json", "pickle"])
def test_workflow_paused_for_a_human_resumes_in_a_new_process(
    serializer: str, tmp_path: Path
) -> None:
    paused = child(tmp_path, "pause", serializer)
    assert "error" not in paused, paused.get("error")
    assert paused["memory"] == "DemotingMemory" and paused["same_demoter"]
    assert paused["history"][-1] == "do the dangerous thing"
    assert paused["window_start"] > 0, "five turns in a 6-message window demote"
    assert paused["delivered"] == list(range(paused["window_start"]))

    resumed = child(tmp_path, "resume", serializer)
    assert "error" not in resumed, resumed.get("error")
    assert resumed["result"] == "done: confirmed=yes"
    assert resumed["memory"] == "DemotingMemory" and resumed["same_demoter"], (
        "the restored memory is attached to the demoter registered in the new process"
    )
    history = resumed["history"]
    assert history[: len(paused["history"])] == paused["history"]
    assert history[-2:] == ["turn 7", "echo turn 7"]
    # Still demoting, and nothing the first process delivered is delivered again.
    assert resumed["window_start"] > paused["window_start"] + 6
    assert resumed["delivered"] == list(range(paused["window_start"], resumed["window_start"]))
    assert resumed["archived"] == resumed["window_start"]


@pytest.mark.slow
def test_pickled_memory_restores_in_a_new_process(tmp_path: Path) -> None:
    saved = child(tmp_path, "pickle", "pickle")
    assert "error" not in saved, saved.get("error")
    restored = child(tmp_path, "unpickle", "pickle")
    assert "error" not in restored, restored.get("error")
    assert (
        restored["same_demoter"]
        and restored["history"][: len(saved["history"])] == saved["history"]
    )
    assert restored["delivered"] == list(range(saved["window_start"], restored["window_start"]))
    assert restored["recall"].startswith(RECALL_PREFIX) and "turn 0" in restored["recall"]


@pytest.mark.slow
def test_unnamed_demoter_cannot_resume_elsewhere_and_says_why(tmp_path: Path) -> None:
    paused = child(tmp_path, "pause", "json", "--unnamed")
    assert "error" not in paused, paused.get("error")
    resumed = child(tmp_path, "resume", "json", "--unnamed")
    assert "named automatically by the process that saved it" in resumed["error"]
    assert "demote.registry.register" in resumed["error"]


def test_reused_context_keeps_the_memory_between_runs() -> None:
    """LlamaIndex round-trips a reused context's state through to_dict on every run."""
    hook = RecordingHook()
    demoter = Demoter(SlidingWindow.last_messages(4), hook)  # not registered: in-process
    memory = DemotingMemory.from_defaults(demoter=demoter, chat_store_key="reuse")
    seen: list[list[tuple[str, str]]] = []
    workflow = AgentWorkflow(agents=[FunctionAgent(tools=[add, multiply], llm=parallel_llm(seen))])

    async def chat() -> Any:
        ctx = Context(workflow)
        await workflow.run(user_msg="question 0", memory=memory, ctx=ctx)
        for i in range(1, 4):
            await workflow.run(user_msg=f"question {i}", ctx=ctx)
        return await ctx.store.get("memory")

    kept = asyncio.run(chat())
    assert isinstance(kept, DemotingMemory) and kept.demoter is demoter
    assert [t for r, t in pairs(kept.get_all()) if r == "user"] == [
        f"question {i}" for i in range(4)
    ]
    delivered = [m.index for b in hook.batches for m in b.messages]
    assert delivered == list(range(demoter.state_of("reuse").window_start)) and delivered
