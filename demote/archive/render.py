"""What a recall tool answers the model: archived messages rendered compactly (pure).

Theory of operation
-------------------
An agent's recall tool (``langchain_demote.recall_tool``, ``llamaindex_demote.recall_tool``)
does one of two things for the model: it *searches* the conversation's long tail for a
query, or it *fetches* one archived message by the key a placeholder names
(:func:`demote.window.clearing.placeholder_text`). Both adapters run the same generator,
:func:`answer`: it yields the archive call it needs (a :class:`demote.engine._flow.Call`: ``search``
or ``fetch``, awaited as ``asearch`` / ``afetch`` on the async path), is sent the result
(or the exception) back, and returns the text the model reads. So the decisions (which
action, how the model's ``k`` and budget are bounded, what a missing conversation or a
failing archive answers) are written once, for sync and async and for both frameworks.

Every answer is a string, never an exception: the model gets a short, clear sentence when
there is no conversation, nothing matches, the key is not this conversation's, or the
archive is down. The conversation is never an argument the model gives: the adapters bind
it from the run (the LangGraph thread) or the memory, and the archive scopes every read to
it, so a key of another conversation is simply not found and a query is only ever text.

Rendering. Each hit is one compact block ``[role, time] body`` (the time is the archive
time, UTC, when the archive recorded it). The body comes from the whole message when the
archive kept it (``Recalled.data``): an assistant message's tool calls
read ``name({"arg": ...})``, a tool result reads ``name → result``, media blocks show as
``[image]``; a text-only row shows its text. Hits are chosen best first until the token
budget (counted with the given counter over the whole answer, newlines included) is spent.
A hit longer than its share (a third of what is left, so several hits are seen) is shown
by its lines that hold most of the query's terms, with its first line (a file's or a
table's title) and ``…`` for what was left out (:func:`snippet`); the cut names the hit's
key, so the model can fetch the whole message. The chosen hits are shown in conversation
order.
"""

from __future__ import annotations

import bisect
import itertools
import json
import logging
import math
import re
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

from demote.archive._fts import query_terms
from demote.archive._schema import row_data
from demote.engine._flow import Call
from demote.errors import ConfigError
from demote.records import Recalled
from demote.window.tokens import Counter, approximate_tokens, resolve_counter

__all__ = [
    "CUT_MARK",
    "MIN_HIT_TOKENS",
    "NO_CONVERSATION",
    "SHARE",
    "TOOL_DESCRIPTION",
    "RecallArgs",
    "RecallOptions",
    "answer",
    "cut_to_tokens",
    "hit_body",
    "hit_header",
    "recalled_from_columns",
    "render_fetched",
    "render_hits",
    "snippet",
    "tool_options",
]

logger = logging.getLogger("demote")

#: Ends a hit that was cut to the budget (``{key}`` is the archived key).
CUT_MARK = " …[cut; fetch key {key} for all of it]"
#: A search answer keeps room for this many hits: a long hit gets its share of the budget.
SHARE = 3
#: A hit is only shown cut when at least this many tokens of the budget are left for it.
MIN_HIT_TOKENS = 24
#: What the model reads when the run names no conversation (no thread id).
NO_CONVERSATION = (
    "The recall tool cannot tell which conversation this is (the run has no thread id), "
    "so it has nothing to search. Continue without it."
)
#: What the model is told a recall tool does.
TOOL_DESCRIPTION = (
    "Look up earlier messages of this conversation that are no longer in your context "
    "(they were archived). To search, pass `query` (the words of what you need; optionally "
    "`k` hits and `budget_tokens`). To read one archived message back in full, pass `key`: "
    "the key a placeholder such as '[... result cleared: ... archived as key K ...]' names."
)
_HEADER = "Archived messages of this conversation (oldest first):"
_ECHO = 80  # characters of the model's own query or key echoed back


def _echo(value: str) -> str:
    return value if len(value) <= _ECHO else value[: _ECHO - 1] + "…"


