"""Archived messages rendered compactly for a model to read (pure).

What the recall tools answer (:mod:`demote.archive.recall_tool`) is built here. Each hit
is one compact block ``[role, time] body`` (the time is the archive time, UTC, when the
archive recorded it). The body comes from the whole message when the archive kept it
(``Recalled.data``): an assistant message's tool calls read ``name({"arg": ...})``, a tool
result reads ``name → result``, media blocks show as ``[image]``; a text-only row shows
its text. Hits are chosen best first until the token budget (counted with the given
counter over the whole answer, newlines included) is spent. A hit longer than its share
(a third of what is left, so several hits are seen) is shown by its lines that hold most
of the query's terms, with its first line (a file's or a table's title) and ``…`` for
what was left out (:func:`snippet`); the cut names the hit's key, so the model can fetch
the whole message. The chosen hits are shown in conversation order.
"""

from __future__ import annotations

import bisect
import itertools
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from demote.archive._data import row_data
from demote.archive._fts import query_terms
from demote.records import Recalled
from demote.window.tokens import Counter, approximate_tokens

__all__ = [
    "CUT_MARK",
    "MIN_HIT_TOKENS",
    "SHARE",
    "cut_to_tokens",
    "hit_body",
    "hit_header",
    "recalled_from_columns",
    "render_fetched",
    "render_hits",
    "snippet",
]

logger = logging.getLogger("demote")

#: Ends a hit that was cut to the budget (``{key}`` is the archived key).
CUT_MARK = " …[cut; fetch key {key} for all of it]"
#: A search answer keeps room for this many hits: a long hit gets its share of the budget.
SHARE = 3
#: A hit is only shown cut when at least this many tokens of the budget are left for it.
MIN_HIT_TOKENS = 24
_HEADER = "Archived messages of this conversation (oldest first):"


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


def render_fetched(
    hit: Recalled, budget_tokens: int, count: Counter = approximate_tokens, start: int = 0
) -> str:
    """One fetched message as the model reads it: from character ``start``, within the budget.

    A message longer than the budget is shown from its head (or from ``start`` of its
    readable body, :func:`hit_body`) and ends with a mark naming its full size and the
    ``start`` that reads on, so the model can page through a long result or pasted task.
    """
    body = hit_body(hit)
    start = max(0, start)
    header = hit_header(hit)
    if start and start >= len(body):
        return f"{header} (the message has {len(body)} characters: nothing from {start} on)"
    head = f"{header} …(from character {start} of {len(body)})" if start else header
    block = f"{head} {body[start:]}"
    if count(block) <= budget_tokens:
        return block
    total = count(f"{header} {body}")

    def mark(at: int) -> str:
        return f" …[cut: the message is {total} tokens; read on with start={at}]"

    widest = mark(len(body))  # no next start has more digits
    shown = cut_to_tokens(block, budget_tokens, count, widest)
    if not shown:
        return widest.strip()[: budget_tokens * 4]
    kept = shown[: len(shown) - len(widest)]
    return kept + mark(start + max(1, len(kept) - len(head) - 1))


def recalled_from_columns(columns: Mapping[str, Any]) -> Recalled:
    """A :class:`Recalled` from an archive row's columns, by name (score ``0``).

    Reads ``idx``, ``role``, ``text`` and ``key``; the whole message from ``data`` (the
    archives' JSON column, :func:`demote.archive._data.row_data`, or an already decoded
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
