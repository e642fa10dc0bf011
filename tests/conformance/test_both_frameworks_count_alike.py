"""Both adapters count the same request the same way, so they cut it at the same places.

The recorded agent runs' messages (``../shared/data/agent_traces``), as LangChain messages
and as the LlamaIndex messages ``FunctionAgent`` would hold for them: its tool results
carry a ``tool_call_id`` and no tool name (the name is in the call they answer). Each
message counts the same under both adapters' ``to_core`` (a nameless LlamaIndex result is
named by its call, as LangChain's ``ToolMessage`` is), and a tool definition counts the
same in the middleware and in ``DemotingLLM`` (as ``count_tokens_approximately`` counts
it). A cleared result's placeholder names the tool in both.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.tools import StructuredTool
from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock, ToolCallBlock

from demote import Demoter, SlidingWindow
from demote.window.clearing import placeholder_text
from demote.window.tokens import approximate_tokens, schema_tokens
from langchain_demote.messages import to_core as lc_core
from llamaindex_demote.messages import CallNames
from llamaindex_demote.messages import to_core as li_core

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.real_traces import load, traces_dir  # noqa: E402

pytestmark = pytest.mark.skipif(
    not traces_dir().is_dir(), reason=f"no recorded agent runs in {traces_dir()}"
)


def as_llamaindex(message: BaseMessage) -> ChatMessage:
    """``message`` as FunctionAgent holds it (a result has its call id, not its name)."""
    if isinstance(message, SystemMessage):
        return ChatMessage(role=MessageRole.SYSTEM, blocks=[TextBlock(text=message.text)])
    if isinstance(message, HumanMessage):
        return ChatMessage(role=MessageRole.USER, blocks=[TextBlock(text=message.text)])
    if isinstance(message, ToolMessage):
        return ChatMessage(
            role=MessageRole.TOOL,
            blocks=[TextBlock(text=message.text)],
            additional_kwargs={"tool_call_id": message.tool_call_id},
        )
    assert isinstance(message, AIMessage)
    blocks: list[Any] = [TextBlock(text=message.text)] if message.text else []
    blocks += [
        ToolCallBlock(tool_call_id=c["id"] or "", tool_name=c["name"], tool_kwargs=c["args"])
        for c in message.tool_calls
    ]
    return ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks)


def test_every_message_of_the_recorded_runs_counts_the_same() -> None:
    traces, _ = load()
    demoter = Demoter(SlidingWindow.last_tokens(4000))
    checked = named = 0
    for trace in traces:
        names = CallNames()
        li_describe = functools.partial(li_core, describe=demoter.describe, names=names)
        for message in trace.messages:
            if isinstance(message, AIMessage) and isinstance(message.content, list):
                continue  # provider-specific content blocks: not what FunctionAgent keeps
            ours = lc_core(message, demoter.describe)
            theirs = li_describe(as_llamaindex(message))
            assert theirs.tokens == ours.tokens, (trace.name, message.type, message.text[:60])
            if isinstance(message, ToolMessage):
                assert theirs.tool == ours.tool == message.name
                named += 1
            checked += 1
    assert checked > 1000 and named > 300


def test_a_nameless_result_is_named_by_its_call_in_its_placeholder() -> None:
    demoter = Demoter(SlidingWindow.last_tokens(4000))
    names = CallNames()
    call = ChatMessage(
        role=MessageRole.ASSISTANT,
        blocks=[ToolCallBlock(tool_call_id="c7", tool_name="read_file", tool_kwargs={})],
    )
    result = ChatMessage(
        role=MessageRole.TOOL,
        blocks=[TextBlock(text="x" * 400)],
        additional_kwargs={"tool_call_id": "c7"},
    )
    li_core(call, demoter.describe, names)
    record = li_core(result, demoter.describe, names)
    assert record.tool == "read_file"
    assert "read_file result cleared" in placeholder_text("k", record.tool, record.tokens)
    lc = lc_core(ToolMessage("x" * 400, tool_call_id="c7", name="read_file"), demoter.describe)
    assert record.tokens == lc.tokens
    # Without the conversation's call names (or an unknown call), it stays nameless.
    assert li_core(result, Demoter(SlidingWindow.last_tokens(4000)).describe).tool is None


def test_a_tool_definition_counts_as_langchain_counts_it() -> None:
    traces, _ = load()
    seen = 0
    for trace in traces:
        for spec in trace.tools:
            fn = spec["function"]
            tool = StructuredTool.from_function(
                func=lambda **kw: "", name=fn["name"], description=fn["description"],
                args_schema=fn["parameters"],
            )  # fmt: skip
            ours = schema_tokens(
                fn["name"], fn["description"], fn["parameters"], approximate_tokens
            )
            assert ours == count_tokens_approximately([], tools=[tool]), fn["name"]
            seen += 1
    assert seen >= 10