def cut_to_tokens(text: str, budget: int, count: Counter, suffix: str = "") -> str:
    """The longest head of ``text`` that, with ``suffix``, counts at most ``budget``.

    ``text`` itself when it fits whole (no suffix then); ``""`` when not even the suffix
    fits. A binary search over the head's length: ``O(log n)`` counter calls.
    """
    if count(text) <= budget:
        return text
    if count(suffix) > budget:
        return ""
    low, high = 0, len(text)  # text[:low] + suffix fits; text[:high] + suffix does not
    while high - low > 1:
        mid = (low + high) // 2
        if count(text[:mid] + suffix) <= budget:
            low = mid
        else:
            high = mid
    return text[:low].rstrip() + suffix


def hit_header(hit: Recalled) -> str:
    """``[role, time]`` of one hit (``[role]`` when the archive time is unknown)."""
    role = _data(hit).get("role") or hit.role
    at = hit.at
    if at is None or not math.isfinite(at):
        return f"[{role}]"
    try:
        when = datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M")
    except (OverflowError, OSError, ValueError):
        return f"[{role}]"
    return f"[{role}, {when}]"


def _data(hit: Recalled) -> Mapping[str, Any]:
    return hit.data if isinstance(hit.data, Mapping) else {}


def _json(value: object) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    except (TypeError, ValueError):
        return str(value)


def hit_body(hit: Recalled) -> str:
    """The readable content of one hit: text, tool calls, tool result, media markers."""
    data = _data(hit)
    text = data.get("text")
    text = text if isinstance(text, str) else hit.text
    role = data.get("role") or hit.role
    tool = data.get("tool")
    if role == "tool" and isinstance(tool, str) and tool:
        text = f"{tool} → {text}"
    parts = [text] if text else []
    calls = data.get("tool_calls")
    if isinstance(calls, Sequence) and not isinstance(calls, str):
        for call in calls:
            if isinstance(call, Mapping):
                parts.append(f"{call.get('name') or 'tool'}({_json(call.get('args', {}))})")
    blocks = data.get("blocks")
    if isinstance(blocks, Sequence) and not isinstance(blocks, str):
        parts.extend(
            f"[{block.get('type') or 'block'}]" for block in blocks if isinstance(block, Mapping)
        )
    return " ".join(parts) if parts else "(empty)"


def _block(hit: Recalled) -> str:
    return f"{hit_header(hit)} {hit_body(hit)}"


def _matcher(query: str) -> re.Pattern[str] | None:
    """Finds the query's terms at word starts (``None`` when the query has none).

    A long term is matched by its head, a crude stem: "connections" finds "connection".
    """
    stems = {t if len(t) <= 4 else t[: max(4, len(t) - 2)] for t in query_terms(query)}
    if not stems:
        return None
    alternatives = "|".join(re.escape(s) for s in sorted(stems, key=len, reverse=True))
    return re.compile(rf"(?<![^\W_])(?:{alternatives})", re.IGNORECASE)


def _joined(lines: Sequence[str], chosen: set[int]) -> str:
    out: list[str] = []
    previous = -1
    for i in sorted(chosen):
        if i > previous + 1:
            out.append("…")
        out.append(lines[i])
        previous = i
    return "\n".join(out)


