"""Chat models for the LangChain conformance tests: deterministic, offline, recording.

``EchoModel`` answers from what it is sent alone (how many messages, the newest human
text), so a run's outputs are the same whatever order concurrent calls take, and differ as
soon as the model is sent a different history. ``ToolLoopModel`` drives ``create_agent``
through parallel tool calls.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.tools import tool
from pydantic import Field, PrivateAttr

__all__ = ["EchoModel", "ToolLoopModel", "add", "contents", "lookup"]


@tool
def lookup(topic: str) -> str:
    """Look a topic up."""
    return f"notes on {topic}"


@tool
def add(a: int, b: int) -> str:
    """Add two numbers."""
    return str(a + b)


def contents(messages: list[BaseMessage]) -> list[tuple[str, str]]:
    """``(type, text)`` of each message (ids differ between runs; content must not)."""
    return [(m.type.removesuffix("Chunk"), m.text) for m in messages]


def _newest_human(messages: list[BaseMessage]) -> str:
    return next((m.text for m in reversed(messages) if isinstance(m, HumanMessage)), "")


class _Recording(BaseChatModel):
    """Records every list of messages it is sent (thread-safe: batch runs in threads)."""

    seen: list[list[BaseMessage]] = Field(default_factory=list)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _record(self, messages: list[BaseMessage]) -> None:
        with self._lock:
            self.seen.append(list(messages))

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        raise NotImplementedError

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self._record(messages)
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages))])


class EchoModel(_Recording):
    """Replies ``"<n> seen; re: <newest human text>"``; streams it word by word."""

    @property
    def _llm_type(self) -> str:
        return "echo-test"

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        return AIMessage(f"{len(messages)} seen; re: {_newest_human(messages)}")

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        self._record(messages)
        words = str(self._reply(messages).content).split(" ")
        for i, word in enumerate(words):
            text = word if i == len(words) - 1 else word + " "
            yield ChatGenerationChunk(message=AIMessageChunk(content=text))


class ToolLoopModel(_Recording):
    """Per human turn: two parallel tool calls, then the answer.

    A turn whose text says ``quick`` is answered at once. Tool-call ids derive from the
    turn's text, so the same conversation always produces the same transcript.
    """

    tool_names: tuple[str, str] = ("lookup", "add")

    @property
    def _llm_type(self) -> str:
        return "tool-loop-test"

    def _reply(self, messages: list[BaseMessage]) -> AIMessage:
        last = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
        human = messages[last].text
        answered = any(isinstance(m, AIMessage) for m in messages[last + 1 :])
        if "quick" in human or answered:
            return AIMessage(f"{len(messages)} seen; answer to {human}")
        tag = hashlib.blake2b(human.encode(), digest_size=4).hexdigest()
        first, second = self.tool_names
        return AIMessage(
            "",
            tool_calls=[
                {"name": first, "args": {"topic": human}, "id": f"{tag}-a", "type": "tool_call"},
                {"name": second, "args": {"a": 2, "b": 3}, "id": f"{tag}-b", "type": "tool_call"},
            ],
        )
