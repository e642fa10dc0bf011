"""Ranking for the SQLite archive: BM25 candidates, re-scored by coverage and neighbours.

The functions here run inside :class:`~demote.hooks.archive.SQLiteArchive`'s lock on its
connection; the module docstring of :mod:`demote.hooks.archive` gives the formula. Every
FTS5 expression passed in is built from quoted terms (:mod:`demote.hooks._fts`), and every
conversation id is a bound parameter.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Sequence
from typing import NamedTuple

from demote.hooks._fts import match_any, matches, quote, term_counts
from demote.records import Recalled

__all__ = [
    "MATCH_BUDGET",
    "STATS_SCHEMA",
    "Ranking",
    "Row",
    "add_terms",
    "candidates",
    "drop_terms",
    "pick_terms",
    "rebuild_terms",
    "replies",
    "rescore",
    "search",
    "term_coverage",
    "term_stats",
]

#: The per-conversation statistics a search reads (created with the archive's schema).
STATS_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS conversations (
        id INTEGER PRIMARY KEY, conversation_id TEXT NOT NULL UNIQUE, messages INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS terms (
        conversation INTEGER NOT NULL, term TEXT NOT NULL,
        in_text INTEGER NOT NULL, in_any INTEGER NOT NULL,
        PRIMARY KEY (conversation, term)
    ) WITHOUT ROWID""",
)

#: A search candidate: id, index, role, text, key, BM25 score (higher is better), context.
Row = tuple[int, int, str, str, str, float, str]

#: How many of a conversation's messages the BM25 pass may match, summed over the query
#: terms it uses (see :func:`pick_terms`); this is what bounds the cost of a search.
MATCH_BUDGET = 1000


class Ranking(NamedTuple):
    """An archive's ranking options (see :class:`~demote.hooks.archive.SQLiteArchive`)."""

    #: BM25 weights of the ``scope``, ``text`` and ``context`` columns; the context is
    #: searched only when its weight is positive.
    weights: tuple[float, float, float]
    #: How many BM25 candidates are re-scored (at least ``k``).
    pool: int
    #: Weight of the coverage factor.
    coverage: float
    #: Weight of the neighbour lift.
    neighbours: float


def search(
    db: sqlite3.Connection,
    conversation_id: str,
    scope: str,
    terms: Sequence[str],
    tokens: Sequence[tuple[str, ...]],
    ranking: Ranking,
    k: int,
) -> list[Recalled]:
    """The ``k`` best messages of ``conversation_id`` for the query ``terms``.

    Args:
        db: The archive's connection, inside a transaction (the scratch table is used).
        conversation_id: The conversation searched.
        scope: Its scope token (see :mod:`demote.hooks.archive`).
        terms: The query terms (:func:`~demote.hooks._fts.query_terms`).
        tokens: Each term's index tokens (:func:`~demote.hooks._fts.stems`).
        ranking: The archive's options.
        k: How many messages to return at most.

    Returns:
        Best first.
    """
    weights, pool, coverage, neighbours = ranking
    columns = ("text", "context") if weights[2] > 0 else ("text",)
    total, df = term_stats(db, conversation_id, tokens, len(columns) > 1)
    chosen = pick_terms(terms, df)
    if not chosen:
        return []
    expression = f"scope : {quote(scope)} AND {match_any(chosen, columns)}"
    rows = candidates(db, conversation_id, expression, weights, max(pool, k))
    if not rows:
        return []
    shares = (
        term_coverage(db, terms, df, total, columns, rows)
        if coverage > 0 and len(terms) > 1
        else {}
    )
    if neighbours > 0:
        rows += replies(db, conversation_id, rows)
    return rescore(rows, shares, coverage, neighbours)[:k]


