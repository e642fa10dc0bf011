"""Summarizers for the ``Compact`` strategy.

A summarizer folds messages into a running summary: given the previous summary (or
``None``) and the messages to fold in, it returns the new summary, which covers both. The
engine runs it off the hot path (a thread for sync callers, a task for async callers) and
commits the result; nothing leaves the window before that commit.

:class:`TemplateSummarizer` needs no model: a deterministic digest for tests and offline
use. ``langchain_demote.ChatModelSummarizer`` and ``llamaindex_demote.LLMSummarizer`` wrap
real models.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from demote.errors import ConfigError
from demote.records import MessageRecord
from demote.tokens import approximate_tokens

__all__ = [
    "AsyncSummarizer",
    "SyncSummarizer",
    "TemplateSummarizer",
    "format_transcript",
    "truncate_to_tokens",
]


@runtime_checkable
class SyncSummarizer(Protocol):
    """A summarizer with a blocking ``summarize``."""

    def summarize(self, previous: str | None, messages: Sequence[MessageRecord]) -> str:
        """The new running summary covering ``previous`` and ``messages``."""


@runtime_checkable
class AsyncSummarizer(Protocol):
    """A summarizer with an awaitable ``asummarize``."""

    async def asummarize(self, previous: str | None, messages: Sequence[MessageRecord]) -> str:
        """The new running summary covering ``previous`` and ``messages``."""


def check_summarizer(summarizer: object) -> None:
    """Raise :class:`ConfigError` unless ``summarizer`` can summarize."""
    if not callable(getattr(summarizer, "summarize", None)) and not callable(
        getattr(summarizer, "asummarize", None)
    ):
        raise ConfigError(f"summarizer: {summarizer!r} has neither summarize() nor asummarize()")


def truncate_to_tokens(
    text: str, max_tokens: int, counter: Callable[[str], int] = approximate_tokens
) -> str:
    """Cut ``text`` to at most ``max_tokens`` (by ``counter``), on a word boundary if possible.

    Keeps the end of the text when it must cut: a running summary ends with the newest
    facts, which matter most.
    """
    if max_tokens <= 0:
        raise ConfigError(f"max_summary_tokens: must be > 0, got {max_tokens}")
    if counter(text) <= max_tokens:
        return text
    lo, hi = 0, len(text)  # find the longest suffix that fits
    while lo < hi:
        mid = (lo + hi) // 2
        if counter(text[mid:]) <= max_tokens:
            hi = mid
        else:
            lo = mid + 1
    cut = text[lo:]
    space = cut.find(" ")
    if 0 <= space < len(cut) // 4:
        cut = cut[space + 1 :]
    return "…" + cut if counter("…" + cut) <= max_tokens else cut


def format_transcript(messages: Sequence[MessageRecord]) -> str:
    """Messages as ``role: text`` lines, the input a model summarizer reads."""
    return "\n".join(f"{m.role}: {m.text}" for m in messages if m.text.strip())


class TemplateSummarizer:
    """A deterministic digest: the previous summary plus one line per folded message.

    Each line is ``role: text`` cut to ``line_chars`` characters; the whole summary is cut
    to ``max_summary_tokens`` (oldest lines go first).
    """

    def __init__(self, *, max_summary_tokens: int = 512, line_chars: int = 160) -> None:
        if max_summary_tokens <= 0:
            raise ConfigError(f"max_summary_tokens: must be > 0, got {max_summary_tokens}")
        if line_chars <= 0:
            raise ConfigError(f"line_chars: must be > 0, got {line_chars}")
        self.max_summary_tokens = max_summary_tokens
        self.line_chars = line_chars

    def summarize(self, previous: str | None, messages: Sequence[MessageRecord]) -> str:
        """The previous summary with one short line per message appended, bounded."""
        lines = [previous] if previous else []
        for m in messages:
            text = " ".join(m.text.split())
            if not text:
                continue
            if len(text) > self.line_chars:
                text = text[: self.line_chars - 1] + "…"
            lines.append(f"{m.role}: {text}")
        return truncate_to_tokens("\n".join(lines), self.max_summary_tokens)

    async def asummarize(self, previous: str | None, messages: Sequence[MessageRecord]) -> str:
        """Same as :meth:`summarize` (no I/O)."""
        return self.summarize(previous, messages)
