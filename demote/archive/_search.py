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
itself finds a reply by its question's words. A message that says no query term itself
(found by that column, or fetched as a reply) ranks just below the neighbour that lifted
it, so a search for a word returns the message that says it first.

The optional methods (:class:`Methods`, all off by default) act on these scores: query
decomposition merges the rankings of a question's sub-queries (:mod:`._decompose`), the
entity index lifts and lets in the messages linked to a name the query contains
(:mod:`demote.archive.sqlite._entities`, SQLite only), time awareness lifts the messages
dated within the time it names (:mod:`._time`), and a user's reranker re-scores the best
candidates.

With vectors, the query's ``pool`` nearest messages by cosine are fused with the lexical
scores: a weighted sum of min-max-normalised scores, or reciprocal-rank fusion. Then a
query that names a speaker of the conversation multiplies that speaker's messages' scores,
and :func:`~demote.archive._rank.select` takes the best hits (with their followers, as
units) within ``k`` and the token budget. Scores are higher-better and comparable within
one search only. The scoring itself is pure (:mod:`demote.archive._rank`); this module only
asks for the rows it needs, and each archive reads them from its own storage
(:func:`demote.archive.sqlite._reads.answer`, :mod:`demote.archive.postgres._search`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from demote.archive import _decompose, _fts, _rank, _time, _vectors, args
from demote.archive._fts import query_terms
from demote.records import Recalled

__all__ = [
    "Dense",
    "Entities",
    "Lexical",
    "Methods",
    "Need",
    "Request",
    "RowsAt",
    "Searcher",
    "Speakers",
    "scope",
]


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


class Entities(NamedTuple):
    """Need: the messages linked to each known name among ``terms`` (``_entities.linked``)."""

    terms: list[str]
    speakers: list[str]


#: What a search asks of the store it runs on (see :meth:`Searcher.flow`).
Need = Speakers | Lexical | Dense | RowsAt | Entities


#: ``reranker(query, texts) -> one score per text``, higher is better.
Reranker = Callable[[str, list[str]], Sequence[float]]


@dataclass(frozen=True, slots=True)
class Methods:
    """The optional recall methods on top of the ranking (all off by default).

    See :class:`~demote.archive.sqlite.SQLiteArchive` for each option.
    """

    #: Lift of messages linked to a name the query contains (needs the entity index).
    entity_weight: float = 0.0
    #: A name linked to at most this many messages lets them all in as candidates.
    entity_rare: int = 20
    #: Lift of messages dated within the time the query names (:mod:`demote.archive._time`).
    time_weight: float = 0.0
    #: Weight of the sub-queries' rankings (:mod:`demote.archive._decompose`); 0: off.
    decompose: float = 0.0
    #: A user-supplied reranker of the best ``rerank_depth`` candidates, or ``None``.
    reranker: Reranker | None = None
    rerank_depth: int = 20
    rerank_weight: float = 0.5


class Request(NamedTuple):
    """A checked search: conversation, query text and terms, hits wanted, token budget."""

    conversation_id: str
    query: str
    terms: list[str]
    k: int
    budget: int | None


@dataclass(frozen=True, slots=True)
class Searcher:
    """An archive's search options and caches; :meth:`flow` runs one search."""

    ranking: _rank.Ranking
    speaker_weight: float
    fusion: Literal["weighted", "rrf"]
    dense_weight: float
    count: Callable[[str], int]
    stop_words: Collection[str]
    methods: Methods = field(default_factory=Methods)
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
        query = args.query(query)
        k = args.top_k(k)
        budget = args.budget(budget_tokens)
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
        (:func:`demote.archive.sqlite._reads.answer` for SQLite), so the ranking around
        them is written once.
        """
        terms, k, budget = request.terms, request.k, request.budget
        after, methods = self.ranking.after, self.methods
        named: set[str] = set()
        speakers: list[str] = []
        if self.speaker_weight > 0 or methods.decompose > 0 or methods.entity_weight > 0:
            speakers = yield Speakers()
            named = _rank.named_speakers(terms, speakers)
        scores: dict[int, float] = {}
        rows: list[_rank.Candidate] = []
        if terms:
            scores, rows = yield Lexical(terms, k)
        parts = (
            _decompose.parts(request.query, terms, named, self.stop_words)
            if (methods.decompose > 0 and terms)
            else []
        )
        ranked: list[dict[int, float]] = []
        for part_terms, speaker in parts:
            part, part_rows = yield Lexical(part_terms, k)
            rows += part_rows
            at = {r.index: r for r in part_rows}
            ranked.append(_rank.favour_speakers(part, at, {speaker}, self.speaker_weight))
        if ranked:
            scores = _decompose.merge(scores, ranked, methods.decompose)
        if vector is not None:
            dense = yield Dense(vector, max(self.ranking.pool, k))
            scores = self.fuse(scores, dense)
        links: dict[str, frozenset[int]] = {}
        if methods.entity_weight > 0 and terms:
            links = yield Entities(terms, speakers)
        by_index = {r.index: r for r in reversed(rows)}
        let_in = {i for ids in links.values() if len(ids) <= methods.entity_rare for i in ids}
        wanted = {i + d for i in scores.keys() | let_in for d in range(after + 1)}
        wanted -= by_index.keys()
        if wanted:
            by_index.update((r.index, r) for r in (yield RowsAt(frozenset(wanted))))
        scores = _rank.favour_speakers(scores, by_index, named, self.speaker_weight)
        scores = _rank.favour_entities(scores, links, methods.entity_weight, methods.entity_rare)
        if methods.time_weight > 0:
            scores = self.favour_time(request.query, scores, by_index)
        if methods.reranker is not None:
            rerank = methods.reranker
            texts = {i: r.text for i, r in by_index.items()}
            scores = _rank.rerank(
                scores,
                texts,
                lambda batch: rerank(request.query, batch),
                methods.rerank_depth,
                methods.rerank_weight,
            )
        return _rank.select(
            scores,
            by_index,
            k,
            after=after,
            budget=budget,
            cost=self.count,
            packing=self.ranking.packing,
        )

    def favour_time(
        self, query: str, scores: dict[int, float], rows: dict[int, _rank.Candidate]
    ) -> dict[int, float]:
        """Lift the messages dated within the time ``query`` names (:mod:`._time`)."""
        dates = {i: _time.message_date(r.context) for i, r in rows.items()}
        known = [d for d in dates.values() if d is not None]
        found = _time.span(query, max(known) if known else None)
        if found is None:
            return scores
        chosen = {i for i, d in dates.items() if _time.within(d, found)}
        return _rank.favour(scores, chosen, self.methods.time_weight)

    def fuse(self, lexical: dict[int, float], dense: dict[int, float]) -> dict[int, float]:
        """The lexical and dense scores combined by the archive's fusion."""
        if not lexical or not dense:
            return lexical or dense
        if self.fusion == "rrf":
            return _rank.fuse_rrf(lexical, dense)
        return _rank.fuse_weighted(lexical, dense, self.dense_weight)
