"""Query processing for the SQLite archive's full-text recall.

User text never reaches FTS5 as syntax. :func:`query_terms` splits it into plain word
tokens (Unicode letters and digits), lowercases them, drops English stop words and
duplicates; :func:`quote` turns each term into an FTS5 string literal, so characters such
as ``"``, ``*``, ``:``, ``-``, ``^`` or the words ``AND``/``OR``/``NOT``/``NEAR`` are only
ever matched as text. Stemming is left to the index's ``porter`` tokenizer, which stems a
quoted query term the same way it stemmed the stored text.

Where the archive needs the index's own tokens outside the index (its per-conversation
term statistics, the stems of query terms, which of a few candidate messages contain which
query term), it tokenizes through a *scratch* table: a contentless FTS5 table in the
connection's ``temp`` schema with the index's columns and tokenizer, plus an ``fts5vocab``
table over it. :func:`create_scratch` makes them; :func:`stems`, :func:`term_counts` and
:func:`matches` fill the scratch table, read it and empty it again, and must run inside a
transaction (a scratch insert outside one costs a journal sync of its own).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Sequence

__all__ = [
    "MAX_TERMS",
    "STOP_WORDS",
    "Stems",
    "create_scratch",
    "match_any",
    "matches",
    "query_terms",
    "quote",
    "stems",
    "term_counts",
]

#: Queries are cut to this many distinct terms, which bounds the cost of one search.
MAX_TERMS = 64

# Word characters minus the underscore: the same split unicode61 makes by default.
_WORD = re.compile(r"[^\W_]+", re.UNICODE)

_STOP_TEXT = """
    a about above after again against all almost also am an and any are aren as at
    be because been before being below between both but by can cannot could couldn
    d did didn do does doesn doing don done down during each either else ever every
    few for from further get gets getting got had hadn has hasn have haven having he her
    here hers herself him himself his how however i if in into is isn it its itself
    just let ll m may me might mightn more most much must mustn my myself need no nor
    not now o of off often on once only or other others our ours ourselves out over own
    quite rather re really s said same say says shall shan she should shouldn so some
    such t than that the their theirs them themselves then there these they this those
    through to too under until up upon us ve very was wasn we were weren what whatever
    when whenever where whereas whether which while who whom whose why will with won
    would wouldn y yes yet you your yours yourself yourselves
"""
#: English stop words: function words, pronouns, auxiliaries and the question words a
#: query usually starts with. They carry no topic, so they are dropped from queries.
STOP_WORDS: frozenset[str] = frozenset(_STOP_TEXT.split())


def query_terms(query: str, stop_words: Iterable[str] = STOP_WORDS) -> list[str]:
    """The distinct, lowercased, non-stop-word terms of ``query``, in first-seen order.

    Args:
        query: Free user text; any characters are allowed.
        stop_words: Lowercased words to drop.

    Returns:
        At most :data:`MAX_TERMS` terms; empty when nothing but stop words remains.
    """
    stops = stop_words if isinstance(stop_words, frozenset | set) else frozenset(stop_words)
    seen: dict[str, None] = {}
    for match in _WORD.finditer(query.lower()):
        term = match.group()
        if term in stops or term in seen:
            continue
        seen[term] = None
        if len(seen) >= MAX_TERMS:
            break
    return list(seen)


def quote(term: str) -> str:
    """``term`` as an FTS5 string literal (embedded double quotes are doubled)."""
    return '"' + term.replace('"', '""') + '"'


def match_any(terms: Iterable[str], columns: Iterable[str]) -> str:
    """An FTS5 expression matching any of ``terms`` in any of ``columns``.

    Args:
        terms: Plain terms (see :func:`query_terms`); each is quoted.
        columns: Names of the FTS columns to search (trusted identifiers).

    Returns:
        For example ``{text context} : ("run" OR "park")``.
    """
    body = " OR ".join(quote(t) for t in terms)
    return "{" + " ".join(columns) + "} : (" + body + ")"


# The scratch table tokenizes exactly as ``messages_fts`` does (same columns, same
# tokenizer); contentless, so it keeps only the index, and "delete-all" empties it.
_SCRATCH = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.demote_scratch USING fts5("
    "text, context, content='', tokenize='porter unicode61')",
    "CREATE VIRTUAL TABLE IF NOT EXISTS temp.demote_scratch_terms "
    "USING fts5vocab(temp, demote_scratch, 'instance')",
)
_CLEAR = "INSERT INTO temp.demote_scratch (demote_scratch) VALUES ('delete-all')"


def create_scratch(db: sqlite3.Connection) -> None:
    """Create the connection's scratch table (and its vocabulary table) if missing."""
    db.execute("PRAGMA temp_store = MEMORY")
    for statement in _SCRATCH:
        db.execute(statement)


