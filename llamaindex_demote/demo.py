"""The LlamaIndex half of ``demote demo``: an offline LLM and a chat store kept in a file.

Registered in the ``demote.demo`` entry point group (a
:class:`~demote.cli.demo_parts.DemoHalf`), so the core never imports LlamaIndex. The LLM
reports itself as function-calling, so it also drives a ``FunctionAgent``; it never calls
a tool, it answers from what the memory gave it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

try:
    from llama_index.core.base.llms.types import ChatMessage
    from llama_index.core.bridge.pydantic import PrivateAttr
    from llama_index.core.llms.mock import MockFunctionCallingLLM
    from llama_index.core.storage.chat_store import SimpleChatStore
except ImportError as exc:  # pragma: no cover - depends on the environment
    from demote.errors import MissingExtraError

    raise MissingExtraError("llama-index-core", "llamaindex") from exc

from demote.cli.demo_parts import LLAMAINDEX_ID, CallLog, PartResult, finish, progress_bar
from demote.cli.offline import SYSTEM_PROMPT, OfflineResponder
from demote.engine import Demoter
from demote.errors import StoreError
from llamaindex_demote.messages import core_role, text_of

if TYPE_CHECKING:
    from demote.cli.demo_parts import CountingHook, DemoOptions, Probe

__all__ = ["JSONLChatStore", "OfflineLLM", "pairs", "play", "preflight"]

#: Observes one model call: ``(prompt as (role, text) pairs)``.
PromptObserver = Callable[[list[tuple[str, str]]], None]


def pairs(messages: Sequence[ChatMessage]) -> list[tuple[str, str]]:
    """LlamaIndex messages as ``(role, text)`` pairs in the core's role names."""
    return [(core_role(m), text_of(m)) for m in messages]


class OfflineLLM(MockFunctionCallingLLM):
    """A LlamaIndex LLM that answers only from the messages it is given.

    It wraps an :class:`~demote.cli.offline.OfflineResponder` (recorded replies, else the most
    relevant line of its prompt, quoted). It is built on LlamaIndex's own
    ``MockFunctionCallingLLM``, so chat engines and ``FunctionAgent`` both accept it.

    Example::

        llm = OfflineLLM(OfflineResponder())
        engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)

    Args:
        responder: Produces the replies.
        observe: Called with each prompt, as ``(role, text)`` pairs.
    """

    _responder: OfflineResponder = PrivateAttr()
    _observe: PromptObserver | None = PrivateAttr(default=None)

    def __init__(self, responder: OfflineResponder, observe: PromptObserver | None = None) -> None:
        super().__init__(is_chat_model=True)
        self._responder = responder
        self._observe = observe
        self.response_generator = self._respond

    @classmethod
    def class_name(cls) -> str:
        """The name LlamaIndex serializes this LLM under."""
        return "DemoteOfflineLLM"

    @property
    def responder(self) -> OfflineResponder:
        """The responder behind this LLM."""
        return self._responder

    def _respond(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        prompt = pairs(messages)
        if self._observe is not None:
            self._observe(prompt)
        return ChatMessage(role="assistant", content=self._responder.reply(prompt))


class JSONLChatStore(SimpleChatStore):
    """A ``SimpleChatStore`` kept in a JSONL file: appends cost one line each.

    Each line is ``{"key": ..., "message": ...}``; replacing or deleting messages rewrites
    the file. (``SimpleChatStore.persist`` is not used: with pydantic 2.14 its serializer
    fails on ``ChatMessage``.)

    Args:
        path: The file (read if it exists, created on the first write).
    """

    _path: Path = PrivateAttr()

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self._path = Path(path)
        if not self._path.exists():
            return
        try:
            for line in self._path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    item = json.loads(line)
                    message = ChatMessage.model_validate(item["message"])
                    self.store.setdefault(item["key"], []).append(message)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"cannot read chat store {self._path}: {exc}") from exc

    @staticmethod
    def _line(key: str, message: ChatMessage) -> str:
        data = {"key": key, "message": message.model_dump(mode="json")}
        return json.dumps(data, ensure_ascii=False) + "\n"

    def _rewrite(self) -> None:
        lines = [self._line(k, m) for k, ms in self.store.items() for m in ms]
        self._path.write_text("".join(lines), encoding="utf-8")

    def add_message(self, key: str, message: ChatMessage, idx: int | None = None) -> None:
        """Add a message (appended to the file; an insert rewrites it)."""
        super().add_message(key, message, idx)
        if idx is None:
            with self._path.open("a", encoding="utf-8") as f:
                f.write(self._line(key, message))
        else:
            self._rewrite()

    def set_messages(self, key: str, messages: list[ChatMessage]) -> None:
        """Replace a key's messages."""
        super().set_messages(key, messages)
        self._rewrite()

    def delete_messages(self, key: str) -> list[ChatMessage] | None:
        """Delete a key's messages."""
        out = super().delete_messages(key)
        self._rewrite()
        return out

    def delete_message(self, key: str, idx: int) -> ChatMessage | None:
        """Delete one message."""
        out = super().delete_message(key, idx)
        self._rewrite()
        return out

    def delete_last_message(self, key: str) -> ChatMessage | None:
        """Delete a key's last message."""
        out = super().delete_last_message(key)
        self._rewrite()
        return out


def preflight(options: DemoOptions) -> None:
    """Check what this half needs before the demo creates anything.

    Importing this module already checked ``llama-index-core``; the LlamaIndex half always
    uses the offline LLM (``--model`` is for the LangChain half), so nothing else is needed.
    """


def play(
    demoter: Demoter,
    hook: CountingHook,
    turns: Sequence[tuple[str, str]],
    probe: Probe,
    options: DemoOptions,
    err: IO[str],
) -> PartResult:
    """Play ``turns`` and the probe through a ``SimpleChatEngine`` with DemotingMemory."""
    from llama_index.core.chat_engine import SimpleChatEngine

    from llamaindex_demote.memory import DemotingMemory

    started = time.perf_counter()
    log = CallLog(demoter.tokens)
    llm = OfflineLLM(OfflineResponder(turns), observe=log)
    store = JSONLChatStore(options.directory / "llamaindex-chats.jsonl")
    memory = DemotingMemory.from_defaults(
        demoter=demoter,
        chat_store=store,
        chat_store_key=LLAMAINDEX_ID,
        recall=hook.archive,
        recall_k=3,
        # The demo shows recall at work: a larger budget than the default share of its
        # small limit (priced for cached chats: see docs/request.md).
        recall_budget_tokens=200,
    )
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory, system_prompt=SYSTEM_PROMPT)
    with progress_bar(options.progress, err, len(turns), "LlamaIndex") as bar:
        for user, _ in turns:
            if demoter.state_of(LLAMAINDEX_ID).window_start > 0:
                log.mark_full()
            engine.chat(user)
            bar.update()
    answer = engine.chat(probe.question)
    demoter.drain(timeout=30)
    part = PartResult("LlamaIndex", turns=len(turns), log=log, answer=str(answer))
    part.history = len(store.get_messages(LLAMAINDEX_ID))
    part.recalled = log.recalled()
    return finish(part, hook, LLAMAINDEX_ID, started)
