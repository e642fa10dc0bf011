"""Recall on a model call: what ``DemotingMiddleware`` adds to the window when it has ``recall=``.

The query is the newest human message the model is sent (the question); the recall goes
right after it, as one message of the ``recall_role`` the middleware was given. Where, how
much, and when a search is done again are the same for every adapter
(:func:`demote.request.recall_flow`): twice ``recall_k`` hits are asked for (those the
window shows are dropped), what is left is fitted into the recall's token budget as the
message is sent (:meth:`Recaller.tokens`, the window's own count), and a question gets
one search until the window is cut (the :class:`~demote.request.RecallMemo`). A search
that fails gives the window alone: a ``degraded`` event says so, and the agent never sees
the error.

:func:`recall_for` is a step of the middleware's preparation
(:mod:`langchain_demote._request`), written once for sync and async model calls: it
yields the search, which ``drive_sync`` and ``drive_async`` run. It returns the recall
and its events, which the middleware reports with the load's in the model node's run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from demote.engine import Demoter, Window
from demote.events import DemoteEvent
from demote.flow import Flow
from demote.hooks.base import Recall
from demote.records import MessageRecord
from demote.request import Recalling, RecallMemo, RecallSettings, recall_flow
from demote.window.policy import SlidingWindow
from langchain_demote.messages import message_role, message_text

__all__ = ["Recaller", "is_user", "recall_for", "recaller"]


class Recaller:
    """The middleware's recall: its settings, its memo, and the count of its message."""

    __slots__ = ("_describe", "memo", "settings")

    def __init__(
        self, settings: RecallSettings, describe: Callable[[BaseMessage], MessageRecord]
    ) -> None:
        self.settings = settings
        self.memo = RecallMemo()
        self._describe = describe

    def tokens(self, text: str) -> int:
        """What the recall message with ``text`` costs as sent (the window's own count)."""
        system = self.settings.role == "system"
        return self._describe(SystemMessage(text) if system else HumanMessage(text)).tokens


def recaller(
    recall: Recall | None,
    recall_k: int,
    recall_budget_tokens: int | None,
    recall_role: Literal["user", "human", "system"],
    policy: SlidingWindow,
    describe: Callable[[BaseMessage], MessageRecord],
) -> Recaller | None:
    """The middleware's :class:`Recaller` for its ``recall*`` options (``None``: no recall).

    Raises:
        ConfigError: An option is invalid.
    """
    settings = RecallSettings.make(recall, recall_k, recall_budget_tokens, recall_role, policy)
    return None if settings is None else Recaller(settings, describe)


def is_user(message: BaseMessage) -> bool:
    """Is ``message`` a user message (as the core reads its role)?"""
    return message_role(message) == "user"


def _role_text(message: BaseMessage) -> tuple[str, str]:
    return message_role(message), message_text(message)


def recall_for(
    recall: Recaller | None, demoter: Demoter, window: Window[BaseMessage]
) -> Flow[tuple[Recalling | None, tuple[DemoteEvent, ...]]]:
    """What the recall places in the request for ``window``, and the events to report.

    Without a recall (``None``): nothing, and no events.
    """
    if recall is None:
        return None, ()
    return (
        yield from recall_flow(
            recall.settings,
            demoter,
            window,
            is_user=is_user,
            text_of=message_text,
            key=_role_text,
            count=recall.tokens,
            memo=recall.memo,
        )
    )
