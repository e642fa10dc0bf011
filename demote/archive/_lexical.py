"""The SQL side of the SQLite archive's lexical recall: statistics and candidate rows.

Everything here talks to the archive's connection (inside its lock and, for a search, one
transaction); the ranking itself is pure and lives in :mod:`demote.archive._rank`, so
another store can reuse it. Every FTS5 expression passed in is built from quoted terms
(:mod:`demote.archive._fts`), and every conversation id is a bound parameter.

Per conversation the archive keeps its message count and, per index token, how many of
its messages contain it (in the text; in the text or the context): a search reads these
statistics instead of counting, and :func:`pick_terms` uses them to bound its work.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence

from demote.archive._fts import match_any, matches, quote, term_counts
from demote.archive._rank import Candidate, Ranking, coverage, lexical_scores, term_weights

__all__ = [
    "MATCH_BUDGET",
    "STATS_SCHEMA",
    "add_terms",
    "candidates",
    "containment",
    "drop_terms",
    "pick_terms",
    "rebuild_terms",
    "rows_at",
    "score",
    "speakers",
    "term_stats",
]

#: The per-conversation statistics a search reads (created with the archive's schema).
STATS_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS conversations (
        id INTEGER PRIMARY KEY, conversation_id TEXT NOT NULL UNIQUE, messages INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS speakers (
        conversation_id TEXT NOT NULL, speaker TEXT NOT NULL,
        PRIMARY KEY (conversation_id, speaker)
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS terms (
        conversation INTEGER NOT NULL, term TEXT NOT NULL,
        in_text INTEGER NOT NULL, in_any INTEGER NOT NULL,
        PRIMARY KEY (conversation, term)
    ) WITHOUT ROWID""",
)

#: How many of a conversation's messages the BM25 pass may match, summed over the query
#: terms it uses (see :func:`pick_terms`); this is what bounds the cost of a search.
MATCH_BUDGET = 1000

_COLUMNS = "m.id, m.idx, m.role, m.text, m.key, m.context, m.speaker"


def _candidate(row: tuple[int, int, str, str, str, str, str, float]) -> Candidate:
    row_id, idx, role, text, key, context, speaker, bm25 = row
    return Candidate(row_id, idx, role, text, key, bm25, context, speaker)


def score(
    db: sqlite3.Connection,
    conversation_id: str,
    scope: str,
    terms: Sequence[str],
    tokens: Sequence[tuple[str, ...]],
    ranking: Ranking,
    k: int,
) -> tuple[dict[int, float], list[Candidate]]:
    """The lexical scores of a query's candidates in one conversation, and the rows.

    Args:
        db: The archive's connection, inside a transaction (the scratch table is used).
        conversation_id: The conversation searched.
        scope: Its scope token (see :mod:`demote.archive.sqlite`).
        terms: The query terms (:func:`~demote.archive._fts.query_terms`).
        tokens: Each term's index tokens (:func:`~demote.archive._fts.stems`).
        ranking: The archive's options.
        k: How many hits the caller wants (the pool is at least this big).

    Returns:
        Score by message index (:func:`~demote.archive._rank.lexical_scores`), and the
        candidate rows: the BM25 pool plus the replies to its questions.
    """
    weights, pool, coverage_weight, neighbours = ranking[:4]
    columns = ("text", "context") if weights[2] > 0 else ("text",)
    searched = (*columns, "adjacent") if weights[3] > 0 else columns
    total, df = term_stats(db, conversation_id, tokens, len(columns) > 1)
    chosen = pick_terms(terms, df)
    if not chosen:
        return {}, []
    expression = f"scope : {quote(scope)} AND {match_any(chosen, searched)}"
    rows = candidates(db, conversation_id, expression, weights, max(pool, k))
    if not rows:
        return {}, []
    shares: dict[int, float] = {}
    own: set[int] | None = None
    if (coverage_weight > 0 and len(terms) > 1) or neighbours > 0 or weights[3] > 0:
        present = [n for n in range(len(terms)) if df[n] > 0]
        contains = containment(db, rows, terms, present, columns)
        if coverage_weight > 0:
            shares = coverage(contains, term_weights(total, df))
        own = set(contains)  # the rows that say a query term themselves
    if neighbours > 0:
        # A reply ("The Minnesota Wolves!") often shares no word with the query that
        # matched its question ("which team did you sign with?"), yet holds the answer.
        have = {r.index for r in rows}
        rows += rows_at(db, conversation_id, {r.index + 1 for r in rows if "?" in r.text} - have)
    return lexical_scores(rows, shares, coverage_weight, neighbours, own), rows


