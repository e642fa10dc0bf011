"""Moved to :mod:`demote.cli.commands`; this old import path re-exports it."""

from demote.cli.commands import (
    DEFAULT_POLICIES,
    RecallScore,
    inspect_stores,
    parse_policies,
    recall_score,
    replay_transcript,
    search_archive,
)

__all__ = [
    "DEFAULT_POLICIES",
    "RecallScore",
    "inspect_stores",
    "parse_policies",
    "recall_score",
    "replay_transcript",
    "search_archive",
]
