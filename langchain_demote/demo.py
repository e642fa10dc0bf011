"""The LangChain half of ``demote demo``: an offline chat model, a file history, the chain.

Registered in the ``demote.demo`` entry point group (a
:class:`~demote.cli.demo_parts.DemoHalf`), so the core never imports LangChain. Everything
here is ordinary LangChain: an existing ``RunnableWithMessageHistory`` chain gains
demotion only by wrapping its history factory with :func:`langchain_demote.with_demotion`.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

try:
    from langchain_core._api.deprecation import LangChainDeprecationWarning
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        HumanMessage,
        messages_from_dict,
        messages_to_dict,
    )
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.prompt_values import PromptValue
    from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
    from langchain_core.runnables import (
        Runnable,
        RunnableConfig,
        RunnableLambda,
        RunnablePassthrough,
    )
    from langchain_core.runnables.history import RunnableWithMessageHistory
    from pydantic import ConfigDict
except ImportError as exc:  # pragma: no cover - depends on the environment
    from demote.errors import MissingExtraError

    raise MissingExtraError("langchain-core", "langchain") from exc

from demote.cli.demo_parts import (
    LANGCHAIN_ID,
    RECALL_HEADER,
    CallLog,
    PartResult,
    finish,
    progress_bar,
)
from demote.cli.offline import SYSTEM_PROMPT, OfflineResponder
from demote.engine import Demoter
from demote.errors import ConfigError, StoreError
from demote.hooks.base import Recall
from demote.records import Recalled
from langchain_demote.messages import message_role, message_text

if TYPE_CHECKING:
    from demote.cli.demo_parts import CountingHook, DemoOptions, Probe

__all__ = [
    "RECALL_HEADER",
    "JSONLChatMessageHistory",
    "OfflineChatModel",
    "build_chain",
    "pairs",
    "play",
    "preflight",
]


#: Observes one model call: ``(prompt as (role, text) pairs)``.
PromptObserver = Callable[[list[tuple[str, str]]], None]


def pairs(messages: Iterable[BaseMessage]) -> list[tuple[str, str]]:
    """LangChain messages as ``(role, text)`` pairs in the core's role names."""
    return [(message_role(m), message_text(m)) for m in messages]


