"""One search of the PostgreSQL archive: the SQLite archive's ranking, fed from SQL.

:meth:`demote.archive._search.Searcher.flow` does the ranking and asks for what it needs;
this flow answers from PostgreSQL, as :func:`demote.archive.sqlite._reads.answer`
answers from SQLite, so both archives rank the same candidates the same way:

1. One statement reads the conversation's statistics (message and token counts, vector
   counts, speakers) and, through the archive's own ``to_tsvector``, each query term's
   lexemes with their document frequencies.
2. :func:`~demote.archive._lexical.pick_terms` chooses the terms matched (rarest first,
   within ``MATCH_BUDGET`` messages), and one statement returns the best ``pool``
   candidates by BM25 (:mod:`demote.archive.postgres._statements` gives the formula), which
   query terms each contains (for coverage), and the replies to the questions among them.
3. The pure functions of :mod:`demote.archive._rank` score them; nearest vectors (a cached
   matrix scanned with numpy for ``real[]``, an exact ``<=>`` scan for pgvector) and the
   rows of hits' followers are read when asked for.
"""

from __future__ import annotations

import math
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple

from demote.archive import _rank, _vectors
from demote.archive._lexical import MATCH_BUDGET, pick_terms
from demote.archive._search import Dense, Entities, Lexical, Request, Searcher, Speakers, scope
from demote.archive.postgres._flows import SqlFlow, Stmt
from demote.archive.postgres._statements import Statements
from demote.archive.postgres._text import fold, literal, term_query, weights_of
from demote.errors import EmbeddingModelChanged, StoreError
from demote.records import Recalled

__all__ = ["Matrices", "search"]

# BM25's document frequency counter for each set of searched columns.
_COUNTER = {
    ("text",): 0,
    ("text", "context"): 1,
    ("text", "adjacent"): 2,
    ("text", "context", "adjacent"): 3,
}


class _Stats(NamedTuple):
    conv: int
    total: int
    tokens: int
    vectors: int
    vector_seq: int
    speakers: list[str]
    dims: int | None
    # Per query term: its lexemes, each with (in_text, in_any, in_adj, in_all).
    lexemes: list[list[tuple[str, tuple[int, int, int, int]]]]


def _stats(rows: list[tuple[Any, ...]], terms: int) -> _Stats:
    conv, total, tokens, vectors, seq, speakers, dims = rows[0][:7]
    lexemes: list[list[tuple[str, tuple[int, int, int, int]]]] = [[] for _ in range(terms)]
    for row in rows:
        n, lexeme, in_text, in_any, in_adj, in_all = row[7:]
        if n is not None:
            counts = (int(in_text or 0), int(in_any or 0), int(in_adj or 0), int(in_all or 0))
            lexemes[n - 1].append((lexeme, counts))
    return _Stats(
        int(conv),
        int(total),
        int(tokens),
        int(vectors),
        int(seq),
        list(speakers or []),
        None if dims is None else int(dims),
        lexemes,
    )


def _candidate(row: Sequence[Any], bm25: float) -> _rank.Candidate:
    row_id, idx, role, text, key, context, speaker = row[:7]
    return _rank.Candidate(int(row_id), int(idx), role, text, key, bm25, context, speaker)


def search(
    st: Statements,
    searcher: Searcher,
    request: Request,
    vector: Sequence[float] | None,
    matrices: Matrices,
) -> SqlFlow[list[Recalled]]:
    """Run ``request`` (with the query's ``vector``) against the archive's tables."""
    cid = request.conversation_id
    ids = {"scope": scope(cid), "cid": cid}
    rows = yield Stmt(st.stats, {**ids, "words": [fold(t) for t in request.terms]})
    if not rows:
        return []  # nothing stored in this conversation
    stats = _stats(rows, len(request.terms))
    steps = searcher.flow(request, vector)
    reply: Any = None
    while True:
        try:
            need = steps.send(reply)
        except StopIteration as stop:
            return list(stop.value)
        if isinstance(need, Speakers):
            reply = stats.speakers
        elif isinstance(need, Lexical):
            reply = yield from _lexical(st, searcher.ranking, ids, stats, need, request.terms)
        elif isinstance(need, Entities):
            reply = {}  # the entity index is the SQLite archive's only
        elif isinstance(need, Dense):
            reply = yield from _dense(st, stats, need, matrices)
        else:
            found = yield Stmt(st.rows_at, {**ids, "idx": sorted(need.indexes)})
            reply = [_candidate(r, 0.0) for r in found]