def candidates(
    db: sqlite3.Connection,
    conversation_id: str,
    expression: str,
    weights: tuple[float, float, float],
    limit: int,
    newest: int = MATCH_BUDGET,
) -> list[Row]:
    """The ``limit`` best BM25 matches of ``expression`` in one conversation.

    Only the ``newest`` matches are scored (the latest stored), which changes nothing
    while :func:`pick_terms` keeps the matches within its budget, and only the ``limit``
    best of them are joined to their messages.
    """
    rows: list[Row] = db.execute(
        "SELECT m.id, m.idx, m.role, m.text, m.key, c.score, m.context FROM ("
        "  SELECT id, score FROM ("
        "    SELECT rowid AS id, -bm25(messages_fts, ?, ?, ?) AS score FROM messages_fts"
        "    WHERE messages_fts MATCH ? ORDER BY rowid DESC LIMIT ?"
        "  ) ORDER BY score DESC, id LIMIT ?"
        ") AS c JOIN messages AS m ON m.id = c.id WHERE m.conversation_id = ? "
        "ORDER BY c.score DESC, m.idx",
        (*weights, expression, newest, limit, conversation_id),
    ).fetchall()
    return rows


def replies(db: sqlite3.Connection, conversation_id: str, rows: list[Row]) -> list[Row]:
    """The replies to candidate questions that are not candidates themselves (score 0).

    A reply ("The Minnesota Wolves!") often shares no word with the query that matched
    its question ("which team did you sign with?"), yet holds the answer.
    """
    have = {r[1] for r in rows}
    wanted = sorted({r[1] + 1 for r in rows if "?" in r[3]} - have)
    if not wanted:
        return []
    marks = ",".join("?" * len(wanted))
    return [
        (row_id, idx, role, text, key, 0.0, "")
        for row_id, idx, role, text, key in db.execute(
            "SELECT id, idx, role, text, key FROM messages "
            f"WHERE conversation_id = ? AND idx IN ({marks})",
            (conversation_id, *wanted),
        )
    ]


# -- term statistics -------------------------------------------------------------------


def add_terms(
    db: sqlite3.Connection, conversation_id: str, rows: Sequence[tuple[str, str]]
) -> None:
    """Count newly stored ``(text, context)`` rows into ``conversation_id``'s statistics."""
    if not rows:
        return
    db.execute(
        "INSERT INTO conversations (conversation_id, messages) VALUES (?, ?) "
        "ON CONFLICT (conversation_id) DO UPDATE SET messages = messages + excluded.messages",
        (conversation_id, len(rows)),
    )
    (number,) = db.execute(
        "SELECT id FROM conversations WHERE conversation_id = ?", (conversation_id,)
    ).fetchone()
    db.executemany(
        "INSERT INTO terms (conversation, term, in_text, in_any) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (conversation, term) DO UPDATE SET "
        "in_text = in_text + excluded.in_text, in_any = in_any + excluded.in_any",
        [(number, term, in_text, in_any) for term, in_text, in_any in term_counts(db, rows)],
    )


def rebuild_terms(db: sqlite3.Connection, chunk: int = 2000) -> None:
    """Recount every conversation's statistics from its stored messages (a migration)."""
    db.execute("DELETE FROM terms")
    db.execute("DELETE FROM conversations")
    ids = [c for (c,) in db.execute("SELECT DISTINCT conversation_id FROM messages")]
    for conversation_id in ids:
        last = None
        while True:
            rows = db.execute(
                "SELECT id, text, context FROM messages WHERE conversation_id = ? "
                "AND (? IS NULL OR id > ?) ORDER BY id LIMIT ?",
                (conversation_id, last, last, chunk),
            ).fetchall()
            if not rows:
                break
            add_terms(db, conversation_id, [(text, context) for _, text, context in rows])
            last = rows[-1][0]


def drop_terms(db: sqlite3.Connection, conversation_id: str) -> None:
    """Forget ``conversation_id``'s statistics (its messages are being deleted)."""
    db.execute(
        "DELETE FROM terms WHERE conversation = "
        "(SELECT id FROM conversations WHERE conversation_id = ?)",
        (conversation_id,),
    )
    db.execute("DELETE FROM conversations WHERE conversation_id = ?", (conversation_id,))