def snippet(body: str, query: str, budget: int, count: Counter, mark: str) -> str:
    """The lines of a long ``body`` that hold most of ``query``'s terms, within ``budget``.

    The best-matching line first, then the body's first line (a file's or a table's
    title), then the other matching lines by how many terms they hold; shown in their
    order, ``…`` where lines were left out, ``mark`` at the end. A body of one line, or
    one no line of which matches, is cut to its head instead.
    """
    lines = body.split("\n")
    matcher = _matcher(query)
    if len(lines) < 2 or matcher is None:
        return cut_to_tokens(body, budget, count, mark)
    # One pass over the body; each match is counted on its line, once per distinct term.
    starts = list(itertools.accumulate((len(line) + 1 for line in lines[:-1]), initial=0))
    found: list[set[str]] = [set() for _ in lines]
    for match in matcher.finditer(body):
        found[bisect.bisect_right(starts, match.start()) - 1].add(match.group().lower())
    scores = [len(terms) for terms in found]
    if not any(scores):
        return cut_to_tokens(body, budget, count, mark)
    ranked = sorted((i for i, n in enumerate(scores) if n), key=lambda i: (-scores[i], i))
    # Each line costs its count plus a newline and a possible "…" line: the sum bounds
    # the joined text for the approximate counter, and a final check covers any other.
    left = budget - count(mark) - 1
    order: list[int] = []
    for i in dict.fromkeys([ranked[0], 0, *ranked[1:]]):
        cost = count(lines[i]) + 2
        if cost <= left:
            order.append(i)
            left -= cost
        if left < 3:
            break
    while order:
        text = _joined(lines, set(order)) + mark
        if count(text) <= budget:
            return text
        order.pop()  # the least relevant line goes first
    return cut_to_tokens(lines[ranked[0]], budget, count, mark)


