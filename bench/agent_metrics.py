"""What an agent run's model calls cost and whether they still saw what they used.

Pure and fast: every function here takes the requests a model was sent (LangChain
messages, the system prompt first, as :class:`bench.agent_run.ScriptedModel` records them)
and returns numbers. The definitions are issue 29's, implemented exactly:

- **Tokens per call**: ``count_tokens_approximately`` over the request's messages (the
  system prompt included) plus the bound tool schemas (its ``tools=``), as
  :func:`call_tokens` gives them; :func:`size_stats` reduces them to peak, p95 and calls
  over the limit.
- **Invalid requests**: requests :func:`langchain_demote.provider_rules.violations` finds
  anything in (the documented ordering rules and langchain-anthropic's and
  langchain-openai's own converters), :class:`Checker`.
- **Billed**: :func:`billed` prices the calls one after the other with
  :class:`demote.cli.cachecost.CacheMeter`. Each prompt is the tool definitions, then the
  messages (the system prompt first), each a ``(fingerprint, tokens)`` pair. Anthropic's
  shape (:data:`~demote.cli.cachecost.ANTHROPIC`, a cache breakpoint at the end of every
  request as AnthropicPromptCachingMiddleware puts it): the prefix shared with the
  previous call is read at 0.1x, the rest written at 1.25x, nothing cached under 1,024
  tokens. OpenAI's (:data:`~demote.cli.cachecost.OPENAI_AUTO`): automatic prefix caching
  from 1,024 tokens, cached input at 0.1x, no write premium. A summarizer's calls are
  their own sequence, priced the same way and added (:func:`run_billed`). A run's figure
  is its bill divided by no memory's bill of the same run, so no memory is 1.00.
- **Grounded** (:func:`grounded`): for model call ``k`` whose recorded answer is an
  assistant message with tool calls, split the string values of the calls' arguments
  (recursively through nested lists and dicts) into identifier-like pieces: runs of 6 or
  more characters between whitespace, quotes and ``,;:()[]{}<>=|`` that hold a digit or
  one of ``/ _ . @ -`` (:func:`pieces`). Keep the pieces whose first appearance in the
  run (the recorded trajectory, in order) is in a tool result. The call's share is how
  many of them occur anywhere in what call ``k`` is sent: the text of every message of the
  request, tool-call arguments included (:func:`message_text`). A setup's figure is the
  pooled share over all kept pieces of all its calls (the headline); the mean of the
  per-run shares is reported beside it. No memory sends everything before call ``k``,
  so it scores 100% by construction.
- **Grounded in context** (issue 36, beside grounded in :class:`Grounding`): a kept piece
  counts only where it is sent within :data:`CONTEXT_CHARS` (60) characters of a *word*
  that stood within 60 characters of it in the tool result it came from. A word is a
  maximal run of 4 or more ASCII letters, compared without case, outside the piece's own
  occurrence (a word the identifier holds is not its context). The tool result it came
  from is the one where it first appears in the run (the same one that makes it kept);
  its words are those near any of its occurrences there. The piece counts when any of its
  occurrences in what call ``k`` is sent has one of them within 60 characters: the gap
  between the word and the occurrence is at most 60 characters (:func:`context_words`).
  So ``ZFA04Y 8JD3KQ /srv/app/x.py`` in a bare list is grounded, not in context;
  ``reservation ZFA04Y`` is both, where the result said ``"reservation": "ZFA04Y"``.
  No memory sends each result as it was, so it scores 100% here too.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.messages.utils import count_tokens_approximately

from demote.cli.cachecost import ANTHROPIC, OPENAI_AUTO, CacheMeter, Pricing
from langchain_demote.provider_rules import violations

__all__ = [
    "CONTEXT_CHARS",
    "PRICINGS",
    "Checker",
    "Counter",
    "Grounding",
    "billed",
    "call_pieces",
    "call_tokens",
    "context_words",
    "grounded",
    "message_key",
    "message_text",
    "pieces",
    "prompt_of",
    "run_billed",
    "size_stats",
]

#: The two price shapes reported, by column name.
PRICINGS: dict[str, Pricing] = {"anthropic": ANTHROPIC, "openai": OPENAI_AUTO}

_SPLIT = re.compile(r"[\s'\",;:()\[\]{}<>=|]+")
_MARK = re.compile(r"[0-9/_.@-]")
_JOIN = "\x00"  # between messages: no piece spans two of them

#: How near (in characters) a word must stand to an identifier to be its context.
CONTEXT_CHARS = 60
_WORD = re.compile(r"[A-Za-z]{4,}")
_REACH = CONTEXT_CHARS + 40  # a word that ends within the gap is read whole


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and isinstance(block.get("text"), str):
            parts.append(block["text"])
        else:
            parts.append(json.dumps(block, sort_keys=True, default=str))
    return "\n".join(parts)


def _strings(value: Any) -> Iterator[str]:
    """The string values in ``value``, recursively through lists and dicts."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def message_text(message: BaseMessage) -> str:
    """The text of one message as grounding searches it: content, then call arguments."""
    text = _content_text(message.content)
    if isinstance(message, AIMessage) and message.tool_calls:
        args = "\n".join(s for call in message.tool_calls for s in _strings(call["args"]))
        text = f"{text}\n{args}"
    return text


