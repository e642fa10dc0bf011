"""``DemotingChatMessageHistory``: a bounded window over any LangChain chat history.

The inner ``BaseChatMessageHistory`` keeps the full history; this wrapper answers reads
with the active window (pinned system messages, the running summary, the kept messages)
from :meth:`demote.Demoter.load`, which demotes what fell out of it to the demoter's hook.
Writes and clears go to the inner store (clearing resets the demotion state too).
A state store that fails gives a degraded window (see :attr:`demote.Window.degraded`), a
capture that fails leaves the turn uncaptured (:mod:`langchain_demote._capturing`): either
is reported as a ``degraded`` event, never raised into the chain.
``erase`` goes further: the conversation leaves the long tail as well (every tier behind
the demoter's hook, and the capture), and by default the inner store (see
:mod:`demote.erase`).

``RunnableWithMessageHistory`` reads a history once at the start of a turn and, for list
input without ``history_messages_key``, once more at the end, slicing its input by the
length of the first read. So each instance remembers its last window, keyed on the inner
store's length and last message: the window changes only when messages are added.

Agents and custom LangGraph loops that read :attr:`~DemotingChatMessageHistory.messages`
before every model call get a window cut at every read: inside one long turn it starts at
a step boundary and keeps the turn's opener, and old tool results may be sent as
placeholders (:func:`render_window` says how the window becomes messages). Give
``reserved=`` the tokens of what the loop sends besides the messages (system prompt, tool
definitions) so the window leaves room for them.

What a read did (demoted, delivered, failed to deliver, re-synced) is dispatched as
LangChain custom events (``"demote.demoted"``, ...) in the run that read the history, such
as ``RunnableWithMessageHistory``'s history step (see :mod:`langchain_demote.callbacks`);
a read outside any run dispatches nothing.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec

from langchain_core.chat_history import BaseChatMessageHistory, InMemoryChatMessageHistory
from langchain_core.messages import BaseMessage

from demote.engine import Demoter, Window, erase_conversation
from demote.erase import EraseReport
from demote.errors import ConfigError, ConversationIdError
from demote.events import DemoteEvent
from demote.flow import Call, Flow, Twin, drive_async, drive_sync
from demote.hooks.base import Capture
from demote.kit import check_message, check_messages, count
from demote.records import MessageRecord
from demote.restarts import check_restarts
from demote.state.base import validate_conversation_id
from demote.window.pairing import UNANSWERED
from langchain_demote._capturing import capture_users, wants_capture
from langchain_demote._rendering import answer_dangling, render_window
from langchain_demote.callbacks import adispatch_events, dispatch_events
from langchain_demote.messages import to_core

__all__ = [
    "UNANSWERED",
    "DemotingChatMessageHistory",
    "answer_dangling",
    "render_window",
    "with_demotion",
]

P = ParamSpec("P")

# The last window: the inner store's length, its last message and that message's
# fingerprint, and the rendered messages.
_Memo = tuple[int, BaseMessage | None, str | None, list[BaseMessage]]


class DemotingChatMessageHistory(BaseChatMessageHistory):
    """A chat history whose ``messages`` are the active window of the conversation.

    Example::

        history = DemotingChatMessageHistory(
            inner=InMemoryChatMessageHistory(), demoter=demoter, conversation_id="user-42"
        )
        history.add_messages([HumanMessage("hi"), AIMessage("hello")])
        history.messages      # the window the model should see
        history.all_messages  # everything, from the inner store

    Args:
        inner: Where the full history lives: any ``BaseChatMessageHistory`` (in memory,
            file, SQL, Redis, ...).
        demoter: The :class:`~demote.Demoter` (policy, hook, state); share one across
            conversations.
        conversation_id: The conversation's id (the session id).
        capture: Optional :class:`~demote.hooks.base.Capture`: each new user message is
            sent to it as a :class:`~demote.records.CapturedTurn` once it is stored.
        reserved: Tokens the caller sends the model besides :attr:`messages` (its
            system prompt, its tools' JSON schemas), counted toward a token window's
            limit (see :meth:`demote.Demoter.load`).

    Raises:
        ConversationIdError: ``conversation_id`` is empty, not a string, or unusable.
        ConfigError: ``inner``, ``demoter``, ``capture`` or ``reserved`` is not what it
            should be.
    """

    def __init__(
        self,
        inner: BaseChatMessageHistory,
        demoter: Demoter,
        conversation_id: str,
        *,
        capture: Capture | None = None,
        reserved: int = 0,
    ) -> None:
        super().__init__()
        self.conversation_id = validate_conversation_id(conversation_id)
        if not isinstance(inner, BaseChatMessageHistory):
            raise ConfigError(f"inner: expected a BaseChatMessageHistory, got {inner!r}")
        if not isinstance(demoter, Demoter):
            raise ConfigError(f"demoter: expected a Demoter, got {demoter!r}")
        if capture is not None and not callable(getattr(capture, "capture", None)):
            raise ConfigError(f"capture: {capture!r} has no capture() method")
        self.inner = inner
        self.demoter = demoter
        durable = not isinstance(inner, InMemoryChatMessageHistory)
        check_restarts(demoter, inner, durable=durable)  # (warns once per process)
        self.capture = capture
        self.reserved = count("reserved", reserved, minimum=0)
        self._memo: _Memo | None = None
        # The message described last and its fingerprint: the engine describes what was
        # appended, so the memo's tail mark is usually known without describing it again.
        self._described: tuple[BaseMessage, str] | None = None
        self._length: int | None = None  # inner store length, when known without a read

    # -- reading ------------------------------------------------------------------------

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The active window as messages (see :func:`render_window`)."""
        raw = self.inner.messages
        hit = self._recall(raw)
        if hit is not None:
            return hit
        window = self.demoter.load(
            self.conversation_id, raw, self._describe, reserved=self.reserved
        )
        if window.events:
            dispatch_events(window.events)
        return self._remember(raw, window)

    async def aget_messages(self) -> list[BaseMessage]:
        """Async :attr:`messages`: awaits the inner store and the engine's async path."""
        raw = await self.inner.aget_messages()
        hit = self._recall(raw)
        if hit is not None:
            return hit
        window = await self.demoter.aload(
            self.conversation_id, raw, self._describe, reserved=self.reserved
        )
        if window.events:
            await adispatch_events(window.events)
        return self._remember(raw, window)

    @property
    def all_messages(self) -> list[BaseMessage]:
        """The full history, as the inner store holds it."""
        return list(self.inner.messages)

    async def aget_all_messages(self) -> list[BaseMessage]:
        """Async :attr:`all_messages`."""
        return list(await self.inner.aget_messages())

    def _describe(self, message: BaseMessage) -> MessageRecord:
        record = to_core(message, self.demoter.describe)
        self._described = (message, record.fingerprint)
        return record

    def _tail_mark(self, last: BaseMessage) -> str:
        """The fingerprint of ``last``, described again only if it was not the last one."""
        described = self._described
        if described is not None and described[0] is last:
            return described[1]
        return self._describe(last).fingerprint

    def _recall(self, raw: Sequence[BaseMessage]) -> list[BaseMessage] | None:
        """The memo's window, if ``raw`` is the history it was made for (see the module doc).

        The same length and the same last message: the same object (the engine, too,
        knows a message it has described by identity) or one with the same fingerprint
        (a store that builds new objects at every read).
        """
        memo = self._memo
        n = self._length = len(raw)
        if memo is None or memo[0] != n:
            return None
        if n and not (raw[-1] is memo[1] or self._tail_mark(raw[-1]) == memo[2]):
            return None
        return list(memo[3])

    def _remember(
        self, raw: Sequence[BaseMessage], window: Window[BaseMessage]
    ) -> list[BaseMessage]:
        out = render_window(window)
        last = raw[-1] if raw else None
        self._memo = (len(raw), last, None if last is None else self._tail_mark(last), out)
        return list(out)

    # -- writing ------------------------------------------------------------------------

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append ``messages`` to the inner store (then capture the new user turns).

        Raises:
            MessageTypeError: ``messages`` is not a sequence of ``BaseMessage`` (a string,
                ``None`` among them, ...); nothing is stored.
        """
        messages = check_messages(messages, BaseMessage, "messages")
        base = self._base(messages)
        if base is None and wants_capture(self.capture, messages):
            base = len(self.inner.messages)
        self.inner.add_messages(messages)
        failed = self._after_add(messages, base)
        if failed:
            dispatch_events(failed)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Async :meth:`add_messages`: awaits the inner store's ``aadd_messages``."""
        messages = check_messages(messages, BaseMessage, "messages")
        base = self._base(messages)
        if base is None and wants_capture(self.capture, messages):
            base = len(await self.inner.aget_messages())
        await self.inner.aadd_messages(messages)
        failed = self._after_add(messages, base)
        if failed:
            await adispatch_events(failed)

    def add_message(self, message: BaseMessage) -> None:
        """Append one message (see :meth:`add_messages`)."""
        self.add_messages([check_message(message, BaseMessage, "message")])

    def _base(self, messages: Sequence[BaseMessage]) -> int | None:
        return self._length if wants_capture(self.capture, messages) else None

    def _after_add(self, messages: list[BaseMessage], base: int | None) -> list[DemoteEvent]:
        """Count the appended messages and capture the user turns.

        Returns the ``degraded`` events of captures that failed (see
        :func:`~langchain_demote._capturing.capture_users`).
        """
        if self._length is not None:
            self._length += len(messages)
        if self.capture is None or base is None:
            return []
        cid = self.conversation_id
        return capture_users(self.capture, self.demoter, cid, base, messages, self._describe)

    # -- clearing -----------------------------------------------------------------------

    def clear(self) -> None:
        """Clear the inner store, then the conversation's demotion state.

        What the long tail already holds stays there (LangChain's meaning of clearing a
        history); :meth:`erase` removes that too.
        """
        self.inner.clear()
        self._reset()

    async def aclear(self) -> None:
        """Async :meth:`clear`: awaits the inner store's ``aclear`` and the engine's."""
        await self.inner.aclear()
        await self.demoter.aclear(self.conversation_id)
        self._forget_window()

    def _reset(self) -> None:
        self.demoter.clear(self.conversation_id)
        self._forget_window()

    def _forget_window(self, length: int | None = 0) -> None:
        self._memo = None
        self._length = length

    # -- erasing ------------------------------------------------------------------------

    def erase(self, *, inner: bool = True, wait: float | None = None) -> EraseReport:
        """Forget the conversation everywhere it went: unlike :meth:`clear`, the long tail too.

        The inner store is emptied first (``inner=True``), then
        :meth:`demote.Demoter.erase` deletes the demotion state and asks every tier behind
        the hook (archive, outbox, mem0, vector store) to delete the conversation, with the
        dedup keys of the history for tiers that delete by id; the ``capture`` is erased
        after them (see :mod:`demote.erase`).

        Args:
            inner: Also empty the inner store. With ``False`` it keeps the history, and
                the next read demotes it again as a new conversation: use it when the
                inner store is deleted by other means.
            wait: Seconds to wait for a delivery in flight (see
                :meth:`demote.Demoter.erase`).

        Returns:
            What each tier did, and how many messages left the inner store
            (:attr:`~demote.erase.EraseReport.complete` says whether every tier erased).
        """
        report = drive_sync(self._erase(inner, wait))
        self._forget_window(0 if inner else None)
        return report

    async def aerase(self, *, inner: bool = True, wait: float | None = None) -> EraseReport:
        """Async :meth:`erase`: awaits the inner store, the engine and the tiers."""
        report = await drive_async(self._erase(inner, wait))
        self._forget_window(0 if inner else None)
        return report

    def _erase(self, inner: bool, wait: float | None) -> Flow[EraseReport]:
        return erase_conversation(
            self.demoter,
            self.conversation_id,
            self._describe,
            read=Twin(self._held, self._aheld),
            clear=Call(self.inner, "clear", (), {}) if inner else None,
            inner=(self.inner, "history"),
            also=() if self.capture is None else (self.capture,),
            wait=wait,
        )

    def _held(self) -> list[tuple[int, BaseMessage]]:
        return list(enumerate(self.inner.messages))

    async def _aheld(self) -> list[tuple[int, BaseMessage]]:
        return list(enumerate(await self.inner.aget_messages()))


def _default_conversation_id(signature: inspect.Signature, args: Any, kwargs: Any) -> str:
    """The conversation id of a factory call (the mapping :func:`with_demotion` documents).

    The core refuses empty ids, so an empty session id becomes its JSON text, ``'""'``,
    like every other argument that is not one non-empty string; JSON forms never collide
    with each other.
    """
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    values = dict(bound.arguments)
    if len(values) == 1:
        (only,) = values.values()
        if isinstance(only, str) and only:
            return only
        return json.dumps(only, sort_keys=True, default=str)
    return json.dumps(values, sort_keys=True, separators=(",", ":"), default=str)


def with_demotion(
    factory: Callable[P, BaseChatMessageHistory],
    demoter: Demoter,
    *,
    capture: Capture | None = None,
    conversation_id: Callable[P, str] | None = None,
) -> Callable[P, DemotingChatMessageHistory]:
    """Wrap a ``get_session_history`` factory so every history it makes is demoting.

    The wrapper has the factory's signature (``RunnableWithMessageHistory`` inspects it).
    By default each call names its conversation by the factory's arguments:

    - one non-empty string argument (``session_id="user-42"``): that string, as is;
    - anything else, as JSON: one other argument is its JSON text (``session_id=""`` ->
      ``'""'``, ``42`` -> ``'42'``); several (``history_factory_config`` with ``user_id``
      and ``conversation_id``) make one JSON object with sorted keys and no spaces
      (``'{"conversation_id":"c1","user_id":"u1"}'``); none is ``'{}'``.

    The same arguments always name the same conversation. ``conversation_id=`` chooses
    instead: it is called with the factory's own arguments.

    Example::

        chain = RunnableWithMessageHistory(
            runnable, with_demotion(get_session_history, demoter),
            input_messages_key="question", history_messages_key="history",
        )
        # history_factory_config with user_id and conversation_id: name by the latter
        with_demotion(get_history, demoter, conversation_id=lambda user_id, conversation_id:
                      conversation_id)

    Args:
        factory: The existing ``get_session_history``.
        demoter: The :class:`~demote.Demoter` all conversations share.
        capture: Passed to every :class:`DemotingChatMessageHistory`.
        conversation_id: Names the conversation from the factory's arguments (called
            exactly as the factory is); must return a non-empty string.

    Returns:
        A factory with the same parameters that returns
        :class:`DemotingChatMessageHistory` objects around the factory's histories.

    Raises:
        ConfigError: ``factory`` or ``conversation_id`` is not callable, ``demoter`` is
            not a Demoter.
        ConversationIdError: (when called) ``conversation_id(...)`` returned an empty
            string or not a string.
    """
    if not callable(factory):
        raise ConfigError(f"factory: {factory!r} is not callable")
    if not isinstance(demoter, Demoter):
        raise ConfigError(f"demoter: expected a Demoter, got {demoter!r}")
    if conversation_id is not None and not callable(conversation_id):
        raise ConfigError(f"conversation_id: {conversation_id!r} is not callable")
    try:
        signature = inspect.signature(factory)
    except (ValueError, TypeError) as exc:  # a builtin without one (dict, ...)
        raise ConfigError(f"factory: {factory!r:.60} has no signature to mirror: {exc}") from None

    def name(*args: P.args, **kwargs: P.kwargs) -> str:
        if conversation_id is None:
            return _default_conversation_id(signature, args, kwargs)
        cid = conversation_id(*args, **kwargs)
        try:
            return validate_conversation_id(cid)
        except ConversationIdError as exc:
            raise ConversationIdError(f"with_demotion(conversation_id=...): {exc}") from exc

    @functools.wraps(factory)
    def get_session_history(*args: P.args, **kwargs: P.kwargs) -> DemotingChatMessageHistory:
        cid = name(*args, **kwargs)
        inner = factory(*args, **kwargs)
        if not isinstance(inner, BaseChatMessageHistory):
            raise ConfigError(
                f"factory: returned {type(inner).__name__}, not a BaseChatMessageHistory (inner)"
            )
        return DemotingChatMessageHistory(inner, demoter, cid, capture=capture)

    get_session_history.__signature__ = signature.replace(  # type: ignore[attr-defined]
        return_annotation=DemotingChatMessageHistory
    )
    return get_session_history
