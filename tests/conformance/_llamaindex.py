"""LLMs, a retriever and a query engine for the LlamaIndex conformance tests (offline).

``EchoLLM`` answers from what it is sent alone (how many messages, the newest user text),
records every call, and streams its answer word by word, so two runs agree exactly when
the memories under them hand the model the same messages.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
    TextBlock,
)
from llama_index.core.base.response.schema import (
    AsyncStreamingResponse,
    Response,
    StreamingResponse,
)
from llama_index.core.llms import CustomLLM
from llama_index.core.query_engine import CustomQueryEngine
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from pydantic import Field, PrivateAttr

__all__ = ["EchoLLM", "FixedRetriever", "EchoQueryEngine", "pairs"]


def pairs(messages: Sequence[ChatMessage]) -> list[tuple[str, str]]:
    """``(role, text blocks)`` of each message (images and tool blocks left out)."""
    return [
        (str(m.role.value), "\n".join(b.text for b in m.blocks if isinstance(b, TextBlock)))
        for m in messages
    ]


class EchoLLM(CustomLLM):
    """Replies ``"<n> seen; re: <newest user text>"``; completions say ``"condensed: ..."``."""

    chats: list[list[tuple[str, str]]] = Field(default_factory=list)
    prompts: list[str] = Field(default_factory=list)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(context_window=100_000, num_output=256, is_chat_model=True)

    def _reply(self, messages: Sequence[ChatMessage]) -> str:
        with self._lock:
            self.chats.append(pairs(messages))
        user = next((t for r, t in reversed(pairs(messages)) if r == "user"), "")
        return f"{len(messages)} seen; re: {user.splitlines()[-1] if user else ''}"

    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        text = self._reply(messages)
        return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text))

    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        words = self._reply(messages).split(" ")

        def gen() -> ChatResponseGen:
            text = ""
            for i, word in enumerate(words):
                delta = word if i == 0 else " " + word
                text += delta
                message = ChatMessage(role=MessageRole.ASSISTANT, content=text)
                yield ChatResponse(message=message, delta=delta)

        return gen()

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        with self._lock:
            self.prompts.append(prompt)
        return CompletionResponse(text="condensed: " + prompt.strip().splitlines()[-1][-60:])

    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        response = self.complete(prompt, formatted=formatted)

        def gen() -> CompletionResponseGen:
            yield CompletionResponse(text=response.text, delta=response.text)

        return gen()


class FixedRetriever(BaseRetriever):
    """Retrieves one fixed node, whatever the query."""

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [NodeWithScore(node=TextNode(text="Tides follow the moon."), score=1.0)]


class EchoQueryEngine(CustomQueryEngine):
    """Answers ``"answer to <query>"`` (CondenseQuestionChatEngine needs a query engine)."""

    streaming: bool = False

    def custom_query(self, query_str: str) -> Response | StreamingResponse:
        answer = f"answer to {query_str}"
        if not self.streaming:
            return Response(response=answer)
        return StreamingResponse(response_gen=iter(answer.split(" ")))

    async def acustom_query(self, query_str: str) -> Response | AsyncStreamingResponse:
        answer = f"answer to {query_str}"
        if not self.streaming:
            return Response(response=answer)

        async def gen() -> AsyncIterator[str]:
            for word in answer.split(" "):
                yield word

        return AsyncStreamingResponse(response_gen=gen())