class OfflineChatModel(BaseChatModel):
    """A LangChain chat model that answers only from its prompt (no network, no key).

    It wraps an :class:`~demote.cli.offline.OfflineResponder`: recorded replies of a replayed
    conversation are said as written; any other question gets the most relevant line of
    the prompt, quoted.

    Example::

        model = OfflineChatModel(responder=OfflineResponder())
        model.invoke([SystemMessage("- user: my locker code is 4512"),
                      HumanMessage("What is my locker code?")]).content
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    responder: OfflineResponder

    @property
    def _llm_type(self) -> str:
        return "demote-offline"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        text = self.responder.reply(pairs(messages))
        return ChatResult(generations=[ChatGeneration(message=AIMessage(text))])


class JSONLChatMessageHistory(BaseChatMessageHistory):
    """A chat history in a JSONL file (one ``messages_to_dict`` item per line).

    The file is read once; appends write one line each, so a long chat costs nothing per
    turn. Use one instance per file at a time.

    Args:
        path: The file (created on the first append).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._messages: list[BaseMessage] = []
        if self.path.exists():
            try:
                lines = self.path.read_text(encoding="utf-8").splitlines()
                items = [json.loads(line) for line in lines if line.strip()]
                self._messages = messages_from_dict(items)
            except (OSError, ValueError, KeyError) as exc:
                raise StoreError(f"cannot read chat history {self.path}: {exc}") from exc

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """Every stored message (a new list)."""
        return list(self._messages)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append ``messages`` to the file and to memory."""
        messages = list(messages)
        with self.path.open("a", encoding="utf-8") as f:
            for item in messages_to_dict(messages):
                f.write(json.dumps(item, ensure_ascii=False) + "\n")
        self._messages.extend(messages)

    def clear(self) -> None:
        """Delete every message (the file is emptied)."""
        self.path.write_text("", encoding="utf-8")
        self._messages = []


def _recall_messages(archive: Recall, k: int, last: list[list[Recalled]]) -> Runnable[Any, Any]:
    def recall(inputs: dict[str, Any], config: RunnableConfig) -> list[BaseMessage]:
        session = config.get("configurable", {}).get("session_id", "")
        hits = archive.search(session, str(inputs["question"]), k) if session else []
        last[:] = [hits]
        if not hits:
            return []
        unique = {(r.role, r.text): r for r in sorted(hits, key=lambda r: -r.index)}
        ordered = sorted(unique.values(), key=lambda r: r.index)
        lines = "\n".join(f"- {r.role}: {r.text}" for r in ordered)
        # A user message after the question, as DemotingMiddleware sends recall: a system
        # message after the conversation began is refused by some providers.
        return [HumanMessage(f"{RECALL_HEADER}\n{lines}")]

    return RunnableLambda(recall)


def build_chain(
    model: Runnable[Any, Any],
    get_session_history: Callable[[str], BaseChatMessageHistory],
    *,
    recall: Recall | None = None,
    recall_k: int = 3,
    observe: PromptObserver | None = None,
    last_recall: list[list[Recalled]] | None = None,
) -> RunnableWithMessageHistory:
    """The demo chain: prompt (system, history, question, recall) | model, with history.

    Args:
        model: Any chat model (the offline one, or ``init_chat_model(...)``).
        get_session_history: The history factory (wrap it with ``with_demotion``).
        recall: Where recalled messages come from (``SQLiteArchive``); none if omitted.
        recall_k: How many recalled messages go into the prompt.
        observe: Called with each prompt, as ``(role, text)`` pairs, before the model.
        last_recall: A list whose only item is set to the latest recall's hits.

    Returns:
        A ``RunnableWithMessageHistory`` taking ``{"question": ...}``.
    """
    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", SYSTEM_PROMPT),
            MessagesPlaceholder("history"),
            ("human", "{question}"),
            MessagesPlaceholder("recall", optional=True),
        ]
    )
    holder: list[list[Recalled]] = last_recall if last_recall is not None else []
    steps: Runnable[Any, Any] = prompt
    if recall is not None:
        steps = RunnablePassthrough.assign(recall=_recall_messages(recall, recall_k, holder))
        steps = steps | prompt
    if observe is not None:
        seen = observe

        def watch(value: PromptValue) -> PromptValue:
            seen(pairs(value.to_messages()))
            return value

        steps = steps | RunnableLambda(watch)
    with warnings.catch_warnings():
        # Deprecated in LangChain 1.x in favour of LangGraph persistence, still widely used:
        # the point of the demo is that an existing chain of this kind gains demotion.
        warnings.simplefilter("ignore", LangChainDeprecationWarning)
        return RunnableWithMessageHistory(
            steps | model,
            get_session_history,
            input_messages_key="question",
            history_messages_key="history",
        )


def _chat_model(options: DemoOptions, responder: OfflineResponder) -> Any:
    if options.model is None:
        return OfflineChatModel(responder=responder)
    try:
        from langchain.chat_models import init_chat_model
    except ImportError as exc:
        raise ConfigError(
            "--model needs the 'langchain' package: pip install 'demote[agents]'"
        ) from exc
    try:
        return init_chat_model(options.model)
    except Exception as exc:  # a missing provider package, an unknown name, no API key
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"--model {options.model!r}: {first}") from exc


def preflight(options: DemoOptions) -> None:
    """Check what this half needs before the demo creates anything: the model.

    Raises:
        ConfigError: ``--model`` names a model that cannot be built here.
    """
    _chat_model(options, OfflineResponder())


def play(
    demoter: Demoter,
    hook: CountingHook,
    turns: Sequence[tuple[str, str]],
    probe: Probe,
    options: DemoOptions,
    err: IO[str],
) -> PartResult:
    """Play ``turns`` and the probe through a ``RunnableWithMessageHistory`` chain."""
    from langchain_demote.history import with_demotion

    started = time.perf_counter()
    responder = OfflineResponder(turns)
    log = CallLog(demoter.tokens)
    histories: dict[str, JSONLChatMessageHistory] = {}

    def get_session_history(session_id: str) -> JSONLChatMessageHistory:
        # The inner store of an existing app: one JSONL file per session.
        if session_id not in histories:
            path = options.directory / "langchain-history.jsonl"
            histories[session_id] = JSONLChatMessageHistory(path)
        return histories[session_id]

    chain = build_chain(
        _chat_model(options, responder),
        with_demotion(get_session_history, demoter),
        recall=hook.archive,
        observe=log,
    )
    config: Any = {"configurable": {"session_id": LANGCHAIN_ID}}
    with progress_bar(options.progress, err, len(turns), "LangChain ") as bar:
        for user, _ in turns:
            if demoter.state_of(LANGCHAIN_ID).window_start > 0:
                log.mark_full()
            chain.invoke({"question": user}, config=config)
            bar.update()
    answer: BaseMessage = chain.invoke({"question": probe.question}, config=config)
    demoter.drain(timeout=30)
    part = PartResult("LangChain", turns=len(turns), log=log, answer=str(answer.content))
    part.history = len(get_session_history(LANGCHAIN_ID).messages)
    part.recalled = log.recalled()
    return finish(part, hook, LANGCHAIN_ID, started)
