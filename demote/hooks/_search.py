"""One search of the SQLite archive, from checked arguments to the returned messages.

Theory of operation. The query is split into plain terms, stop words are dropped, each
term is quoted (user text is never FTS5 syntax) and the terms are OR-ed. FTS5's BM25
(porter stemming: "running" finds "runs") picks a pool of candidates in one conversation,
and the reply to each candidate that asks a question joins the pool (it may share no word
with the query yet hold the answer). Terms absent from the conversation are left out of
the BM25 pass, and so are the most frequent ones once the terms' document frequencies add
up to more than ``_lexical.MATCH_BUDGET`` (1000) messages, which bounds a search's work in
a long conversation (such terms carry little IDF; they still count towards coverage).

A candidate's score is ``s(i) + neighbours * (q * s(i-1) + s(i+1) / 2)`` with
``s = bm25 * (1 + coverage * c)``: ``c`` is the IDF-weighted share (IDF within the
conversation) of the query's terms the message contains, and ``q`` is 2 when message
``i-1`` asks a question (contains "?"), else 1. Coverage prefers a message that matches
the whole query over one that repeats a word; the neighbour term lifts a reply whose
question matched ("which team did you sign with?" / "The Minnesota Wolves!"). Each message
is also indexed with its neighbours' text (the ``adjacent`` column, weighted low), so BM25
itself finds a reply by its question's words.

With vectors, the query's ``pool`` nearest messages by cosine are fused with the lexical
scores: a weighted sum of min-max-normalised scores, or reciprocal-rank fusion. Then a
query that names a speaker of the conversation multiplies that speaker's messages' scores,
and :func:`~demote.hooks._rank.select` takes the best hits (with their followers, as
units) within ``k`` and the token budget. Scores are higher-better and comparable within
one search only. The scoring itself is pure (:mod:`demote.hooks._rank`); this module only
fetches the rows it needs (:mod:`demote.hooks._lexical`, :mod:`demote.hooks._vectors`).
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from demote.errors import ConfigError
from demote.hooks import _fts, _lexical, _rank, _vectors
from demote.hooks._fts import query_terms
from demote.records import Recalled

__all__ = ["Request", "Searcher", "scope"]


def scope(conversation_id: str) -> str:
    """The conversation's scope token: one alphanumeric token, whatever the id holds."""
    return "c" + hashlib.blake2b(conversation_id.encode("utf-8"), digest_size=16).hexdigest()


class Request(NamedTuple):
    """A checked search: conversation, query text and terms, hits wanted, token budget."""

    conversation_id: str
    query: str
    terms: list[str]
    k: int
    budget: int | None


@dataclass(frozen=True, slots=True)
class Searcher:
    """An archive's search options and caches; :meth:`lookup` runs one search."""

    ranking: _rank.Ranking
    speaker_weight: float
    fusion: Literal["weighted", "rrf"]
    dense_weight: float
    count: Callable[[str], int]
    stop_words: Collection[str]
    stems: _fts.Stems
    vectors: _vectors.VectorIndex

    def request(
        self,
        conversation_id: str,
        query: str,
        k: int,
        budget_tokens: int | None,
        dense: bool,
    ) -> Request | None:
        """Check a search's arguments; ``None`` when it can only find nothing.

        Raises:
            ConfigError: ``budget_tokens`` is negative or not an int.
        """
        budget = budget_tokens
        if budget is not None and (
            isinstance(budget, bool) or not isinstance(budget, int) or budget < 0
        ):
            raise ConfigError(f"budget_tokens must be an int >= 0 or None, got {budget!r}")
        terms = query_terms(query, self.stop_words)
        if k < 1 or budget == 0 or not (terms or (dense and query.strip())):
            return None
        return Request(conversation_id, query, terms, k, budget)

    def lookup(
        self, db: sqlite3.Connection, request: Request, vector: Sequence[float] | None
    ) -> list[Recalled]:
        """Run ``request`` on ``db`` (inside a transaction) with the query's ``vector``."""
        conversation_id, _, terms, k, budget = request
        after = self.ranking.after
        named: set[str] = set()
        if self.speaker_weight > 0:
            named = _rank.named_speakers(terms, _lexical.speakers(db, conversation_id))
        scores: dict[int, float] = {}
        rows: list[_rank.Candidate] = []
        if terms:
            tokens = self.stems(db, terms)
            scores, rows = _lexical.score(
                db, conversation_id, scope(conversation_id), terms, tokens, self.ranking, k
            )
        if vector is not None:
            dense = self.vectors.top(db, conversation_id, vector, max(self.ranking.pool, k))
            scores = self._fuse(scores, dense)
        by_index = {r.index: r for r in reversed(rows)}
        wanted = {i + d for i in scores for d in range(after + 1)} - by_index.keys()
        if wanted:
            by_index.update((r.index, r) for r in _lexical.rows_at(db, conversation_id, wanted))
        scores = _rank.favour_speakers(scores, by_index, named, self.speaker_weight)
        return _rank.select(scores, by_index, k, after=after, budget=budget, cost=self.count)

    def _fuse(self, lexical: dict[int, float], dense: dict[int, float]) -> dict[int, float]:
        if not lexical or not dense:
            return lexical or dense
        if self.fusion == "rrf":
            return _rank.fuse_rrf(lexical, dense)
        return _rank.fuse_weighted(lexical, dense, self.dense_weight)