def term_stats(
    db: sqlite3.Connection,
    conversation_id: str,
    tokens: Sequence[tuple[str, ...]],
    in_context: bool,
) -> tuple[int, list[int]]:
    """How many messages ``conversation_id`` holds, and each term's document frequency.

    Frequencies count the text, or the text and the context when ``in_context``.

    ``tokens`` holds each term's index tokens. A term of several tokens (a phrase) gets
    the smallest of their frequencies, an upper bound; a term of none gets 0.
    """
    row = db.execute(
        "SELECT id, messages FROM conversations WHERE conversation_id = ?", (conversation_id,)
    ).fetchone()
    wanted = sorted({t for group in tokens for t in group})
    if row is None or not wanted:
        return (0 if row is None else int(row[1])), [0] * len(tokens)
    column = "in_any" if in_context else "in_text"
    marks = ",".join("?" * len(wanted))
    df = dict(
        db.execute(
            f"SELECT term, {column} FROM terms WHERE conversation = ? AND term IN ({marks})",
            (row[0], *wanted),
        ).fetchall()
    )
    return int(row[1]), [min((df.get(t, 0) for t in group), default=0) for group in tokens]


def pick_terms(terms: Sequence[str], df: Sequence[int], budget: int = MATCH_BUDGET) -> list[str]:
    """The terms the BM25 pass matches, in query order.

    Rarest first while their frequencies sum to at most ``budget`` (the rarest always);
    terms absent from the conversation are left out (they would change no score in it).

    A frequent term left out has a low IDF, so it adds little to a message's BM25; it
    still counts towards coverage. When even the rarest term is in more than ``budget``
    messages, :func:`candidates` scores only the newest ``budget`` of them. Below
    ``budget`` messages every present term is kept.
    """
    kept: set[int] = set()
    spent = 0
    for n in sorted((n for n in range(len(terms)) if df[n] > 0), key=lambda n: (df[n], n)):
        if kept and spent + df[n] > budget:
            break
        kept.add(n)
        spent += df[n]
    return [term for n, term in enumerate(terms) if n in kept]


def term_coverage(
    db: sqlite3.Connection,
    terms: Sequence[str],
    df: Sequence[int],
    total: int,
    columns: tuple[str, ...],
    rows: Sequence[Row],
) -> dict[int, float]:
    """For each candidate id, the share of ``terms`` it contains, weighted by IDF.

    IDF is taken within the conversation (``total`` messages, ``df`` from
    :func:`term_stats`; BM25's own statistics span the whole file). Containment is decided
    by matching each term against the candidates alone, in the scratch table.
    """
    present = [n for n in range(len(terms)) if df[n] > 0]
    if not present:
        return {}
    found = matches(
        db,
        [(r[0], r[3], r[6]) for r in rows],
        [match_any([terms[n]], columns) for n in present],
    )
    hits: dict[int, float] = {}
    weight_sum = 0.0
    for n, ids in zip(present, found, strict=True):
        idf = math.log(1.0 + (total - df[n] + 0.5) / (df[n] + 0.5))
        weight_sum += idf
        for row_id in ids:
            hits[row_id] = hits.get(row_id, 0.0) + idf
    return {row_id: w / weight_sum for row_id, w in hits.items()}


def rescore(
    rows: list[Row], coverage: dict[int, float], coverage_weight: float, neighbours: float
) -> list[Recalled]:
    """Score every row as ``s(i) + neighbours * (q * s(i-1) + s(i+1) / 2)``, best first."""
    base: dict[int, float] = {}
    for row_id, idx, _, _, _, bm25, _ in rows:
        score = bm25 * (1.0 + coverage_weight * coverage.get(row_id, 0.0))
        base[idx] = max(score, base.get(idx, 0.0))
    asks = {r[1] for r in rows if "?" in r[3]}
    scored = []
    for _, idx, role, text, key, _, _ in rows:
        # A reply inherits from the turn it answers (twice as much from a question),
        # and a turn gets half as much from its reply.
        before = base.get(idx - 1, 0.0) * (2.0 if idx - 1 in asks else 1.0)
        lift = neighbours * (before + 0.5 * base.get(idx + 1, 0.0))
        scored.append(Recalled(role=role, text=text, index=idx, key=key, score=base[idx] + lift))
    scored.sort(key=lambda r: (-r.score, r.index))
    return scored
