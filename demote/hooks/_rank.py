"""Ranking for the SQLite archive: BM25 candidates, re-scored by coverage and neighbours.

The functions here run inside :class:`~demote.hooks.archive.SQLiteArchive`'s lock on its
connection; the module docstring of :mod:`demote.hooks.archive` gives the formula. Every
FTS5 expression passed in is built from quoted terms (:mod:`demote.hooks._fts`), and every
conversation id is a bound parameter.
"""

from __future__ import annotations

import math
import sqlite3

from demote.hooks._fts import match_any, quote
from demote.records import Recalled

__all__ = ["Row", "candidates", "replies", "rescore", "term_coverage"]

#: A search candidate: id, index, role, text, key, BM25 score (higher is better).
Row = tuple[int, int, str, str, str, float]


def candidates(
    db: sqlite3.Connection,
    conversation_id: str,
    expression: str,
    weights: tuple[float, float, float],
    limit: int,
) -> list[Row]:
    """The ``limit`` best BM25 matches of ``expression`` in one conversation."""
    rows: list[Row] = db.execute(
        "SELECT m.id, m.idx, m.role, m.text, m.key, -bm25(messages_fts, ?, ?, ?) AS score "
        "FROM messages_fts JOIN messages AS m ON m.id = messages_fts.rowid "
        "WHERE messages_fts MATCH ? AND m.conversation_id = ? "
        "ORDER BY score DESC, m.idx LIMIT ?",
        (*weights, expression, conversation_id, limit),
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
        (row_id, idx, role, text, key, 0.0)
        for row_id, idx, role, text, key in db.execute(
            "SELECT id, idx, role, text, key FROM messages "
            f"WHERE conversation_id = ? AND idx IN ({marks})",
            (conversation_id, *wanted),
        )
    ]


def term_coverage(
    db: sqlite3.Connection,
    conversation_id: str,
    scope: str,
    terms: list[str],
    columns: tuple[str, ...],
    ids: list[int],
) -> dict[int, float]:
    """For each candidate id, the share of ``terms`` it contains, weighted by IDF.

    IDF is taken within the conversation (BM25's own statistics span the whole file).
    """
    total = db.execute(
        "SELECT count(*) FROM messages WHERE conversation_id = ?", (conversation_id,)
    ).fetchone()[0]
    marks = ",".join("?" * len(ids))
    hits: dict[int, float] = {}
    weight_sum = 0.0
    for term in terms:
        expression = f"scope : {quote(scope)} AND {match_any([term], columns)}"
        df = db.execute(
            "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?", (expression,)
        ).fetchone()[0]
        if df == 0:
            continue
        idf = math.log(1.0 + (total - df + 0.5) / (df + 0.5))
        weight_sum += idf
        for (row_id,) in db.execute(
            f"SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? AND rowid IN ({marks})",
            (expression, *ids),
        ):
            hits[row_id] = hits.get(row_id, 0.0) + idf
    if weight_sum == 0:
        return {}
    return {row_id: w / weight_sum for row_id, w in hits.items()}


def rescore(
    rows: list[Row], coverage: dict[int, float], coverage_weight: float, neighbours: float
) -> list[Recalled]:
    """Score every row as ``s(i) + neighbours * (q * s(i-1) + s(i+1) / 2)``, best first."""
    base: dict[int, float] = {}
    for row_id, idx, _, _, _, bm25 in rows:
        score = bm25 * (1.0 + coverage_weight * coverage.get(row_id, 0.0))
        base[idx] = max(score, base.get(idx, 0.0))
    asks = {r[1] for r in rows if "?" in r[3]}
    scored = []
    for _, idx, role, text, key, _ in rows:
        # A reply inherits from the turn it answers (twice as much from a question),
        # and a turn gets half as much from its reply.
        before = base.get(idx - 1, 0.0) * (2.0 if idx - 1 in asks else 1.0)
        lift = neighbours * (before + 0.5 * base.get(idx + 1, 0.0))
        scored.append(Recalled(role=role, text=text, index=idx, key=key, score=base[idx] + lift))
    scored.sort(key=lambda r: (-r.score, r.index))
    return scored
