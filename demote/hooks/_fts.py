"""Query processing for the SQLite archive's full-text recall.

User text never reaches FTS5 as syntax. :func:`query_terms` splits it into plain word
tokens (Unicode letters and digits), lowercases them, drops English stop words and
duplicates; :func:`quote` turns each term into an FTS5 string literal, so characters such
as ``"``, ``*``, ``:``, ``-``, ``^`` or the words ``AND``/``OR``/``NOT``/``NEAR`` are only
ever matched as text. Stemming is left to the index's ``porter`` tokenizer, which stems a
quoted query term the same way it stemmed the stored text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["MAX_TERMS", "STOP_WORDS", "match_any", "query_terms", "quote"]

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