def stems(db: sqlite3.Connection, terms: Sequence[str]) -> list[tuple[str, ...]]:
    """The index tokens of each of ``terms``.

    Usually one stem; none for a term the tokenizer drops, several when it splits one.
    """
    db.executemany(
        "INSERT INTO temp.demote_scratch (rowid, text) VALUES (?, ?)",
        [(n, term) for n, term in enumerate(terms, start=1)],
    )
    found: list[list[str]] = [[] for _ in terms]
    for term, doc in db.execute(
        "SELECT term, doc FROM temp.demote_scratch_terms ORDER BY doc, offset"
    ):
        found[doc - 1].append(term)
    db.execute(_CLEAR)
    return [tuple(tokens) for tokens in found]


class Stems:
    """A cache of :func:`stems` (the tokenizer is fixed, so its answers never go stale).

    Args:
        size: Entries kept; the cache is emptied when it would grow past this.
    """

    def __init__(self, size: int = 50_000) -> None:
        self._size = size
        self._cache: dict[str, tuple[str, ...]] = {}

    def __call__(self, db: sqlite3.Connection, terms: Sequence[str]) -> list[tuple[str, ...]]:
        """Each of ``terms``' index tokens; new terms go through the scratch table."""
        cache = self._cache
        new = [t for t in dict.fromkeys(terms) if t not in cache]
        if new:
            if len(cache) + len(new) > self._size:
                cache.clear()
            cache.update(zip(new, stems(db, new), strict=True))
        return [cache[t] for t in terms]


def term_counts(
    db: sqlite3.Connection, rows: Iterable[tuple[str, str]]
) -> list[tuple[str, int, int]]:
    """Each token of ``(text, context)`` rows, with how many rows hold it.

    Returns:
        ``(token, rows with it in the text, rows with it in the text or the context)``.
    """
    db.executemany("INSERT INTO temp.demote_scratch (text, context) VALUES (?, ?)", rows)
    counts: list[tuple[str, int, int]] = db.execute(
        "SELECT term, count(DISTINCT doc) FILTER (WHERE col = 'text'), count(DISTINCT doc) "
        "FROM temp.demote_scratch_terms GROUP BY term"
    ).fetchall()
    db.execute(_CLEAR)
    return counts


def matches(
    db: sqlite3.Connection, docs: Iterable[tuple[int, str, str]], expressions: Sequence[str]
) -> list[set[int]]:
    """Which of ``docs`` (``(id, text, context)``) match each FTS5 expression.

    The expressions name the columns ``text`` and ``context`` as ``messages_fts`` does, so
    an expression matches a document here exactly when it matches the stored message.
    """
    db.executemany("INSERT INTO temp.demote_scratch (rowid, text, context) VALUES (?, ?, ?)", docs)
    found = [
        {
            rowid
            for (rowid,) in db.execute(
                "SELECT rowid FROM temp.demote_scratch WHERE demote_scratch MATCH ?", (expression,)
            )
        }
        for expression in expressions
    ]
    db.execute(_CLEAR)
    return found
