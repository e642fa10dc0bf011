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

from demote._validate import count
from demote.errors import ConfigError
from demote.records import MessageRecord
from demote.window.tokens import approximate_tokens

__all__ = [
    "DEFAULT_SUMMARY_PROMPT",
    "AsyncSummarizer",
    "ModelSummarizer",
    "SyncSummarizer",
    "TemplateSummarizer",
    "format_transcript",
    "summary_request",
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
    max_tokens = count("max_summary_tokens", max_tokens)
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


#: The default instructions model summarizers send (``{max_words}`` is filled in).
DEFAULT_SUMMARY_PROMPT = (
    "You maintain the running summary of a long conversation. Merge the previous summary "
    "and the new messages into one updated summary. Keep every fact, name, number, date, "
    "decision and open question; drop greetings and filler. Write plain prose or short "
    "bullet points, at most {max_words} words, and output only the summary."
)


def summary_request(
    previous: str | None,
    messages: Sequence[MessageRecord],
    *,
    prompt: str = DEFAULT_SUMMARY_PROMPT,
    max_summary_tokens: int = 512,
) -> tuple[str, str]:
    """The (instructions, input) pair a model summarizer sends: shared by every framework.

    Args:
        previous: The previous running summary, if any.
        messages: The messages to fold in.
        prompt: Instructions; ``{max_words}`` is replaced by a word budget.
        max_summary_tokens: The summary's bound in tokens.
    """
    max_words = max(1, int(max_summary_tokens * 0.75))
    instructions = prompt.replace("{max_words}", str(max_words))
    body = f"Previous summary:\n{previous or '(none)'}\n\nNew messages:\n"
    return instructions, body + format_transcript(messages)


class ModelSummarizer:
    """Base of the model-backed summarizers: prompt, bound and cut written once.

    Subclasses implement :meth:`_complete` and :meth:`_acomplete` (one model call each);
    ``langchain_demote.ChatModelSummarizer`` and ``llamaindex_demote.LLMSummarizer`` are
    the shipped ones.

    Args:
        prompt: Instructions replacing :data:`DEFAULT_SUMMARY_PROMPT` (``{max_words}`` is
            filled in).
        max_summary_tokens: Bound on the summary; a longer answer is cut (newest kept).
        counter: Counts tokens for that bound (default: chars / 4).
    """

    def __init__(
        self,
        *,
        prompt: str = DEFAULT_SUMMARY_PROMPT,
        max_summary_tokens: int = 512,
        counter: Callable[[str], int] = approximate_tokens,
    ) -> None:
        max_summary_tokens = count("max_summary_tokens", max_summary_tokens)
        self.prompt = prompt
        self.max_summary_tokens = max_summary_tokens
        self.counter = counter

    def _complete(self, instructions: str, body: str) -> str:
        raise NotImplementedError

    async def _acomplete(self, instructions: str, body: str) -> str:
        raise NotImplementedError

    def _request(self, previous: str | None, messages: Sequence[MessageRecord]) -> tuple[str, str]:
        return summary_request(
            previous, messages, prompt=self.prompt, max_summary_tokens=self.max_summary_tokens
        )

    def _finish(self, text: str) -> str:
        return truncate_to_tokens(text.strip(), self.max_summary_tokens, self.counter)

    def summarize(self, previous: str | None, messages: Sequence[MessageRecord]) -> str:
        """The new running summary (blocking model call)."""
        return self._finish(self._complete(*self._request(previous, messages)))

    async def asummarize(self, previous: str | None, messages: Sequence[MessageRecord]) -> str:
        """The new running summary (awaited model call)."""
        return self._finish(await self._acomplete(*self._request(previous, messages)))


class TemplateSummarizer:
    """A deterministic digest: the previous summary plus one line per folded message.

    Each line is ``role: text`` cut to ``line_chars`` characters; the whole summary is cut
    to ``max_summary_tokens`` (oldest lines go first).
    """

    def __init__(self, *, max_summary_tokens: int = 512, line_chars: int = 160) -> None:
        max_summary_tokens = count("max_summary_tokens", max_summary_tokens)
        line_chars = count("line_chars", line_chars)
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