def pieces(text: str) -> list[str]:
    """The identifier-like pieces of ``text``, in order, each once (see the module doc)."""
    out: dict[str, None] = {}
    for run in _SPLIT.split(text):
        if len(run) >= 6 and _MARK.search(run):
            out.setdefault(run, None)
    return list(out)


def call_pieces(answer: BaseMessage) -> list[str]:
    """The pieces of the string values of ``answer``'s tool-call arguments (each once)."""
    if not isinstance(answer, AIMessage) or not answer.tool_calls:
        return []
    out: dict[str, None] = {}
    for call in answer.tool_calls:
        for s in _strings(call["args"]):
            for p in pieces(s):
                out.setdefault(p, None)
    return list(out)


def message_key(message: BaseMessage) -> Hashable:
    """A fingerprint of everything a provider would be sent for ``message``."""
    calls = json.dumps(
        [[c.get("id"), c["name"], c["args"]] for c in getattr(message, "tool_calls", ())],
        sort_keys=True,
        default=str,
    )
    content = (
        message.content
        if isinstance(message.content, str)
        else json.dumps(message.content, sort_keys=True, default=str)
    )
    return (
        message.type,
        content,
        getattr(message, "tool_call_id", None),
        getattr(message, "status", None),
        message.name,
        calls,
    )


class Counter:
    """Each message's ``(fingerprint, tokens)``, counted once by ``count_tokens_approximately``.

    Per-message counts add up to the count of the whole list (langchain-core rounds up per
    message), so summing them is the request's count.
    """

    def __init__(self) -> None:
        self._cache: dict[Hashable, tuple[Hashable, int]] = {}

    def __call__(self, message: BaseMessage) -> tuple[Hashable, int]:
        """``(fingerprint, tokens)`` of ``message``."""
        key = message_key(message)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = (key, count_tokens_approximately([message]))
        return hit


def _tool_tokens(tools: Sequence[dict[str, Any]] | None) -> int:
    return count_tokens_approximately([], tools=list(tools)) if tools else 0


def prompt_of(
    request: Sequence[BaseMessage], tool_tokens: int, count: Counter
) -> list[tuple[Hashable, int]]:
    """One call's prompt for :class:`~demote.cli.cachecost.CacheMeter`: tools, then messages."""
    head: list[tuple[Hashable, int]] = [("tools", tool_tokens)] if tool_tokens else []
    return [*head, *map(count, request)]


