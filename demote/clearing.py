"""Placeholders for cleared and clipped tool results (pure, no I/O).

When a window clears an old tool result (:class:`~demote.policy.ClearToolResults`) or
clips one that alone is larger than the window allows, the model is sent a short
placeholder instead of the content. The placeholder names the archived key, so the agent
can get the content back with the recall tool, and it is never longer than
:data:`PLACEHOLDER_TOKENS` under the approximate counter, which is what the planner counts
a cleared result as.
"""

from __future__ import annotations

__all__ = ["PLACEHOLDER_TOKENS", "clipped_text", "placeholder_text"]

#: What the planner counts a placeholder as (tokens), whatever the tool.
PLACEHOLDER_TOKENS = 48

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
