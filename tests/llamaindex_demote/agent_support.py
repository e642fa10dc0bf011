"""Scripted LLMs and measures for LlamaIndex agent runs through ``DemotingLLM``.

The mocks are llama-index-core's own (``MockFunctionCallingLLM``) with a scripted
``response_generator``: they decide their next step from what they are sent, as a real
model does, so a window that lost the newest step would make them repeat it. Tool-call
ids are unique per step (``call-<n>``).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock, ToolCallBlock
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.tools import FunctionTool
from pydantic import Field, PrivateAttr

from demote import Demoter
from demote.window.tokens import schema_tokens
from llamaindex_demote.instrumentation import DemotionEvent
from llamaindex_demote.messages import opened_calls, text_of, to_core

RESULT_CHARS = 5_800  # about 1,450 tokens under the approximate count
TASK = "Read the whole report, page by page."
PAGE = re.compile(r"page (\d+):")


def page(n: int) -> str:
    """Page ``n`` of the report: a unique word per position (nothing repeats)."""
    return (f"page {n}: " + " ".join(f"w{n}x{k}" for k in range(RESULT_CHARS // 8)))[:RESULT_CHARS]


def fetch(n: int) -> str:
    """Fetch page ``n`` of the report."""
    return page(n)


def newest_page(messages: Sequence[ChatMessage]) -> int:
    """The highest page number any message the model is sent shows (-1: none)."""
    found = [int(m.group(1)) for msg in messages for m in PAGE.finditer(text_of(msg))]
    return max(found, default=-1)


def function_llm(
    seen: list[list[ChatMessage]], steps: int, tool: str = "fetch", done: str = "read it all"
) -> MockFunctionCallingLLM:
    """Calls ``tool`` for pages 0..steps-1, the next page after the newest it sees, then answers."""

    def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        seen.append(list(messages))
        step = newest_page(messages) + 1
        if step >= steps:
            return ChatMessage(role=MessageRole.ASSISTANT, blocks=[TextBlock(text=done)])
        call = ToolCallBlock(tool_call_id=f"call-{step}", tool_name=tool, tool_kwargs={"n": step})
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=[call])

    return MockFunctionCallingLLM(response_generator=respond, is_chat_model=True)


def react_llm(seen: list[list[ChatMessage]], steps: int) -> MockFunctionCallingLLM:
    """ReAct's text protocol: one ``fetch`` action per step, then the answer."""

    def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        seen.append(list(messages))
        step = newest_page(messages) + 1
        if step >= steps:
            text = "Thought: I have read every page.\nAnswer: read it all"
        else:
            text = f'Thought: next page.\nAction: fetch\nAction Input: {{"n": {step}}}'
        return ChatMessage(role=MessageRole.ASSISTANT, content=text)

    return MockFunctionCallingLLM(response_generator=respond, is_chat_model=True)


def tool_tokens(demoter: Demoter, tools: Sequence[Callable[..., Any]]) -> int:
    """The tools' schemas under the policy's counter, as DemotingLLM reserves them."""
    counter = demoter.policy.resolved_counter()
    total = 0
    for fn in tools:
        schema = FunctionTool.from_defaults(fn).metadata.to_openai_tool()["function"]
        total += schema_tokens(schema["name"], schema["description"], schema["parameters"], counter)
    return total


def request_tokens(demoter: Demoter, sent: Sequence[ChatMessage]) -> int:
    """What one request's messages count under the Demoter's counter."""
    return sum(to_core(m, demoter.describe).tokens for m in sent)


def check_request(sent: Sequence[ChatMessage]) -> None:
    """User first after system messages, every result with its call and every call answered."""
    body = [m for m in sent if m.role != MessageRole.SYSTEM]
    assert body and body[0].role == MessageRole.USER
    calls = {cid for m in body for cid in opened_calls(m)}
    results = {m.additional_kwargs.get("tool_call_id") for m in body if m.role == MessageRole.TOOL}
    assert results == calls


class Collect(BaseEventHandler):
    """Every demote instrumentation event, in order."""

    events: list[DemotionEvent] = Field(default_factory=list)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @classmethod
    def class_name(cls) -> str:
        return "CollectDemote"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if isinstance(event, DemotionEvent):
            with self._lock:
                self.events.append(event)

    def kinds(self, kind: str) -> list[DemotionEvent]:
        return [e for e in self.events if e.kind == kind]
