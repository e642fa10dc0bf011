"""An old step whose *call* is huge is clipped like an oversized result.

An agent writes a ~7,000-token file through a tool call's arguments, then makes ten small
calls, under ``last_tokens(4000)`` with a SQLite archive. Without clipping calls the
request carrying that call is ~7,600 tokens at every later model call. With it, the
call's long argument value is sent as its head and a marker naming the archived key: the
request stays within the limit (LangChain's count, system prompt and tools included), the
arguments keep their keys, the call its id and name, the same bytes at every call; the
archive holds the whole call and ``recall_tool`` fetches it by the key. Both providers'
converters accept every request. The LlamaIndex adapter renders the same cut.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from demote import Demoter, SlidingWindow, SQLiteArchive
from demote.window.clearing import ARG_HEAD_CHARS
from langchain_demote import recall_tool
from langchain_demote.middleware import DemotingMiddleware
from langchain_demote.provider_rules import violations
from tests.langchain_demote.support import ScriptedToolModel

LIMIT = 4000
SYSTEM = "You write code."
STEPS = 10
CONTENT = " ".join(f"row{i} = compute({i}, scale={i % 7});" for i in range(1100))  # ~7,000 tokens


@tool
def write_file(path: str, content: str) -> str:
    """Write ``content`` to the file at ``path``."""
    return f"ok: {len(content)} characters written to {path}"


@tool
def check(n: int) -> str:
    """Run check ``n``."""
    return f"check {n}: passed " + "fine " * 60


class Writer(ScriptedToolModel):
    """Writes the file, then runs checks 1..STEPS, then answers (from its newest call)."""

    def reply(self, messages: list[BaseMessage], last_human: int) -> AIMessage:
        calls = [m for m in messages if isinstance(m, AIMessage) and m.tool_calls]
        if not calls:
            call = {
                "name": "write_file",
                "args": {"path": "src/big.py", "content": CONTENT},
                "id": "call_write",
                "type": "tool_call",
            }
            return AIMessage("Writing the module.", tool_calls=[call])
        last = calls[-1].tool_calls[0]
        n = 1 if last["name"] == "write_file" else int(last["args"]["n"]) + 1
        if n > STEPS:
            return AIMessage("Done.")
        return AIMessage("", tool_calls=[{"name": "check", "args": {"n": n}, "id": f"c{n}"}])


def _tools_tokens() -> int:
    from langchain_core.utils.function_calling import convert_to_openai_tool

    return count_tokens_approximately([], tools=[convert_to_openai_tool(write_file), check])


def test_a_huge_call_is_clipped_and_the_window_keeps_its_bound(tmp_path: Path) -> None:
    archive = SQLiteArchive(str(tmp_path / "archive.db"))
    model = Writer()
    agent = create_agent(
        model,
        [write_file, check],
        system_prompt=SYSTEM,
        checkpointer=InMemorySaver(),
        middleware=[DemotingMiddleware(Demoter(SlidingWindow.last_tokens(LIMIT), archive))],
    )
    config: dict[str, Any] = {"configurable": {"thread_id": "job-9"}}
    result = agent.invoke({"messages": [HumanMessage("Write big.py, then check it.")]}, config)
    assert result["messages"][-1].content == "Done."
    full = next(m for m in result["messages"] if isinstance(m, AIMessage) and m.tool_calls)
    assert full.tool_calls[0]["args"]["content"] == CONTENT  # the state keeps it whole
    assert count_tokens_approximately([full]) > 6500

    seen: list[str] = []
    for k, sent in enumerate(model.calls[1:], 1):
        assert violations(sent) == [], k
        tokens = count_tokens_approximately(sent) + _tools_tokens()
        assert tokens <= LIMIT, (k, tokens)
        writes = [m for m in sent if isinstance(m, AIMessage) and m.tool_calls]
        write = next((m for m in writes if m.tool_calls[0]["name"] == "write_file"), None)
        if write is None:
            continue
        call = write.tool_calls[0]
        assert (call["id"], call["name"]) == ("call_write", "write_file")
        assert set(call["args"]) == {"path", "content"}
        assert call["args"]["path"] == "src/big.py"
        shown = call["args"]["content"]
        assert shown.startswith(CONTENT[:ARG_HEAD_CHARS])
        assert len(shown) < ARG_HEAD_CHARS + 200
        assert write.content == "Writing the module."
        seen.append(repr(write.tool_calls) + repr(write.content))
    assert len(seen) >= 3  # the call stayed in the window, clipped, for several calls
    assert len(set(seen)) == 1  # the same bytes at every call

    key = re.search(r"archived as key ([0-9a-f]{32})", seen[0])
    assert key is not None
    archived = archive.fetch("job-9", key.group(1))
    assert archived is not None and archived.data is not None
    assert archived.data["tool_calls"][0]["args"]["content"] == CONTENT
    assert archive.count("job-9") >= 1
    fetched = recall_tool(archive).invoke({"key": key.group(1)}, config=config)
    assert CONTENT[ARG_HEAD_CHARS : ARG_HEAD_CHARS + 1500] in fetched


def test_without_a_long_string_the_call_is_sent_whole() -> None:
    # Many short values: nothing to cut, so the message is counted (and sent) whole.
    d = Demoter(SlidingWindow.last_tokens(LIMIT))
    from langchain_demote.messages import replaced, to_core

    args = {f"k{i}": f"v{i}" for i in range(2000)}
    message = AIMessage("", tool_calls=[{"name": "put", "args": args, "id": "c1"}])
    rec = to_core(message, d.describe)
    assert rec.tokens > LIMIT and rec.clipped_tokens is None
    assert replaced(message, "marker") is message


def test_anthropic_tool_use_blocks_are_cut_too() -> None:
    from langchain_demote.messages import replaced

    args = {"path": "a.py", "content": CONTENT}
    message = AIMessage(
        [
            {"type": "text", "text": "Writing."},
            {"type": "tool_use", "id": "toolu_1", "name": "write_file", "input": args},
        ],
        tool_calls=[{"name": "write_file", "args": args, "id": "toolu_1"}],
    )
    sent = replaced(message, "\n[call clipped]")
    block = sent.content[1]
    assert isinstance(block, dict)
    assert block["input"] == sent.tool_calls[0]["args"]  # type: ignore[union-attr]
    assert block["input"]["content"] == CONTENT[:ARG_HEAD_CHARS] + "\n[call clipped]"
    assert message.tool_calls[0]["args"]["content"] == CONTENT  # the original is untouched
    assert violations([HumanMessage("go"), sent, ToolMessage("ok", tool_call_id="toolu_1")]) == []


def test_llamaindex_renders_the_same_cut() -> None:
    pytest.importorskip("llama_index.core", reason="llama-index-core not installed")
    from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock, ToolCallBlock

    from llamaindex_demote.messages import replaced as li_replaced
    from llamaindex_demote.messages import to_core as li_to_core
    from llamaindex_demote.messages import tool_calls

    args = {"path": "a.py", "content": CONTENT}
    message = ChatMessage(
        role=MessageRole.ASSISTANT,
        blocks=[
            TextBlock(text="Writing the module."),
            ToolCallBlock(tool_call_id="call_write", tool_name="write_file", tool_kwargs=args),
        ],
    )
    d = Demoter(SlidingWindow.last_tokens(LIMIT))
    from langchain_demote.messages import to_core

    lc = AIMessage(
        "Writing the module.",
        tool_calls=[{"name": "write_file", "args": args, "id": "call_write"}],
    )
    ours, theirs = li_to_core(message, d.describe), to_core(lc, d.describe)
    assert (ours.tokens, ours.clipped_tokens) == (theirs.tokens, theirs.clipped_tokens)
    assert ours.clipped_tokens is not None and ours.clipped_tokens < 250
    sent = li_replaced(message, "\n[call clipped]")
    (call,) = tool_calls(sent)
    assert (call["id"], call["name"], set(call["args"])) == ("call_write", "write_file", set(args))
    assert call["args"]["content"] == CONTENT[:ARG_HEAD_CHARS] + "\n[call clipped]"
    assert sent.blocks[0] == message.blocks[0]
