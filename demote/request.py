"""What one model call is sent: the window, and everything demote adds around it.

Theory of operation
-------------------
A load returns a :class:`~demote.engine.result.Window`; what the model is sent is the
*request* built from it. Every adapter builds it here, with :func:`compose`, so every
feature (the note, recall, placeholders, stand-in results) obeys the same three rules:

1. **Valid for every provider.** demote adds only user messages (unless a user asks for
   a system-role recall, see :class:`RecallSettings`), so no system message ever follows
   a non-system one and the first message after the system block is a user message (the
   window starts at a user message, or with the turn's opener). Every call keeps its
   results: recall never goes between them, a call the conversation moved on from gets a
   stand-in result.
2. **Within the limit.** The window is planned with ``reserved`` tokens for what the
   request sends besides the history (system prompt, tools, a chat engine's prefix) and,
   with recall, the recall's budget (:meth:`RecallSettings.reserve`); the recall message
   is fitted into that budget as it is sent, counted by the adapter's own counter
   (:func:`fit_recall`). The note is counted by the planner (it replaces the one the
   state commits).
3. **Cache-stable.** demote never adds to or changes the system block (the pinned system
   messages and the agent's system prompt). The order is::

       pinned system messages        the system block: never changed by demote
       Extra.head                    an adapter's content that never changes (user)
       opener                        when the window starts inside a turn, as stored
       note                          summary or digest, one user message: changes at a cut
       Extra.noted                   content that changes when the long tail is fed
       kept messages                 placeholders, clipped heads, stand-in results
       ... the newest user message   (the question)
       recall                        one user message right after it: changes per turn
       Extra.asked                   content that answers the question (user)
       ... the running turn's steps

   Between cuts the request therefore only grows at its end, except that each turn's
   recall replaces the last turn's, right after the previous question. Within a turn
   the recall is the same at every model call (:class:`RecallMemo`: one search per
   question and window start), so an agent's steps after it keep being read from the
   cache.

Sans-I/O: :func:`recall_flow` yields the search as a :class:`~demote.flow.Call`
(``search`` blocking, ``asearch`` awaited, or ``search`` in a worker thread) and returns
what to place; :func:`compose` is pure. Recall (its settings, search, fitting and memo)
is here; :func:`compose` and what it is handed (:class:`Renderer`, :class:`Recalling`,
:class:`Extra`, :func:`note_text`) are in :mod:`demote._composing`, exported from here.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from demote._composing import Extra, Recalling, Renderer, compose, note_text
from demote._validate import count as _count
from demote.engine import Demoter, Window
from demote.errors import ConfigError
from demote.events import DemoteEvent
from demote.flow import Call, Flow
from demote.recall import Recall
from demote.records import Recalled
from demote.window.policy import SlidingWindow

__all__ = [
    "RECALL_PREFIX",
    "RECALL_SHARE",
    "Extra",
    "Memo",
    "RecallMemo",
    "RecallSettings",
    "Recalling",
    "Renderer",
    "compose",
    "fit_recall",
    "note_text",
    "question_at",
    "question_of",
    "recall_flow",
    "render_recall",
    "visible_hits",
]

T = TypeVar("T")
V = TypeVar("V")

#: How recalled archive messages are introduced to the model (one user message).
RECALL_PREFIX = "Recalled from earlier in this conversation:\n"

#: The share of a token limit recall gets by default (its budget is reserved out of the
#: limit, so the window makes room for it). Small on purpose: the recall message is new in
#: every turn's request, so with prompt caching each of its tokens is written at full
#: price (1.25x with Anthropic's), while the window's are read at a tenth. At 1/72 a
#: cached chat costs at most about 1.1x what it costs without recall (bench section 2r,
#: LoCoMo: 1.07x, with the question's evidence in the request 34% of the time instead of
#: 18%); ``recall_budget_tokens`` buys more recall for more cost (a tenth of the limit:
#: 79%, 1.44x).
RECALL_SHARE = 1 / 72

# How many conversations' recalls a memo keeps (one entry each: the newest question's).
_MEMO_KEPT = 4096


def render_recall(hits: Sequence[Recalled]) -> str:
    """The text of the one message that carries recalled archive messages.

    Args:
        hits: Messages read back from the long tail, in any order.

    Returns:
        :data:`RECALL_PREFIX` then one ``- role: text`` line per message, oldest first
        (a hit without a position, from mem0, after those with one).
    """
    ordered = sorted(hits, key=lambda r: r.index if r.index >= 0 else float("inf"))
    return RECALL_PREFIX + "\n".join(f"- {r.role}: {r.text}" for r in ordered)


def question_at(window: Window[T], is_user: Callable[[T], bool]) -> int | None:
    """Absolute index of the newest user message the model is sent (the opener counts).

    The note and recall are never stored, so they are not among the window's messages.
    """
    messages = window.messages
    for i in range(len(messages) - 1, -1, -1):
        if is_user(messages[i]):
            return window.start + i
    return window.opener_index if window.opener is not None else None


def question_of(
    window: Window[T],
    is_user: Callable[[T], bool],
    text_of: Callable[[T], str],
    query: str | None = None,
) -> tuple[int | None, str] | None:
    """Where the question of a request is, and its text: what recall (and ``Extra.asked``) follow.

    The question is the newest user message the model is sent (:func:`question_at`), or
    ``query`` when the caller has one: its position is then ``None`` unless it is the
    stored last message (a LlamaIndex chat engine's ``input`` is not stored yet: it comes
    after the memory's messages).

    Returns:
        ``(absolute index or None, text)``, or ``None`` without a question (no user
        message, or only blank text).
    """
    at = question_at(window, is_user)
    if query is not None:
        stored = at is not None and at == window.total - 1
        last = window.messages[-1] if window.messages else window.opener
        if not (stored and last is not None and text_of(last) == query):
            at = None  # not stored yet: the question comes after the memory's messages
    else:
        if at is None:
            return None
        message = window.opener if at == window.opener_index else window.messages[at - window.start]
        query = text_of(message)  # type: ignore[arg-type]
    if not query.strip():
        return None
    return at, query


def visible_hits(
    window: Window[T],
    hits: Sequence[Recalled],
    key: Callable[[T], tuple[str, str]],
) -> list[Recalled]:
    """The hits the model does not already see in ``window``, in order.

    A hit with a position is seen when it is pinned, the opener or in the window; a hit
    without one (mem0) when a shown message has its role and text (``key``).
    """
    pinned = len(window.pinned)
    seen: set[tuple[str, str]] | None = None  # only hits without a position need it
    out = []
    for r in hits:
        if r.index >= 0:
            if r.index >= window.start or r.index < pinned or r.index == window.opener_index:
                continue
        else:
            if seen is None:
                shown = [
                    *window.pinned,
                    *([window.opener] if window.opener else []),
                    *window.messages,
                ]
                seen = {key(m) for m in shown}
            if (r.role, r.text) in seen:
                continue
        out.append(r)
    return out


def fit_recall(
    hits: Sequence[Recalled], k: int, budget: int | None, count: Callable[[str], int]
) -> tuple[Recalled, ...]:
    """The best hits, at most ``k``, whose recall message costs at most ``budget`` tokens.

    Greedy in the order given (best first): a hit that would take the message over the
    budget is left out and a later, shorter one may take its place.

    Args:
        hits: Candidates, best first.
        k: How many at most.
        budget: Tokens the recall message may cost as sent, or ``None`` (only ``k``).
        count: The adapter's count of a recall message with a given text (role,
            framing and all, as the provider bills it).
    """
    if budget is None:
        return tuple(hits[:k])
    kept: list[Recalled] = []
    for hit in hits:
        if len(kept) == k:
            break
        if count(render_recall([*kept, hit])) <= budget:
            kept.append(hit)
    return tuple(kept)


@dataclass(frozen=True, slots=True)
class RecallSettings:
    """How an adapter injects recall: validated once, when the adapter is built.

    Attributes:
        recall: The long-tail reader (``search(conversation_id, query, k)``).
        k: How many recalled messages at most.
        budget: Tokens the recall message may cost as sent, or ``None`` (only ``k``
            bounds it: a window counted in messages or turns, unless a budget is given).
        reserve: Tokens the window leaves free for it (the budget, in a token window).
        role: ``"user"`` (the default: valid for every provider, after the question) or
            ``"system"`` (only for providers that take system messages anywhere, such as
            OpenAI's; Anthropic's refuse one after the conversation began).
        asks_budget: The recall's ``search`` takes ``budget_tokens`` (the built-in ones
            do): it is passed the budget, so it can pick shorter hits that fit. A
            custom recall without it is asked for hits only; they are fitted here.
    """

    recall: Recall
    k: int
    budget: int | None
    reserve: int
    role: Literal["user", "system"] = "user"
    asks_budget: bool = False

    def search_options(self) -> dict[str, int]:
        """The keyword arguments of a search (only what the recall takes)."""
        if self.budget is None or not self.asks_budget:
            return {}
        return {"budget_tokens": self.budget}

    @classmethod
    def make(
        cls,
        recall: Recall | None,
        k: int,
        budget_tokens: int | None,
        role: str,
        policy: SlidingWindow,
    ) -> RecallSettings | None:
        """The settings of an adapter's ``recall=`` options, or ``None`` without a recall.

        Args:
            recall: The reader, or ``None``.
            k: ``recall_k``.
            budget_tokens: ``recall_budget_tokens``: ``None`` gives a token window
                :data:`RECALL_SHARE` of its limit (at least 1 token) and a window counted
                in messages or turns no budget.
            role: ``recall_role``: ``"user"`` (``"human"`` is the same) or ``"system"``.
            policy: The demoter's policy (its unit and limit).

        Raises:
            ConfigError: ``recall`` has no ``search``, ``k`` or the budget is not a
                positive int, the budget is not below a token limit, or ``role`` is
                unknown.
        """
        k = _count("recall_k", k)
        if role not in ("user", "human", "system"):
            raise ConfigError(f"recall_role: must be 'user' (or 'human') or 'system', got {role!r}")
        if budget_tokens is not None:
            budget_tokens = _count("recall_budget_tokens", budget_tokens)
        if recall is None:
            return None
        if not callable(getattr(recall, "search", None)):
            raise ConfigError(f"recall: {recall!r:.80} has no search(conversation_id, query, k)")
        tokens = policy.unit == "tokens"
        if budget_tokens is None and tokens:
            budget_tokens = max(1, int(policy.limit * RECALL_SHARE))
        if tokens and budget_tokens is not None and budget_tokens >= policy.limit:
            raise ConfigError(
                f"recall_budget_tokens: {budget_tokens} leaves no room for the window "
                f"under the {policy.limit}-token limit"
            )
        reserve = budget_tokens if tokens and budget_tokens is not None else 0
        asks = _takes_budget(recall)
        return cls(
            recall, k, budget_tokens, reserve, "system" if role == "system" else "user", asks
        )


def _takes_budget(recall: object) -> bool:
    """Does ``recall.search`` take ``budget_tokens`` (by name, or as ``**kwargs``)?"""
    try:
        params = inspect.signature(recall.search).parameters  # type: ignore[attr-defined]
    except (TypeError, ValueError):  # a builtin or C callable: do not guess
        return False
    return "budget_tokens" in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )


class Memo(Generic[V]):
    """Each conversation's newest value, under a key: what an adapter keeps until a cut.

    Thread-safe; bounded (least recently used conversations go). :class:`RecallMemo`
    is one; an adapter keeps its own per-question content in another.
    """

    __slots__ = ("_entries", "_lock")

    def __init__(self) -> None:
        self._entries: OrderedDict[str, tuple[tuple[Any, ...], V]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, conversation_id: str, key: tuple[Any, ...]) -> tuple[bool, V | None]:
        """``(found, value)`` for ``key``."""
        with self._lock:
            entry = self._entries.get(conversation_id)
            if entry is None or entry[0] != key:
                return False, None
            self._entries.move_to_end(conversation_id)
            return True, entry[1]

    def put(self, conversation_id: str, key: tuple[Any, ...], value: V) -> None:
        """Remember ``value`` as the conversation's value for ``key``."""
        with self._lock:
            self._entries[conversation_id] = (key, value)
            self._entries.move_to_end(conversation_id)
            while len(self._entries) > _MEMO_KEPT:
                self._entries.popitem(last=False)

    def forget(self, conversation_id: str) -> None:
        """Drop the conversation's entry (it was erased or reset)."""
        with self._lock:
            self._entries.pop(conversation_id, None)