def render_hits(
    hits: Sequence[Recalled],
    budget_tokens: int,
    count: Counter = approximate_tokens,
    query: str = "",
) -> str | None:
    """The search answer for ``hits`` (best first) within ``budget_tokens``.

    Args:
        hits: The search's hits, best first.
        budget_tokens: Most tokens the answer may count.
        count: The token counter.
        query: The search's query: a long hit is then shown by its lines that match it
            best (:func:`snippet`), each hit within its share of the budget (at least
            ``1 / SHARE`` of what is left), so several hits are seen. Empty: long hits
            are cut to their head, best first, until the budget is spent.

    Returns:
        A header line and one block per chosen hit, in conversation order; ``None`` when
        there are no hits, or not one fits the budget.
    """
    if not hits:
        return None
    # Summing each line's count plus one per newline over-counts the joined text for the
    # approximate counter; a final check below covers any other counter.
    left = budget_tokens - count(_HEADER) - 1
    chosen: list[tuple[int, int, str]] = []  # (index, rank, block)
    for rank, hit in enumerate(hits):
        block = _block(hit)
        cap = left
        if query:
            cap = max(MIN_HIT_TOKENS * 2, left // min(len(hits) - rank, SHARE))
        cost = count(block) + 1
        if cost > min(cap, left):
            cap = min(cap, left)
            if cap < MIN_HIT_TOKENS:
                continue
            mark = CUT_MARK.format(key=hit.key)
            if query:
                head = hit_header(hit)
                shown = snippet(hit_body(hit), query, cap - 1 - count(head) - 1, count, mark)
                block = f"{head} {shown}" if shown else ""
            else:
                block = cut_to_tokens(block, cap - 1, count, mark)
            if not block or count(block) + 1 > cap:
                continue
            cost = count(block) + 1
        chosen.append((hit.index, rank, block))
        left -= cost
    while chosen:
        text = "\n".join([_HEADER, *(b for _, _, b in sorted(chosen))])
        if count(text) <= budget_tokens:
            return text
        chosen.remove(max(chosen, key=lambda c: c[1]))  # drop the worst-ranked hit
    return None


def render_fetched(hit: Recalled, budget_tokens: int, count: Counter = approximate_tokens) -> str:
    """One fetched message as the model reads it, cut to ``budget_tokens``."""
    block = _block(hit)
    total = count(block)
    if total <= budget_tokens:
        return block
    mark = f" …[cut: the message is {total} tokens, shown up to {budget_tokens}]"
    return cut_to_tokens(block, budget_tokens, count, mark) or mark.strip()[: budget_tokens * 4]


def recalled_from_columns(columns: Mapping[str, Any]) -> Recalled:
    """A :class:`Recalled` from an archive row's columns, by name (score ``0``).

    Reads ``idx``, ``role``, ``text`` and ``key``; the whole message from ``data`` (the
    archives' JSON column, :func:`demote.archive._schema.row_data`, or an already decoded
    object) and the archive time from ``archived_at`` or ``at`` (seconds since the epoch,
    or an ISO timestamp) when the row has them. A row without them, or with a
    value that cannot be read, degrades to a text-only hit.
    """
    data = columns.get("data")
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    if isinstance(data, str):  # the archive's column: the message less its role and text
        data = row_data(str(columns.get("role", "")), str(columns.get("text", "")), data)
    elif isinstance(data, Mapping):  # PostgreSQL's jsonb, decoded by the driver
        data = {"role": columns.get("role", ""), "text": columns.get("text", ""), **data}
    at = columns.get("at", columns.get("archived_at"))
    if isinstance(at, str):
        try:
            at = datetime.fromisoformat(at).timestamp()
        except ValueError:
            at = None
    elif isinstance(at, datetime):
        at = at.timestamp()
    if isinstance(at, bool) or not isinstance(at, int | float):
        at = None
    return Recalled(
        role=str(columns.get("role", "")),
        text=str(columns.get("text", "")),
        index=int(columns.get("idx", -1)),
        key=str(columns.get("key", "")),
        data=dict(data) if isinstance(data, Mapping) else None,
        at=None if at is None else float(at),
    )


class RecallArgs(BaseModel):
    """What the model passes a recall tool: a query to search, or a key to fetch."""

    query: str | None = Field(
        default=None, description="Words to search this conversation's archived messages for."
    )
    key: str | None = Field(
        default=None, description="The archived key a placeholder names, to fetch that message."
    )
    k: int | None = Field(default=None, description="How many hits a search returns at most.")
    budget_tokens: int | None = Field(default=None, description="Most tokens the answer may take.")


def _bounded(name: str, value: int, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name}: must be an int >= {low}, got {value!r:.40}")
    return value


@dataclass(frozen=True, slots=True)
class RecallOptions:
    """A recall tool's bounds: what the model gets unless it asks, and at most.

    Attributes:
        k: Hits a search returns when the model does not say.
        max_k: Most hits the model may ask for.
        budget_tokens: Tokens a search answer may cost when the model does not say.
        max_budget_tokens: Most tokens the model may ask a search or fetch for.
        fetch_budget_tokens: Tokens a fetched message may cost when the model does not say
            (a cleared tool result can be long: it is cut there, and the cut says so).
        counter: Counts the answer's tokens (the policy's counter; approximate by default).
        snippets: Show a long hit by its lines that match the query best, each hit within
            its share of the budget (:func:`render_hits`); ``False``: by its head.
    """

    k: int = 5
    max_k: int = 20
    budget_tokens: int = 500
    max_budget_tokens: int = 4000
    fetch_budget_tokens: int = 2000
    counter: Counter = approximate_tokens
    snippets: bool = True

    def __post_init__(self) -> None:
        _bounded("k", self.k, 1)
        _bounded("max_k", self.max_k, self.k)
        _bounded("budget_tokens", self.budget_tokens, MIN_HIT_TOKENS * 2)
        _bounded("fetch_budget_tokens", self.fetch_budget_tokens, MIN_HIT_TOKENS * 2)
        _bounded(
            "max_budget_tokens",
            self.max_budget_tokens,
            max(self.budget_tokens, self.fetch_budget_tokens),
        )
        if not callable(self.counter):
            raise ConfigError(f"counter: must be a str -> int callable, got {self.counter!r:.40}")

    def clamp_k(self, k: object) -> int:
        """The model's ``k``, kept within ``[1, max_k]`` (the default when it gave none)."""
        if isinstance(k, bool) or not isinstance(k, int):
            return self.k
        return min(max(k, 1), self.max_k)

    def clamp_budget(self, budget: object, default: int) -> int:
        """The model's token budget, kept within ``[MIN_HIT_TOKENS * 2, max_budget_tokens]``."""
        if isinstance(budget, bool) or not isinstance(budget, int):
            return default
        return min(max(budget, MIN_HIT_TOKENS * 2), self.max_budget_tokens)


def tool_options(
    archive: object,
    name: object,
    *,
    k: int,
    max_k: int,
    budget_tokens: int,
    max_budget_tokens: int,
    fetch_budget_tokens: int,
    counter: str | Counter,
    snippets: bool = True,
) -> RecallOptions:
    """Check a recall tool's archive and name, and build its options (both adapters).

    Raises:
        ConfigError: ``archive`` cannot both search and fetch, ``name`` is empty, or an
            option is out of range (the message names it).
    """
    for method in ("search", "fetch"):
        if not callable(getattr(archive, method, None)):
            raise ConfigError(f"archive: {archive!r:.60} has no {method}() (an archive has both)")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"name: must be a non-empty str, got {name!r:.40}")
    return RecallOptions(
        k=k,
        max_k=max_k,
        budget_tokens=budget_tokens,
        max_budget_tokens=max_budget_tokens,
        fetch_budget_tokens=fetch_budget_tokens,
        counter=resolve_counter(counter),
        snippets=bool(snippets),
    )


