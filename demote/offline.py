"""Moved to :mod:`demote.cli.offline`; this old import path re-exports it."""

from demote.cli.offline import (
    GROUNDED_PREFIX,
    SYSTEM_PROMPT,
    UNKNOWN_REPLY,
    OfflineResponder,
    content_terms,
    relevant_line,
)

__all__ = [
    "GROUNDED_PREFIX",
    "SYSTEM_PROMPT",
    "UNKNOWN_REPLY",
    "OfflineResponder",
    "content_terms",
    "relevant_line",
]
