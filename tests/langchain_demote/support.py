"""Test support for the LangChain adapter: a file-backed history, drivers, a fake model."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.chat_history import BaseChatMessageHistory, InMemoryChatMessageHistory
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    messages_from_dict,
    messages_to_dict,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field

from demote import Demoter, SlidingWindow, StateStore
from demote.engine import PROGRESS_PREFIX
from demote.erase import EraseReport
from langchain_demote import DemotingChatMessageHistory
from langchain_demote.messages import message_role, message_text
from tests.conformance.driver import Flavour, Pair


class FileChatMessageHistory(BaseChatMessageHistory):
    """A persistent inner store: the whole history as JSON in one file, no async methods."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        if not self.path.exists():
            return []
        return messages_from_dict(json.loads(self.path.read_text()))

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        data = messages_to_dict([*self.messages, *messages])
        self.path.write_text(json.dumps(data))

    def clear(self) -> None:
        self.path.write_text("[]")


def to_pairs(messages: Sequence[BaseMessage]) -> list[Pair]:
    return [(message_role(m), message_text(m)) for m in messages]


def from_pair(role: str, text: str) -> BaseMessage:
    kinds: dict[str, type[BaseMessage]] = {
        "system": SystemMessage,
        "user": HumanMessage,
        "assistant": AIMessage,
    }
    return kinds[role](content=text)


def tool_exchange(user: str, call_ids: list[str], answer: str) -> list[BaseMessage]:
    calls = [{"name": "lookup", "args": {"q": user}, "id": cid} for cid in call_ids]
    return [
        HumanMessage(user),
        AIMessage("", tool_calls=calls),
        *(ToolMessage(f"result of {cid}", tool_call_id=cid) for cid in call_ids),
        AIMessage(answer),
    ]


class LangChainDriver:
    """The conformance driver over one ``DemotingChatMessageHistory``."""

    def __init__(self, history: DemotingChatMessageHistory, flavour: Flavour) -> None:
        self.history = history
        self.demoter = history.demoter
        self.conversation_id = history.conversation_id
        self.flavour = flavour

    def _add(self, messages: list[BaseMessage]) -> None:
        if self.flavour == "sync":
            self.history.add_messages(messages)
        else:
            asyncio.run(self.history.aadd_messages(messages))

    def add(self, pairs: list[Pair]) -> None:
        self._add([from_pair(r, t) for r, t in pairs])

    def add_tool_exchange(self, user: str, call_ids: list[str], answer: str) -> None:
        self._add(tool_exchange(user, call_ids, answer))

    def window(self) -> list[Pair]:
        if self.flavour == "sync":
            return to_pairs(self.history.messages)
        return to_pairs(asyncio.run(self.history.aget_messages()))

    def all(self) -> list[Pair]:
        if self.flavour == "sync":
            return to_pairs(self.history.all_messages)
        return to_pairs(asyncio.run(self.history.aget_all_messages()))

    def clear(self) -> None:
        if self.flavour == "sync":
            self.history.clear()
        else:
            asyncio.run(self.history.aclear())

    def erase(self, *, inner: bool = True) -> EraseReport:
        if self.flavour == "sync":
            return self.history.erase(inner=inner)
        return asyncio.run(self.history.aerase(inner=inner))


def inner_for(conversation_id: object, persist: Path | None) -> BaseChatMessageHistory:
    if persist is None:
        return InMemoryChatMessageHistory()
    persist.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha256(repr(conversation_id).encode()).hexdigest()[:16]
    return FileChatMessageHistory(persist / f"{name}.json")


def make_langchain_driver(
    policy: SlidingWindow,
    hook: object,
    state: StateStore,
    conversation_id: str,
    *,
    flavour: Flavour,
    persist: Path | None = None,
) -> LangChainDriver:
    demoter = Demoter(policy, hook, state=state, on_hook_error="raise")
    inner = inner_for(conversation_id, persist)
    return LangChainDriver(DemotingChatMessageHistory(inner, demoter, conversation_id), flavour)


class RecordingChatModel(GenericFakeChatModel):
    """A fake chat model that records every list of messages it is given."""

    messages: Iterator[AIMessage | str] = Field(
        default_factory=lambda: (f"reply {i}: " + "ok " * (i % 7) for i in itertools.count())
    )
    seen: list[list[BaseMessage]] = Field(default_factory=list)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.seen.append(list(messages))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


class ScriptedToolModel(BaseChatModel):
    """A chat model for agent tests that decides its reply from what it is sent.

    Every list of messages it receives is recorded in ``calls`` (under a lock: a tool
    node may call it from several threads); ``bind_tools`` returns it as it is. A
    subclass writes :meth:`reply`, given the messages and where the newest human message
    is.
    """

    calls: list[list[BaseMessage]] = Field(default_factory=list)
    lock: Any = Field(default_factory=threading.Lock)

    @property
    def _llm_type(self) -> str:
        return "scripted-tool-test"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedToolModel:
        return self

    def reply(self, messages: list[BaseMessage], last_human: int) -> AIMessage:
        raise NotImplementedError

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        with self.lock:
            self.calls.append(list(messages))
        last = (
            max(
                i
                for i, m in enumerate(messages)
                if isinstance(m, HumanMessage) and not message_text(m).startswith(PROGRESS_PREFIX)
            )
            if any(isinstance(m, HumanMessage) for m in messages)
            else -1
        )
        return ChatResult(generations=[ChatGeneration(message=self.reply(messages, last))])


def record_windows(middleware: Any) -> list[dict[str, Any]]:
    """Spy on ``middleware``: the ``demote`` metadata of every request it prepares, in order."""
    windows: list[dict[str, Any]] = []
    original = middleware._prepare

    def spying(request: Any) -> Any:
        prepared = yield from original(request)
        windows.append(prepared.metadata["demote"] if prepared.metadata else {})
        return prepared

    middleware._prepare = spying
    return windows
