"""Test support for the LlamaIndex adapter: drivers, a tool-calling mock LLM, helpers."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock, ToolCallBlock
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.storage.chat_store import BaseChatStore, SimpleChatStore

from demote import Demoter, SlidingWindow, StateStore
from demote.erase import EraseReport
from llamaindex_demote import DemotingMemory, from_core
from llamaindex_demote.messages import core_role, text_of
from tests.conformance.driver import Flavour, Pair


def to_pairs(messages: Sequence[ChatMessage]) -> list[Pair]:
    return [(core_role(m), text_of(m)) for m in messages]


def tool_exchange(user: str, call_ids: list[str], answer: str) -> list[ChatMessage]:
    calls = [
        ToolCallBlock(tool_call_id=c, tool_name="lookup", tool_kwargs={"q": user}) for c in call_ids
    ]
    return [
        from_core("user", user),
        ChatMessage(role=MessageRole.ASSISTANT, blocks=calls),
        *(
            ChatMessage(
                role=MessageRole.TOOL,
                blocks=[TextBlock(text=f"result of {c}")],
                additional_kwargs={"tool_call_id": c},
            )
            for c in call_ids
        ),
        from_core("assistant", answer),
    ]


class FileChatStore(BaseChatStore):
    """A persistent chat store: every key's messages as JSON in one file.

    ``SimpleChatStore.persist`` cannot be used: with pydantic 2.14 its ``WrapSerializer``
    (``handler(chat_message, info)``) raises ``PydanticSerializationError`` (see
    ``test_llamaindex_persist.py``), so this store serializes each message itself.
    """

    path: Path

    def _load(self) -> dict[str, list[ChatMessage]]:
        if not self.path.exists():
            return {}
        data = json.loads(self.path.read_text())
        return {k: [ChatMessage.model_validate(m) for m in v] for k, v in data.items()}

    def _save(self, data: dict[str, list[ChatMessage]]) -> None:
        dumped = {k: [m.model_dump(mode="json") for m in v] for k, v in data.items()}
        self.path.write_text(json.dumps(dumped))

    def set_messages(self, key: str, messages: list[ChatMessage]) -> None:
        data = self._load()
        data[key] = list(messages)
        self._save(data)

    def get_messages(self, key: str) -> list[ChatMessage]:
        return self._load().get(key, [])

    def add_message(self, key: str, message: ChatMessage) -> None:
        data = self._load()
        data.setdefault(key, []).append(message)
        self._save(data)

    def delete_messages(self, key: str) -> list[ChatMessage] | None:
        data = self._load()
        gone = data.pop(key, None)
        self._save(data)
        return gone

    def delete_message(self, key: str, idx: int) -> ChatMessage | None:
        data = self._load()
        if idx >= len(data.get(key, [])):
            return None
        gone = data[key].pop(idx)
        self._save(data)
        return gone

    def delete_last_message(self, key: str) -> ChatMessage | None:
        data = self._load()
        if not data.get(key):
            return None
        gone = data[key].pop()
        self._save(data)
        return gone

    def get_keys(self) -> list[str]:
        return list(self._load())


class LlamaIndexDriver:
    """The conformance driver over one ``DemotingMemory``."""

    def __init__(self, memory: DemotingMemory, flavour: Flavour) -> None:
        self.memory = memory
        self.demoter = memory.demoter
        self.conversation_id = memory.chat_store_key
        self.flavour = flavour

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self.flavour == "sync":
            result = getattr(self.memory, name)(*args, **kwargs)
        else:
            result = asyncio.run(getattr(self.memory, "a" + name)(*args, **kwargs))
        return result

    def add(self, pairs: list[Pair]) -> None:
        self._call("put_messages", [from_core(r, t) for r, t in pairs])

    def add_tool_exchange(self, user: str, call_ids: list[str], answer: str) -> None:
        self._call("put_messages", tool_exchange(user, call_ids, answer))

    def window(self) -> list[Pair]:
        return to_pairs(self._call("get"))

    def all(self) -> list[Pair]:
        return to_pairs(self._call("get_all"))

    def clear(self) -> None:
        self._call("reset")

    def erase(self, *, inner: bool = True) -> EraseReport:
        report: EraseReport = self._call("erase", inner=inner)
        return report


def make_llamaindex_driver(
    policy: SlidingWindow,
    hook: object,
    state: StateStore,
    conversation_id: str,
    *,
    flavour: Flavour,
    persist: Path | None = None,
) -> LlamaIndexDriver:
    demoter = Demoter(policy, hook, state=state, on_hook_error="raise")
    store: BaseChatStore = SimpleChatStore()
    if persist is not None:
        persist.mkdir(parents=True, exist_ok=True)
        name = hashlib.sha256(repr(conversation_id).encode()).hexdigest()[:16]
        store = FileChatStore(path=persist / f"{name}.json")
    memory = DemotingMemory.from_defaults(
        demoter=demoter, chat_store=store, chat_store_key=conversation_id
    )
    return LlamaIndexDriver(memory, flavour)


def tool_calling_llm(seen: list[list[ChatMessage]] | None = None) -> MockFunctionCallingLLM:
    """A function-calling mock: a user turn gets one tool call, a tool result an answer.

    ``seen`` (if given) receives every list of messages the model is sent.
    """
    counter = itertools.count()

    def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        if seen is not None:
            seen.append(list(messages))
        last = messages[-1]
        if last.role == MessageRole.TOOL:
            return from_core("assistant", f"the tool said {text_of(last)}")
        n = next(counter)
        call = ToolCallBlock(
            tool_call_id=f"call-{n}", tool_name="add", tool_kwargs={"a": n, "b": 1}
        )
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=[call])

    return MockFunctionCallingLLM(response_generator=respond, is_chat_model=True)
