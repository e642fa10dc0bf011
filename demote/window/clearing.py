"""Placeholders for cleared and clipped tool results, and for clipped tool calls (pure, no I/O).

When a window clears an old tool result (:class:`~demote.window.policy.ClearToolResults`) or
clips one that alone is larger than the window allows, the model is sent a short
placeholder instead of the content. The placeholder names the archived key, so the agent
can get the content back with the recall tool, and it is never longer than
:data:`PLACEHOLDER_TOKENS` under the approximate counter, which is what the planner counts
a cleared result as.

An assistant message whose tool calls alone are that large (a call that writes a whole
file through its arguments) is clipped the same way: :func:`clip_calls` cuts each string
argument value longer than :data:`LONG_ARG_CHARS` to its first :data:`ARG_HEAD_CHARS`
characters and :func:`call_marker` (which names the key); the arguments keep their keys,
the calls their ids and names, and the same message gives the same bytes at every call
(the record's ``clipped_tokens`` counts it so).

:class:`ResultCosts` is how the planner counts a message once clearing and clipping apply:
a tool result over ``clip_over`` tokens counts as its head plus its placeholder, and a
clearable result (a tool result of a tool not excluded, counted above its placeholder)
would save its cost less its placeholder's if it were cleared; a placeholder message
counts as the approximate counter counts it (text, answered id, role, tool name,
framing), so the window's count agrees with langchain-core's. All depend on the record
alone, so what a window shows is stable from one load to the next. An assistant message
counted over ``clip_over`` whose calls can be clipped counts ``clipped_tokens``.

A turn's opener counted over ``clip_over`` (a task or a log pasted whole), shown in front
of a window that starts inside its turn, is sent as its head and tail, half of ``clip_over``
in all (:func:`user_keep`), around a marker that names its archived key
(:func:`user_clipped_text`): the request keeps saying what the task is, within the limit.
While the window starts at or before it (the live question, a chat's turn) it is sent
whole (:meth:`ResultCosts.opener`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from demote.records import MessageRecord
from demote.window.tokens import MESSAGE_OVERHEAD

__all__ = [
    "ARG_HEAD_CHARS",
    "DEFAULT_HEAD_TOKENS",
    "KEY_STAND_IN",
    "LONG_ARG_CHARS",
    "PLACEHOLDER_TOKENS",
    "ResultCosts",
    "call_marker",
    "clip_calls",
    "clipped_text",
    "fitting_chars",
    "placeholder_text",
    "user_clipped_text",
    "user_keep",
]

#: The most a placeholder's text counts under the approximate counter (a 40-character
#: tool name, a 7-digit count); the planner counts each placeholder message exactly
#: (:meth:`ResultCosts.placeholder`).
PLACEHOLDER_TOKENS = 48

#: A key of the length of every archived key (``make_key``): what placeholders are
#: counted with before the key is known.
KEY_STAND_IN = "0" * 32

#: How much of a clipped result's head the model is sent, by default (tokens).
DEFAULT_HEAD_TOKENS = 200

#: A string argument value longer than this (characters) is cut when its call is clipped.
LONG_ARG_CHARS = 800

#: How much of a cut argument value's head the model is sent (characters).
ARG_HEAD_CHARS = 400

_MAX_TOOL = 40


def _tool(tool: str | None) -> str:
    if not tool:
        return "tool"
    return tool if len(tool) <= _MAX_TOOL else tool[: _MAX_TOOL - 1] + "…"


def placeholder_text(key: str, tool: str | None, tokens: int) -> str:
    """The text sent in place of a cleared tool result.

    Args:
        key: The archived message's dedup key.
        tool: The tool's name, when known.
        tokens: How many tokens the original content counted.
    """
    return (
        f"[{_tool(tool)} result cleared: {tokens} tokens archived as key {key}; "
        f"fetch it with the recall tool if needed]"
    )


def clipped_text(text: str, head_chars: int, key: str, tool: str | None, tokens: int) -> str:
    """The head of an oversized tool result followed by a placeholder for the rest.

    Args:
        text: The result's full text.
        head_chars: How many characters of the head to keep.
        key: The archived message's dedup key.
        tool: The tool's name, when known.
        tokens: How many tokens the full content counted.
    """
    head = text[: max(0, head_chars)]
    return (
        f"{head}\n[{_tool(tool)} result clipped: {tokens} tokens in full, archived as key "
        f"{key}; fetch it with the recall tool for the rest]"
    )


def user_clipped_text(text: str, head_chars: int, tail_chars: int, key: str, tokens: int) -> str:
    """An oversized user message as a window sends it: its head, a marker, its tail.

    A long request (a task pasted whole, a log) says what to do at its start and often
    again at its end, so both are kept; the marker names the archived key of the whole.

    Args:
        text: The message's full text.
        head_chars: How many leading characters to keep.
        tail_chars: How many trailing characters to keep.
        key: The archived message's dedup key.
        tokens: How many tokens the whole message counted.
    """
    head = text[: max(0, head_chars)]
    tail = text[len(text) - tail_chars :] if 0 < tail_chars < len(text) - len(head) else ""
    return (
        f"{head}\n[message clipped: {tokens} tokens in full, the middle left out here; "
        f"archived as key {key}: fetch it with the recall tool for the rest]\n{tail}"
    )


def user_keep(clip_over: int) -> tuple[int, int]:
    """The tokens of head and tail an oversized user message keeps (clipped over ``clip_over``).

    Half of ``clip_over`` in all, two thirds of it from the head.
    """
    keep = clip_over // 2
    head = keep * 2 // 3
    return head, keep - head


def fitting_chars(counter: Callable[[str], int], text: str, tokens: int, from_end: bool) -> int:
    """How many leading (or trailing) characters of ``text`` fit in ``tokens``.

    The longest prefix (suffix) ``counter`` counts within ``tokens``: four characters a
    token first (exact for the approximate counter), then by bisection. What a clipped
    result's head, or a clipped opener's head and tail, keeps of its text.
    """

    def part(k: int) -> str:
        return text[len(text) - k :] if from_end else text[:k]

    n = min(len(text), 4 * tokens)
    if counter(part(n)) <= tokens:
        return n
    lo, hi = 0, n - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if counter(part(mid)) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return lo


def call_marker(key: str, tokens: int) -> str:
    """What ends each cut argument value of a clipped assistant message.

    Args:
        key: The archived message's dedup key.
        tokens: How many tokens the whole message counted.
    """
    return (
        f"\n[call clipped: {tokens} tokens in full, archived as key {key}; "
        f"fetch it with the recall tool for the rest]"
    )


def _clip(value: Any, marker: str) -> tuple[Any, bool]:
    if isinstance(value, str):
        if len(value) > LONG_ARG_CHARS:
            return value[:ARG_HEAD_CHARS] + marker, True
        return value, False
    if isinstance(value, Mapping):
        pairs = [(k, _clip(v, marker)) for k, v in value.items()]
        if any(cut for _, (_, cut) in pairs):
            return {k: v for k, (v, _) in pairs}, True
        return value, False
    if isinstance(value, list | tuple):
        items = [_clip(v, marker) for v in value]
        if any(cut for _, cut in items):
            return [v for v, _ in items], True
        return value, False
    return value, False


def clip_calls(calls: Sequence[Mapping[str, Any]], marker: str) -> list[dict[str, Any]] | None:
    """The calls with their long string argument values cut, or ``None`` if none is long.

    Each string longer than :data:`LONG_ARG_CHARS`, at any depth of the arguments, becomes
    its first :data:`ARG_HEAD_CHARS` characters and ``marker`` (:func:`call_marker`); keys,
    ids and names stay.

    Args:
        calls: ``{"id", "name", "args"}`` each.
        marker: What ends each cut value.
    """
    out: list[dict[str, Any]] = []
    any_cut = False
    for call in calls:
        args, cut = _clip(call.get("args"), marker)
        any_cut = any_cut or cut
        out.append({**call, "args": args})
    return out if any_cut else None


def _framing(rec: MessageRecord) -> int:
    """Characters a tool result is sent with besides its content: answered id, role, name."""
    return len(rec.answers or "") + len(rec.role) + len(rec.tool or "")


@dataclass(frozen=True, slots=True)
class ResultCosts:
    """How a window counts each message once clipping and clearing apply (tokens).

    Attributes:
        clip_over: A tool result counted over this many tokens is sent as its head and a
            placeholder, an assistant message with long tool-call arguments with them
            cut (:func:`clip_calls`) (``None``: never clipped).
        head_tokens: The head of a clipped result; it counts ``head_tokens`` plus its
            placeholder and framing (a result no larger than that is never clipped).
        clearing: Whether results may be cleared at all.
        exclude: Tools whose results are never cleared.
    """

    clip_over: int | None = None
    head_tokens: int = DEFAULT_HEAD_TOKENS
    clearing: bool = False
    exclude: frozenset[str] = frozenset()

    def cost(self, rec: MessageRecord) -> int:
        """What ``rec`` counts in the window before any clearing."""
        if self.clip_over is None or rec.tokens <= self.clip_over:
            return rec.tokens
        if rec.role == "tool":
            clip = self._clip_cost(rec)
            return clip if rec.tokens > clip else rec.tokens
        clipped = rec.clipped_tokens
        if rec.role == "assistant" and clipped is not None and clipped < rec.tokens:
            return clipped
        return rec.tokens

    def clipped(self, rec: MessageRecord) -> bool:
        """Is ``rec`` sent clipped (a result's head and a placeholder, or cut calls)?"""
        return self.cost(rec) != rec.tokens

    def opener(self, rec: MessageRecord) -> int:
        """What user message ``rec`` counts shown in front of a window that starts in its turn.

        Over ``clip_over`` it is sent as its head and tail around a marker
        (:func:`user_clipped_text`); a user message inside the window, the live question
        among them, counts (and is sent) whole.
        """
        if self.clip_over is None or rec.role != "user" or rec.tokens <= self.clip_over:
            return self.cost(rec)
        return min(rec.tokens, self._user_clip_cost(rec))

    def opener_clipped(self, rec: MessageRecord) -> bool:
        """Is opener ``rec`` sent clipped in front of the window (:meth:`opener`)?"""
        return self.opener(rec) != rec.tokens

    def placeholder(self, rec: MessageRecord) -> int:
        """What tool result ``rec`` counts sent as its placeholder (cleared).

        The placeholder text, the id it answers, its role and the tool's name, as the
        approximate counter counts the message (langchain-core's count).
        """
        text = placeholder_text(KEY_STAND_IN, rec.tool, rec.tokens)
        return -(-(len(text) + _framing(rec)) // 4) + MESSAGE_OVERHEAD

    def _clip_cost(self, rec: MessageRecord) -> int:
        """At most what tool result ``rec`` counts sent clipped: a head and a placeholder."""
        tail = clipped_text("", 0, KEY_STAND_IN, rec.tool, rec.tokens)
        return self.head_tokens + -(-(len(tail) + _framing(rec)) // 4) + MESSAGE_OVERHEAD

    def _user_clip_cost(self, rec: MessageRecord) -> int:
        """At most what user message ``rec`` counts sent clipped: head, marker and tail."""
        head, tail = user_keep(self.clip_over or 0)
        marker = user_clipped_text("", 0, 0, KEY_STAND_IN, rec.tokens)
        return head + tail + -(-(len(marker) + len(rec.role)) // 4) + MESSAGE_OVERHEAD

    def saving(self, rec: MessageRecord, cost: int) -> int:
        """Tokens clearing ``rec`` (counted ``cost``) would save; ``0``: not clearable."""
        if not self.clearing or rec.role != "tool":
            return 0
        if rec.tool is not None and rec.tool in self.exclude:
            return 0
        return max(0, cost - self.placeholder(rec))