def _lexical(
    st: Statements,
    ranking: _rank.Ranking,
    ids: dict[str, str],
    stats: _Stats,
    need: Lexical,
    asked: Sequence[str],
) -> SqlFlow[tuple[dict[int, float], list[_rank.Candidate]]]:
    weights, pool, coverage_weight, neighbours = ranking[:4]
    terms = need.terms
    # The statistics hold the request's terms; a sub-query's terms are some of them.
    at = {term: n for n, term in enumerate(asked)}
    stats = stats._replace(lexemes=[stats.lexemes[at[t]] for t in terms])
    columns = ("text", "context") if weights[2] > 0 else ("text",)
    searched = (*columns, "adjacent") if weights[3] > 0 else columns
    lexemes = [[lexeme for lexeme, _ in found] for found in stats.lexemes]

    def frequency(n: int, counter: int) -> int:
        return min((counts[counter] for _, counts in stats.lexemes[n]), default=0)

    df = [frequency(n, len(columns) - 1) for n in range(len(terms))]
    picked = set(pick_terms(terms, df))
    chosen = [n for n, term in enumerate(terms) if term in picked]
    if not chosen:
        return {}, []
    letters = weights_of(searched)
    queries = [term_query(lexemes[n], letters) for n in chosen]
    total = stats.total
    idf = [
        max(1e-6, math.log((total - hits + 0.5) / (hits + 0.5)))
        for hits in (frequency(n, _COUNTER[searched]) for n in chosen)
    ]
    scale = max(weights[1:])  # ts_rank_cd takes weights up to 1
    present = [n for n in range(len(terms)) if df[n] > 0]
    covering = (coverage_weight > 0 and len(terms) > 1) or neighbours > 0 or weights[3] > 0
    cover = [term_query(lexemes[n], weights_of(columns)) for n in present] if covering else []
    found = yield Stmt(
        st.candidates(len(queries)),
        {
            **ids,
            **{f"q{i}": q for i, q in enumerate(queries)},
            **{f"idf{i}": w for i, w in enumerate(idf)},
            "match": f"{literal(ids['scope'])}:D & ({' | '.join(f'({q})' for q in queries)})",
            "newest": MATCH_BUDGET,
            "avgdl": stats.tokens / total if total and stats.tokens else 1.0,
            "weights": [w / scale for w in (weights[0], weights[3], weights[2], weights[1])],
            "scale": scale,
            "limit": max(pool, need.k),
            "cover": cover,
            "replies": neighbours > 0,
        },
        prepare=False,
    )
    hits = sorted((r for r in found if r[0] == 0), key=lambda r: (-r[8], r[2]))
    if not hits:
        return {}, []
    rows = [_candidate(r[1:], float(r[8])) for r in hits]
    shares: dict[int, float] = {}
    own: set[int] | None = None
    if covering:
        contains = {int(r[1]): frozenset(present[p - 1] for p in r[9]) for r in hits if r[9]}
        if coverage_weight > 0:
            shares = _rank.coverage(contains, _rank.term_weights(total, df))
        own = set(contains)  # the rows that say a query term themselves
    rows += [_candidate(r[1:], 0.0) for r in found if r[0] == 1]
    return _rank.lexical_scores(rows, shares, coverage_weight, neighbours, own), rows


