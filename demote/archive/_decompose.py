"""Query decomposition for multi-hop questions, without a model.

Theory of operation. A question that names two people ("What have Caroline and Melanie
both painted?") or joins two asks ("What did Jon buy and where did he go afterwards?") is
answered by several messages, each matching only part of it; one ranking of the whole
query favours the messages that match most of it, which are seldom all of the answers.
:func:`parts` splits the query's terms into sub-queries:

- one per named speaker, each keeping the other terms and dropping the other speakers'
  names (each is ranked with that speaker favoured);
- else one per clause joined by "and" / "or" / ";" when each clause keeps at least two
  terms of its own (the terms of the query's speakers go with every clause).

Each sub-query is ranked like the query itself, and :func:`merge` gives every message the
best of its min-max-normalised scores: the whole query's, and ``weight`` times each
part's. A query with no parts keeps its ranking unchanged. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence

from demote.archive._fts import query_terms
from demote.archive._rank import minmax

__all__ = ["Part", "merge", "parts"]

#: A sub-query: its terms, and the speaker it favours (``""``: none).
Part = tuple[list[str], str]

_JOIN = re.compile(r"\b(?:and|or)\b|;", re.IGNORECASE)


def parts(
    query: str, terms: Sequence[str], named: Collection[str], stop_words: Collection[str]
) -> list[Part]:
    """The sub-queries of ``query`` (empty when it has one part).

    Args:
        query: The query text.
        terms: Its terms (:func:`~demote.archive._fts.query_terms`).
        named: The conversation's speakers it names.
        stop_words: The archive's stop words (to split clauses into terms alike).
    """
    name_terms = {s: [t for t in terms if t in s.lower().split()] for s in named}
    if len(named) >= 2:
        found: list[Part] = []
        for speaker in sorted(named):
            others = {t for s, ts in name_terms.items() if s != speaker for t in ts}
            kept = [t for t in terms if t not in others]
            if kept:
                found.append((kept, speaker))
        return found
    shared = [t for ts in name_terms.values() for t in ts]
    have = set(terms)  # a clause's terms are the query's (which may have been cut short)
    clauses = [[t for t in query_terms(c, stop_words) if t in have] for c in _JOIN.split(query)]
    own = [[t for t in c if t not in shared] for c in clauses]
    if len(clauses) < 2 or any(len(c) < 2 for c in own):
        return []
    speaker = next(iter(named), "")
    return [(list(dict.fromkeys([*shared, *c])), speaker) for c in own]


def merge(
    whole: Mapping[int, float], ranked: Sequence[Mapping[int, float]], weight: float
) -> dict[int, float]:
    """Each message's best normalised score: the whole query's, or ``weight`` x a part's."""
    merged = dict(minmax(whole))
    for scores in ranked:
        for i, s in minmax(scores).items():
            merged[i] = max(merged.get(i, 0.0), weight * s)
    return merged
