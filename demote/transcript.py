"""Moved to :mod:`demote.cli.transcript`; this old import path re-exports it."""

from demote.cli.transcript import (
    LOCOMO_HINT,
    Format,
    Question,
    Transcript,
    builtin_transcript,
    load_transcript,
    parse_jsonl,
    parse_locomo,
    parse_messages,
)

__all__ = [
    "LOCOMO_HINT",
    "Format",
    "Question",
    "Transcript",
    "builtin_transcript",
    "load_transcript",
    "parse_jsonl",
    "parse_locomo",
    "parse_messages",
]
