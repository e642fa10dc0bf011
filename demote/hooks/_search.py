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
from collections.abc import Callable, Collection, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from demote.hooks import _args, _fts, _lexical, _rank, _vectors
from demote.hooks._fts import query_terms
from demote.records import Recalled

__all__ = ["Dense", "Lexical", "Need", "Request", "RowsAt", "Searcher", "Speakers", "scope"]


def scope(conversation_id: str) -> str:
    """The conversation's scope token: one alphanumeric token, whatever the id holds."""
    return "c" + hashlib.blake2b(conversation_id.encode("utf-8"), digest_size=16).hexdigest()


class Speakers(NamedTuple):
    """Need: the speakers named in the conversation's stored contexts (``list[str]``)."""


class Lexical(NamedTuple):
    """Need: the lexical scores by index and the candidate rows (``_lexical.score``)."""

    terms: list[str]
    k: int


class Dense(NamedTuple):
    """Need: the ``n`` nearest stored vectors to ``vector``, cosine by index."""

    vector: Sequence[float]
    n: int


class RowsAt(NamedTuple):
    """Need: the stored messages at ``indexes`` (``list[Candidate]``, BM25 score 0)."""

    indexes: frozenset[int]


#: What a search asks of the store it runs on (see :meth:`Searcher.flow`).
Need = Speakers | Lexical | Dense | RowsAt


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
    stems: _fts.Stems = field(default_factory=_fts.Stems)
    vectors: _vectors.VectorIndex = field(default_factory=_vectors.VectorIndex)

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
            ArgumentTypeError: ``query`` is not a ``str``.
            ConfigError: ``k`` or ``budget_tokens`` is not an int in range.
        """
        query = _args.query(query)
        k = _args.top_k(k)
        budget = _args.budget(budget_tokens)
        terms = query_terms(query, self.stop_words)
        if k < 1 or budget == 0 or not (terms or (dense and query.strip())):
            return None
        return Request(conversation_id, query, terms, k, budget)

    def flow(
        self, request: Request, vector: Sequence[float] | None
    ) -> Generator[Need, Any, list[Recalled]]:
        """One search as a generator of the store reads it needs.

        It yields what it needs from the store (a :data:`Need`), is sent the answer, and
        returns the hits. Every archive answers the same needs from its own storage
        (:meth:`lookup` for SQLite), so the ranking around them is written once.
        """
        terms, k, budget = request.terms, request.k, request.budget
        after = self.ranking.after
        named: set[str] = set()
        if self.speaker_weight > 0:
            named = _rank.named_speakers(terms, (yield Speakers()))
        scores: dict[int, float] = {}
        rows: list[_rank.Candidate] = []
        if terms:
            scores, rows = yield Lexical(terms, k)
        if vector is not None:
            dense = yield Dense(vector, max(self.ranking.pool, k))
            scores = self.fuse(scores, dense)
        by_index = {r.index: r for r in reversed(rows)}
        wanted = {i + d for i in scores for d in range(after + 1)} - by_index.keys()
        if wanted:
            by_index.update((r.index, r) for r in (yield RowsAt(frozenset(wanted))))
        scores = _rank.favour_speakers(scores, by_index, named, self.speaker_weight)
        return _rank.select(scores, by_index, k, after=after, budget=budget, cost=self.count)

    def lookup(
        self, db: sqlite3.Connection, request: Request, vector: Sequence[float] | None
    ) -> list[Recalled]:
        """Run ``request`` on ``db`` (inside a transaction) with the query's ``vector``."""
        conversation_id = request.conversation_id
        steps = self.flow(request, vector)
        reply: Any = None
        while True:
            try:
                need = steps.send(reply)
            except StopIteration as stop:
                return list(stop.value)
            if isinstance(need, Speakers):
                reply = _lexical.speakers(db, conversation_id)
            elif isinstance(need, Lexical):
                reply = _lexical.score(
                    db,
                    conversation_id,
                    scope(conversation_id),
                    need.terms,
                    self.stems(db, need.terms),
                    self.ranking,
                    need.k,
                )
            elif isinstance(need, Dense):
                reply = self.vectors.top(db, conversation_id, need.vector, need.n)
            else:
                reply = _lexical.rows_at(db, conversation_id, need.indexes)

    def fuse(self, lexical: dict[int, float], dense: dict[int, float]) -> dict[int, float]:
        """The lexical and dense scores combined by the archive's fusion."""
        if not lexical or not dense:
            return lexical or dense
        if self.fusion == "rrf":
            return _rank.fuse_rrf(lexical, dense)
        return _rank.fuse_weighted(lexical, dense, self.dense_weight)