def _dense(
    st: Statements, stats: _Stats, need: Dense, matrices: Matrices
) -> SqlFlow[dict[int, float]]:
    if stats.dims is None:
        return {}
    if len(need.vector) != stats.dims:
        raise EmbeddingModelChanged(
            f"the query vector has {len(need.vector)} dimensions, the stored vectors {stats.dims}"
        )
    if st.layout.pgvector is None:
        indexes, matrix = yield from matrices.load(st, stats)
        return _vectors.nearest(indexes, matrix, need.vector, need.n)
    text = "[" + ",".join(repr(float(x)) for x in need.vector) + "]"
    rows = yield Stmt(st.nearest, {"conv": stats.conv, "query": text, "n": need.n})
    nearest: dict[int, float] = {}
    for idx, similarity in rows:
        nearest[int(idx)] = max(float(similarity), nearest.get(int(idx), -1.0))
    return nearest


def _unpack(blob: bytes | None, rows: int) -> Any:
    """A 2-D ``real[]`` in PostgreSQL's binary array format, as a float32 matrix."""
    np = _vectors.numpy()
    if blob is None or rows == 0:
        return np.zeros((0, 0), dtype="<f4")
    ndim, flags, _ = struct.unpack_from(">iiI", blob)
    if ndim != 2 or flags != 0:
        raise StoreError("stored vectors are not a matrix of numbers (nulls, or ragged)")
    (count, _), (dims, _) = (struct.unpack_from(">ii", blob, 12 + 8 * i) for i in range(2))
    cells = np.frombuffer(blob, dtype=">i4", offset=12 + 8 * ndim).reshape(-1, 2)
    if count != rows or len(cells) != count * dims or (cells[:, 0] != 4).any():
        raise StoreError("stored vectors do not have the recorded shape")
    values = np.ascontiguousarray(cells[:, 1]).view(">f4")
    return values.astype("<f4").reshape(count, dims)


class _Entry(NamedTuple):
    vectors: int
    seq: int
    indexes: Any
    matrix: Any


class Matrices:
    """Each conversation's vectors as one matrix, cached and extended as vectors arrive.

    A conversation's vectors are only ever added (or deleted all at once, by an erase or a
    re-embedding), and their sequence numbers only grow: the cached matrix is current
    while the conversation's vector count and newest number are the cached ones; when
    only vectors were added, just those are read and appended.

    Args:
        conversations: How many conversations' matrices stay cached.
    """

    def __init__(self, conversations: int = 16) -> None:
        self._cache: OrderedDict[int, _Entry] = OrderedDict()
        self._size = conversations
        self._lock = threading.Lock()

    def clear(self) -> None:
        """Forget every cached matrix."""
        with self._lock:
            self._cache.clear()

    def load(self, st: Statements, stats: _Stats) -> SqlFlow[tuple[Any, Any]]:
        """The conversation's ``(indexes, matrix)``, read only where the cache is stale."""
        np = _vectors.numpy()
        with self._lock:
            hit = self._cache.get(stats.conv)
        if hit is not None and (hit.vectors, hit.seq) == (stats.vectors, stats.vector_seq):
            with self._lock:
                self._cache.move_to_end(stats.conv)
            return hit.indexes, hit.matrix
        for grow in (hit is not None and hit.vectors < stats.vectors, False):
            after = hit.seq if grow and hit is not None else 0
            rows = yield Stmt(st.vectors, {"conv": stats.conv, "after": after}, binary=True)
            idx, blob, top, n, total = rows[0]
            indexes = np.asarray(idx or [], dtype=np.int64)
            matrix = _unpack(blob, int(n))
            if grow and hit is not None:
                if hit.vectors + int(n) != int(total or 0):
                    continue  # some were deleted meanwhile: read them all
                indexes = np.concatenate([hit.indexes, indexes])
                matrix = np.concatenate([hit.matrix, matrix]) if len(matrix) else hit.matrix
            entry = _Entry(
                len(indexes), max(int(top), hit.seq if grow and hit else 0), indexes, matrix
            )
            with self._lock:
                self._cache[stats.conv] = entry
                while len(self._cache) > self._size:
                    self._cache.popitem(last=False)
            return entry.indexes, entry.matrix
        raise AssertionError("unreachable: the second pass reads everything")