def candidates(
    db: sqlite3.Connection,
    conversation_id: str,
    expression: str,
    weights: tuple[float, float, float, float],
    limit: int,
    newest: int = MATCH_BUDGET,
) -> list[Candidate]:
    """The ``limit`` best BM25 matches of ``expression`` in one conversation, best first.

    Only the ``newest`` matches are scored (the latest stored), which changes nothing
    while :func:`pick_terms` keeps the matches within its budget, and only the ``limit``
    best of them are joined to their messages. BM25 is negated: higher is better.
    """
    rows = db.execute(
        f"SELECT {_COLUMNS}, c.score FROM ("
        "  SELECT id, score FROM ("
        "    SELECT rowid AS id, -bm25(messages_fts, ?, ?, ?, ?) AS score FROM messages_fts"
        "    WHERE messages_fts MATCH ? ORDER BY rowid DESC LIMIT ?"
        "  ) ORDER BY score DESC, id LIMIT ?"
        ") AS c JOIN messages AS m ON m.id = c.id WHERE m.conversation_id = ? "
        "ORDER BY c.score DESC, m.idx",
        (*weights, expression, newest, limit, conversation_id),
    ).fetchall()
    return [_candidate(r) for r in rows]


def rows_at(
    db: sqlite3.Connection, conversation_id: str, indexes: Iterable[int]
) -> list[Candidate]:
    """The stored messages of ``conversation_id`` at ``indexes`` (BM25 score 0)."""
    wanted = sorted(set(indexes))
    found: list[Candidate] = []
    for start in range(0, len(wanted), 500):
        chunk = wanted[start : start + 500]
        marks = ",".join("?" * len(chunk))
        found.extend(
            _candidate((*r, 0.0))
            for r in db.execute(
                f"SELECT {_COLUMNS} FROM messages AS m "
                f"WHERE m.conversation_id = ? AND m.idx IN ({marks})",
                (conversation_id, *chunk),
            )
        )
    return found


def containment(
    db: sqlite3.Connection,
    rows: Sequence[Candidate],
    terms: Sequence[str],
    present: Sequence[int],
    columns: tuple[str, ...],
) -> dict[int, frozenset[int]]:
    """For each candidate id, which of the query ``terms`` (positions) it contains.

    Only the terms at ``present`` are tested (the others are in no message). Decided by
    matching each term against the candidates alone, in the scratch table, so stemming
    is the index's own.
    """
    if not present or not rows:
        return {}
    found = matches(
        db,
        [(r.id, r.text, r.context) for r in rows],
        [match_any([terms[n]], columns) for n in present],
    )
    sets: dict[int, set[int]] = {}
    for n, ids in zip(present, found, strict=True):
        for row_id in ids:
            sets.setdefault(row_id, set()).add(n)
    return {row_id: frozenset(s) for row_id, s in sets.items()}


def speakers(db: sqlite3.Connection, conversation_id: str) -> list[str]:
    """The speakers named in ``conversation_id``'s stored contexts."""
    return [
        s
        for (s,) in db.execute(
            "SELECT speaker FROM speakers WHERE conversation_id = ?", (conversation_id,)
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
    """Forget ``conversation_id``'s statistics (its messages are being deleted).

    Deletes its rows of ``conversations``, ``terms`` and ``speakers`` through ``db``, a
    connection to a :class:`~demote.archive.sqlite.SQLiteArchive` file, in the caller's
    write transaction: the first step of an erase (:meth:`SQLiteArchive.erase
    <demote.archive.sqlite.SQLiteArchive.erase>` runs it, then deletes the messages and
    merges the full-text index). It is public so that ``python -m bench.erase_cost`` can
    time an erase without that merge; whoever calls it deletes the conversation's
    messages in the same transaction, or the archive's statistics no longer match them.
    """
    db.execute("DELETE FROM speakers WHERE conversation_id = ?", (conversation_id,))
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