class RecallMemo(Memo["Recalling | None"]):
    """Each conversation's newest recall, so a question gets one search until a cut.

    Keyed by the question (its position and text), the window's start and what was
    asked: an agent's model calls within a turn reuse it (the request before its steps
    stays byte-identical, and the archive is searched once a turn); a new question or a
    cut searches again. Thread-safe; bounded (least recently used conversations go).
    """

    __slots__ = ()


def recall_flow(
    settings: RecallSettings,
    demoter: Demoter,
    window: Window[T],
    *,
    is_user: Callable[[T], bool],
    text_of: Callable[[T], str],
    key: Callable[[T], tuple[str, str]],
    count: Callable[[str], int],
    memo: RecallMemo,
    query: str | None = None,
) -> Flow[tuple[Recalling | None, tuple[DemoteEvent, ...]]]:
    """What recall places in the request for ``window``, and the events to report.

    The question is the newest user message the model is sent (:func:`question_at`), or
    ``query`` when the caller has one that is not stored yet (a LlamaIndex chat engine's
    ``input``); the recall goes right after it. The search asks for twice ``k`` hits
    (those the window shows are dropped, :func:`visible_hits`), and what is left is
    fitted into the budget (:func:`fit_recall`). A ``recalled`` event reports what the
    model is sent, only when something is; a failed search gives no recall and a
    ``degraded`` event (the chat never sees the error).

    Args:
        settings: The adapter's recall settings.
        demoter: The engine (for its observers and degraded reports).
        window: The loaded window.
        is_user: Is a framework message a user message?
        text_of: A framework message's text (the query).
        key: A framework message's ``(role, text)``, to spot hits without a position.
        count: The adapter's count of a recall message with a given text.
        memo: The adapter's :class:`RecallMemo`.
        query: The caller's question, if it has one.
    """
    cid = window.conversation_id
    question = question_of(window, is_user, text_of, query)
    if question is None:
        return None, ()
    at, query = question
    memo_key = (at, query, window.start, settings.k, settings.budget)
    found, remembered = memo.get(cid, memo_key)
    if found:
        return remembered, ()
    options = settings.search_options()
    began = time.perf_counter()
    try:
        hits = yield Call(settings.recall, "search", (cid, query, 2 * settings.k), options)
    except Exception as exc:  # the window goes without recall: reported, never raised
        return None, (demoter.report_degraded(cid, "recall", exc),)
    kept = fit_recall(visible_hits(window, list(hits), key), settings.k, settings.budget, count)
    recalling = Recalling(render_recall(kept), kept, at) if kept else None
    memo.put(cid, memo_key, recalling)
    if recalling is None:
        return None, ()
    event = DemoteEvent.recalled(cid, kept, time.perf_counter() - began)
    demoter.emit(event)
    return recalling, (event,)