def call_tokens(
    requests: Iterable[Sequence[BaseMessage]],
    tools: Sequence[dict[str, Any]] | None = None,
    count: Counter | None = None,
) -> list[int]:
    """Tokens of each request: its messages (system prompt included) and the tool schemas."""
    count = count or Counter()
    tool_tokens = _tool_tokens(tools)
    return [tool_tokens + sum(count(m)[1] for m in r) for r in requests]


def billed(
    requests: Iterable[Sequence[BaseMessage]],
    pricing: Pricing,
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    count: Counter | None = None,
) -> float:
    """What the calls cost, one after the other, in full-price input tokens."""
    count = count or Counter()
    tool_tokens = _tool_tokens(tools)
    meter = CacheMeter((pricing,))
    return sum(meter.add(prompt_of(r, tool_tokens, count))[0].cost for r in requests)


def run_billed(
    requests: Sequence[Sequence[BaseMessage]],
    summaries: Sequence[Sequence[BaseMessage]] = (),
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    count: Counter | None = None,
) -> dict[str, float]:
    """A run's bill under each of :data:`PRICINGS`: the agent's calls plus a summarizer's.

    The summarizer's calls are priced as their own sequence (they share no prefix with
    the agent's) and added.
    """
    count = count or Counter()
    return {
        name: billed(requests, pricing, tools=tools, count=count)
        + billed(summaries, pricing, count=count)
        for name, pricing in PRICINGS.items()
    }


def size_stats(sizes: Sequence[int], limit: int) -> dict[str, Any]:
    """Peak, p95 (nearest rank) and calls over ``limit`` of per-call token counts."""
    ordered = sorted(sizes)
    peak = ordered[-1] if ordered else 0
    p95 = ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)] if ordered else 0
    return {
        "calls": len(sizes),
        "peak": peak,
        "peak_x": peak / limit,
        "p95": p95,
        "p95_x": p95 / limit,
        "over": sum(s > limit for s in sizes),
    }


class Checker:
    """Counts invalid requests; a request seen before (by its messages) is checked once.

    Setups often send the same request (no memory at both limits, any setup before its
    first cut); the providers' converters dominate the time otherwise.
    """

    def __init__(self, count: Counter | None = None) -> None:
        self.count = count or Counter()
        self._seen: dict[tuple[Hashable, ...], list[str]] = {}

    def violations(self, request: Sequence[BaseMessage]) -> list[str]:
        """What the providers would reject in ``request`` (empty: valid)."""
        key = tuple(self.count(m)[0] for m in request)
        hit = self._seen.get(key)
        if hit is None:
            hit = self._seen[key] = violations(request)
        return hit

    def invalid(self, requests: Iterable[Sequence[BaseMessage]]) -> int:
        """How many of ``requests`` a provider would reject."""
        return sum(bool(self.violations(r)) for r in requests)


def _words_near(text: str, at: int, end: int) -> Iterator[str]:
    """The words (lower case) within :data:`CONTEXT_CHARS` of ``text[at:end]``, outside it."""
    lo = max(0, at - _REACH)
    for m in _WORD.finditer(text, lo, at):
        if m.end() >= at - CONTEXT_CHARS and not (
            m.start() == lo and lo and text[lo - 1].isalpha()
        ):
            yield m.group().lower()
    hi = min(len(text), end + _REACH)
    for m in _WORD.finditer(text, end, hi):
        if m.start() > end + CONTEXT_CHARS:
            break
        if not (m.end() == hi and hi < len(text) and text[hi].isalpha()):
            yield m.group().lower()


def _occurrences(text: str, piece: str) -> Iterator[int]:
    at = text.find(piece)
    while at >= 0:
        yield at
        at = text.find(piece, at + 1)


def context_words(text: str, piece: str) -> frozenset[str]:
    """The words standing within :data:`CONTEXT_CHARS` of any occurrence of ``piece`` in ``text``.

    A word is a maximal run of 4 or more ASCII letters, lower-cased; the letters of the
    occurrence itself are not read (an identifier is not its own context).
    """
    return frozenset(
        w for at in _occurrences(text, piece) for w in _words_near(text, at, at + len(piece))
    )


