"""Placeholders for cleared and clipped tool results (pure, no I/O).

When a window clears an old tool result (:class:`~demote.window.policy.ClearToolResults`) or
clips one that alone is larger than the window allows, the model is sent a short
placeholder instead of the content. The placeholder names the archived key, so the agent
can get the content back with the recall tool, and it is never longer than
:data:`PLACEHOLDER_TOKENS` under the approximate counter, which is what the planner counts
a cleared result as.

:class:`ResultCosts` is how the planner counts a message once clearing and clipping apply:
a tool result over ``clip_over`` tokens counts as its head plus a placeholder, and a
clearable result (a tool result of a tool not excluded, counted above a placeholder) would
save ``cost - PLACEHOLDER_TOKENS`` if it were cleared. Both depend on the record alone, so
what a window shows is stable from one load to the next.
"""

from __future__ import annotations

from dataclasses import dataclass

from demote.records import MessageRecord

__all__ = [
    "DEFAULT_HEAD_TOKENS",
    "PLACEHOLDER_TOKENS",
    "ResultCosts",
    "clipped_text",
    "placeholder_text",
]

#: What the planner counts a placeholder as (tokens), whatever the tool.
PLACEHOLDER_TOKENS = 48

#: How much of a clipped result's head the model is sent, by default (tokens).
DEFAULT_HEAD_TOKENS = 200

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


@dataclass(frozen=True, slots=True)
class ResultCosts:
    """How a window counts each message once clipping and clearing apply (tokens).

    Attributes:
        clip_over: A tool result counted over this many tokens is sent as its head and a
            placeholder (``None``: never clipped).
        head_tokens: The head of a clipped result; it counts ``head_tokens +
            PLACEHOLDER_TOKENS`` (a result no larger than that is never clipped).
        clearing: Whether results may be cleared at all.
        exclude: Tools whose results are never cleared.
    """

    clip_over: int | None = None
    head_tokens: int = DEFAULT_HEAD_TOKENS
    clearing: bool = False
    exclude: frozenset[str] = frozenset()

    def cost(self, rec: MessageRecord) -> int:
        """What ``rec`` counts in the window before any clearing."""
        if (
            self.clip_over is not None
            and rec.role == "tool"
            and rec.tokens > self.clip_over
            and rec.tokens > self.head_tokens + PLACEHOLDER_TOKENS
        ):
            return self.head_tokens + PLACEHOLDER_TOKENS
        return rec.tokens

    def clipped(self, rec: MessageRecord) -> bool:
        """Is ``rec`` sent as its head and a placeholder (when not cleared)?"""
        return rec.role == "tool" and self.cost(rec) != rec.tokens

    def saving(self, rec: MessageRecord, cost: int) -> int:
        """Tokens clearing ``rec`` (counted ``cost``) would save; ``0``: not clearable."""
        if (
            not self.clearing
            or rec.role != "tool"
            or cost <= PLACEHOLDER_TOKENS
            or (rec.tool is not None and rec.tool in self.exclude)
        ):
            return 0
        return cost - PLACEHOLDER_TOKENS