def answer(
    archive: object,
    conversation_id: str | None,
    options: RecallOptions,
    *,
    query: object = None,
    key: object = None,
    k: object = None,
    budget_tokens: object = None,
) -> Generator[Call, Any, str]:
    """One recall tool call as a flow: fetch by ``key`` when given, else search ``query``.

    Run by :func:`demote.engine._flow.drive_sync` or :func:`demote.engine._flow.drive_async`.

    Args:
        archive: Has ``search(conversation_id, query, k)`` and ``fetch(conversation_id,
            key)`` (and optionally their async twins): ``SQLiteArchive``,
            ``PostgresArchive``.
        conversation_id: The run's conversation, bound by the adapter (``None``: the run
            names none).
        options: The tool's bounds.
        query: The model's search text (any text; it is only ever searched for).
        key: The archived key a placeholder names.
        k: The model's number of hits (bounded by ``options``).
        budget_tokens: The model's token budget (bounded by ``options``).

    Returns:
        The text the model reads; never raises for what the model passed or the archive
        did (a failing archive is logged and answered with a sentence).
    """
    if conversation_id is None:
        return NO_CONVERSATION
    count = options.counter
    key_text = key.strip() if isinstance(key, str) else ""
    query_text = query if isinstance(query, str) else ""
    if key_text:
        budget = options.clamp_budget(budget_tokens, options.fetch_budget_tokens)
        try:
            hit = yield Call(archive, "fetch", (conversation_id, key_text), {})
        except Exception as exc:
            return _unavailable(conversation_id, exc)
        if hit is None:
            return f"No archived message with key {_echo(key_text)!r} in this conversation."
        return render_fetched(hit, budget, count)
    if not query_text.strip():
        return (
            "Give the recall tool a query to search this conversation's archived messages, "
            "or the key a cleared result's placeholder names to fetch that message."
        )
    budget = options.clamp_budget(budget_tokens, options.budget_tokens)
    try:
        # No budget for the archive: a long best hit is shown cut (with its key), not
        # dropped for a shorter, worse one.
        hits = yield Call(archive, "search", (conversation_id, query_text, options.clamp_k(k)), {})
    except Exception as exc:
        return _unavailable(conversation_id, exc)
    rendered = render_hits(list(hits), budget, count, query_text if options.snippets else "")
    if rendered is None:
        return f"No archived message of this conversation matches {_echo(query_text)!r}."
    return rendered


def _unavailable(conversation_id: str, exc: Exception) -> str:
    logger.warning("demote: the recall tool failed for conversation %r: %r", conversation_id, exc)
    return (
        f"The archive could not be read just now ({type(exc).__name__}); "
        "continue without it or try again later."
    )