def _in_context(text: str, piece: str, words: frozenset[str]) -> bool:
    """Does some occurrence of ``piece`` in ``text`` stand within reach of one of ``words``?"""
    if not words:
        return False
    return any(
        w in words
        for at in _occurrences(text, piece)
        for w in _words_near(text, at, at + len(piece))
    )


@dataclass(frozen=True, slots=True)
class Grounding:
    """Grounding of one run under one setup.

    Attributes:
        found: Kept pieces that occur in what their call was sent.
        pieces: Kept pieces (those first seen in a tool result), over all calls.
        per_call: ``(found, pieces)`` of each model call, in order.
        in_context: Kept pieces sent within reach of a word that stood beside them in
            the tool result they came from (see the module docstring).
    """

    found: int
    pieces: int
    per_call: tuple[tuple[int, int], ...]
    in_context: int = 0

    @property
    def share(self) -> float | None:
        """``found / pieces``; ``None`` when no call copied anything from a result."""
        return self.found / self.pieces if self.pieces else None

    @property
    def context_share(self) -> float | None:
        """``in_context / pieces``; ``None`` when no call copied anything from a result."""
        return self.in_context / self.pieces if self.pieces else None


class _FirstSeen:
    """Where each piece first appears in a run: in a tool result or elsewhere."""

    def __init__(self, run: Sequence[BaseMessage]) -> None:
        self._texts = texts = [message_text(m) for m in run]
        self._types = [m.type for m in run]
        self._starts: list[int] = []
        at = 0
        for t in texts:
            self._starts.append(at)
            at += len(t) + len(_JOIN)
        self._text = _JOIN.join(texts)
        self._cache: dict[str, int | None] = {}
        self._words: dict[str, frozenset[str]] = {}

    def _source(self, piece: str) -> int | None:
        """Index of the tool result where ``piece`` first appears (``None``: elsewhere)."""
        if piece in self._cache:
            return self._cache[piece]
        at = self._text.find(piece)
        index = bisect.bisect_right(self._starts, at) - 1
        hit = self._cache[piece] = index if at >= 0 and self._types[index] == "tool" else None
        return hit

    def in_tool_result(self, piece: str) -> bool:
        return self._source(piece) is not None

    def words(self, piece: str) -> frozenset[str]:
        """The words beside ``piece`` in the tool result it came from."""
        hit = self._words.get(piece)
        if hit is None:
            source = self._source(piece)
            text = "" if source is None else self._texts[source]
            hit = self._words[piece] = context_words(text, piece)
        return hit


def grounded(
    run: Sequence[BaseMessage],
    answers: Sequence[BaseMessage],
    requests: Sequence[Sequence[BaseMessage]],
) -> Grounding:
    """The grounding of one replayed run (see the module docstring).

    Args:
        run: The recorded trajectory, in order (where each piece first appears).
        answers: The recorded answer of each model call, in call order.
        requests: What each model call was sent (``requests[k]`` answered by
            ``answers[k]``), under the setup measured.
    """
    first = _FirstSeen(run)
    per_call: list[tuple[int, int]] = []
    in_context = 0
    for answer, request in zip(answers, requests, strict=False):
        kept = [p for p in call_pieces(answer) if first.in_tool_result(p)]
        if not kept:
            per_call.append((0, 0))
            continue
        sent = _JOIN.join(message_text(m) for m in request)
        present = [p for p in kept if p in sent]
        in_context += sum(_in_context(sent, p, first.words(p)) for p in present)
        per_call.append((len(present), len(kept)))
    return Grounding(
        found=sum(f for f, _ in per_call),
        pieces=sum(n for _, n in per_call),
        per_call=tuple(per_call),
        in_context=in_context,
    )
