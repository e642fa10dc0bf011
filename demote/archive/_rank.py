"""Ranking for the long tail's recall: pure functions over candidate rows.

No SQL and no I/O here: a store (the SQLite archive, later a PostgreSQL one) fetches the
candidates of a query (BM25 matches with the query terms each contains, the messages
next to them, dense similarities when it holds vectors) and these functions turn them
into the answer, so every store that feeds them the same rows gives the same answer.
The module docstring of :mod:`demote.archive.sqlite` gives the formulas in words.

The steps, in order:

1. :func:`term_weights` and :func:`coverage`: each query term's IDF within the
   conversation, and for each candidate the IDF-weighted share of the query it contains.
2. :func:`lexical_scores`: ``s(i) + neighbours * (q * s(i-1) + s(i+1) / 2)`` with
   ``s = bm25 * (1 + coverage * c)`` (``q`` is 2 when message ``i-1`` asks a question).
3. :func:`fuse_weighted` or :func:`fuse_rrf` when there is a dense ranking too.
4. :func:`select`: the best hits, each with the ``after`` messages that follow it as one
   unit, cut to ``k`` units and to a token budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from demote.errors import EmbeddingError
from demote.records import Recalled

__all__ = [
    "Candidate",
    "Ranking",
    "coverage",
    "fuse_rrf",
    "fit",
    "favour",
    "favour_entities",
    "favour_speakers",
    "fuse_weighted",
    "lexical_scores",
    "minmax",
    "named_speakers",
    "rerank",
    "select",
    "term_weights",
]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One stored message a search considers."""

    #: The store's row id (unique within one search).
    id: int
    #: Absolute position in the conversation.
    index: int
    role: str
    text: str
    key: str
    #: BM25 score, higher is better; 0 for a row fetched only as a neighbour.
    bm25: float
    #: The indexed context string (speaker, date), never returned.
    context: str = ""
    #: Who said it, when the context named a speaker (else empty).
    speaker: str = ""


class Ranking(NamedTuple):
    """An archive's ranking options (see :class:`~demote.archive.sqlite.SQLiteArchive`)."""

    #: BM25 weights of the ``scope``, ``text``, ``context`` and ``adjacent`` columns; the
    #: context and the adjacent text are searched only when their weight is positive.
    weights: tuple[float, float, float, float]
    #: How many BM25 candidates are re-scored (at least ``k``).
    pool: int
    #: Weight of the coverage factor.
    coverage: float
    #: Weight of the neighbour lift.
    neighbours: float
    #: How many following messages join a hit as one unit.
    after: int = 0
    #: Budget packing (:func:`packed`): 0 fills the budget best first; above 0, when the
    #: best ``k`` do not fit, they are taken by score per token ** ``packing``.
    packing: float = 0.0


def term_weights(total: int, df: Sequence[int]) -> list[float]:
    """Each term's IDF within a conversation of ``total`` messages (0 for an absent term)."""
    return [math.log(1.0 + (total - n + 0.5) / (n + 0.5)) if n > 0 else 0.0 for n in df]


def coverage(contains: Mapping[int, frozenset[int]], weights: Sequence[float]) -> dict[int, float]:
    """For each candidate id, the IDF-weighted share of the query's terms it contains.

    Args:
        contains: Candidate id to the positions of the query terms it contains.
        weights: Each term's weight (:func:`term_weights`).

    Returns:
        Shares in ``[0, 1]``; empty for a query of one term (its share would only repeat
        BM25) or of terms in no message.
    """
    total = sum(weights)
    if len(weights) < 2 or total <= 0:
        return {}
    return {row_id: sum(weights[n] for n in terms) / total for row_id, terms in contains.items()}


def lexical_scores(
    rows: Sequence[Candidate],
    shares: Mapping[int, float],
    coverage_weight: float,
    neighbours: float,
    own: Collection[int] | None = None,
) -> dict[int, float]:
    """Each row's score by index: ``s(i) + neighbours * (q * s(i-1) + s(i+1) / 2)``.

    ``s = bm25 * (1 + coverage_weight * share)``; ``q`` is 2 when message ``i-1`` (among
    the rows) asks a question. A reply inherits from the turn it answers, and a turn gets
    half as much from its reply.

    ``own`` holds the ids of the rows whose own text or context contains a query term.
    When it is given, a row that is not one of them (found by its neighbours' text, or
    fetched as a reply) ranks just below the best of its neighbours that is: lifted by
    them, never above them, so a search for a word returns the message that says it
    before the one next to it.
    """
    base: dict[int, float] = {}
    for row in rows:
        score = row.bm25 * (1.0 + coverage_weight * shares.get(row.id, 0.0))
        base[row.index] = max(score, base.get(row.index, 0.0))
    asks = {row.index for row in rows if "?" in row.text}
    scores: dict[int, float] = {}
    for index, mine in base.items():
        before = base.get(index - 1, 0.0) * (2.0 if index - 1 in asks else 1.0)
        scores[index] = mine + neighbours * (before + 0.5 * base.get(index + 1, 0.0))
    if own is None:
        return scores
    saying = {row.index for row in rows if row.id in own}
    for index in scores.keys() - saying:
        lifting = [scores[j] for j in (index - 1, index + 1) if j in saying]
        if lifting:
            scores[index] = min(scores[index], max(lifting) * (1.0 - 1e-6))
    return scores


def minmax(scores: Mapping[int, float]) -> dict[int, float]:
    """Scores rescaled to ``[0, 1]`` (all 1 when they are all equal)."""
    if not scores:
        return {}
    low, high = min(scores.values()), max(scores.values())
    span = high - low
    return {i: (s - low) / span if span > 0 else 1.0 for i, s in scores.items()}


def fuse_weighted(
    lexical: Mapping[int, float], dense: Mapping[int, float], dense_weight: float
) -> dict[int, float]:
    """``(1 - w) * minmax(lexical) + w * minmax(dense)``; a missing score counts as 0."""
    lex, vec = minmax(lexical), minmax(dense)
    return {
        i: (1.0 - dense_weight) * lex.get(i, 0.0) + dense_weight * vec.get(i, 0.0)
        for i in lex.keys() | vec.keys()
    }


def fuse_rrf(
    lexical: Mapping[int, float], dense: Mapping[int, float], k: int = 60
) -> dict[int, float]:
    """Reciprocal-rank fusion: the sum over both rankings of ``1 / (k + rank)``."""
    fused: dict[int, float] = {}
    for scores in (lexical, dense):
        ranked = sorted(scores, key=lambda i: (-scores[i], i))
        for rank, index in enumerate(ranked, start=1):
            fused[index] = fused.get(index, 0.0) + 1.0 / (k + rank)
    return fused


def named_speakers(terms: Sequence[str], speakers: Sequence[str]) -> set[str]:
    """The ``speakers`` a query names: every word of the name is among its ``terms``."""
    have = set(terms)
    return {s for s in speakers if s and set(s.lower().split()) <= have}


def favour_speakers(
    scores: Mapping[int, float],
    rows: Mapping[int, Candidate],
    speakers: set[str],
    weight: float,
) -> dict[int, float]:
    """Scores of messages said by one of ``speakers`` multiplied by ``1 + weight``.

    A question that names a speaker ("What books has Melanie read?") is mostly answered
    by that speaker's own turns, while the other speaker's turns that address them by
    name ("Thanks, Melanie!") match the name best. Scores must be non-negative.
    """
    if not speakers or weight <= 0:
        return dict(scores)
    factor = 1.0 + weight
    return {
        i: s * factor if i in rows and rows[i].speaker in speakers else s for i, s in scores.items()
    }


def favour(scores: Mapping[int, float], chosen: Collection[int], weight: float) -> dict[int, float]:
    """Scores of the messages at ``chosen`` multiplied by ``1 + weight`` (time, entities)."""
    if not chosen or weight <= 0:
        return dict(scores)
    factor = 1.0 + weight
    return {i: s * factor if i in chosen else s for i, s in scores.items()}


def favour_entities(
    scores: Mapping[int, float],
    links: Mapping[str, frozenset[int]],
    weight: float,
    rare: int,
) -> dict[int, float]:
    """Messages linked to a name the query contains, lifted (and let in, for rare names).

    Every linked message's score is multiplied by ``1 + weight``. The messages of a name
    linked to at most ``rare`` messages join the scores even when they matched nothing:
    at the lowest score among the candidates (before the lift), so they come after the
    linked messages that matched and before the unlinked ones that barely did.
    """
    if not links or weight <= 0:
        return dict(scores)
    floor = min((s for s in scores.values() if s > 0), default=1.0)
    out = dict(scores)
    for indexes in links.values():
        if len(indexes) <= rare:
            for i in indexes:
                out.setdefault(i, floor)
    chosen = set().union(*links.values())
    return favour(out, chosen, weight)


def rerank(
    scores: Mapping[int, float],
    texts: Mapping[int, str],
    reranker: Callable[[list[str]], Sequence[float]],
    depth: int,
    weight: float,
) -> dict[int, float]:
    """The ``depth`` best messages re-scored by ``reranker``, fused with their scores.

    ``(1 - weight) * minmax(score) + weight * minmax(reranker)`` for the reranked ones,
    which then all rank above the others (whose order stays).

    Raises:
        EmbeddingError: The reranker failed, or did not return one number per text.
    """
    top = [i for i in sorted(scores, key=lambda i: (-scores[i], i)) if i in texts][:depth]
    if not top:
        return dict(scores)
    try:
        found = list(reranker([texts[i] for i in top]))
    except Exception as exc:
        raise EmbeddingError(f"reranker: failed: {exc!r:.200}") from exc
    if len(found) != len(top) or not all(
        isinstance(x, int | float) and math.isfinite(x) for x in found
    ):
        raise EmbeddingError(
            f"reranker: must return one finite number per text ({len(top)}), got {len(found)} items"
        )
    given = dict(zip(top, (float(x) for x in found), strict=True))
    fused = fuse_weighted({i: scores[i] for i in top}, given, weight)
    lift = 1.0 + max((scores[i] for i in scores if i not in fused), default=0.0)
    out = {i: s for i, s in scores.items() if i not in fused}
    out.update((i, lift + s) for i, s in fused.items())
    return out


def packed(
    order: Sequence[int],
    score: Callable[[int], float],
    cost: Callable[[int], int],
    k: int,
    budget: int,
    packing: float,
) -> list[int]:
    """``order`` (best first) as a budget is best filled from it: a knapsack's greedy rule.

    When the best ``k`` cost more than ``budget`` together, some must be left out, and
    filling best first can spend the budget on a few long hits. Then the best ``k`` are
    taken by ``score / cost ** packing`` (ties: their order), and the rest follow in their
    order (a shorter one may still fill what is left). Otherwise, and with ``packing``
    0, ``order`` is returned as it is, so a search whose budget is not what binds is
    unchanged.
    """
    top = list(order[:k])
    if packing <= 0 or sum(cost(i) for i in top) <= budget:
        return list(order)
    rank = {i: n for n, i in enumerate(top)}
    top.sort(key=lambda i: (-score(i) / max(cost(i), 1) ** packing, rank[i]))
    return [*top, *order[k:]]


def select(
    scores: Mapping[int, float],
    rows: Mapping[int, Candidate],
    k: int,
    *,
    after: int = 0,
    budget: int | None = None,
    cost: Callable[[str], int] | None = None,
    packing: float = 0.0,
) -> list[Recalled]:
    """The best hits, each with the ``after`` messages that follow it, as units.

    Hits are taken best first (ties: earlier message first). A unit is the hit and those
    of the ``after`` following messages that are in ``rows``; a message already returned
    is not returned again. With a ``budget``, a unit that does not fit what is left is
    cut to its hit, and a hit that does not fit is skipped (a later, shorter one may
    still fit), so the returned messages never cost more than ``budget``.

    Args:
        scores: Score by message index, higher is better.
        rows: The candidate at each index (every scored index, and its followers).
        k: How many units at most.
        after: Following messages per unit.
        budget: Most tokens the returned texts may cost together (``None``: no limit).
        cost: Tokens of one text (required with ``budget``).
        packing: Take the hits by :func:`packed`'s rule when the budget binds (0: best
            first).

    Returns:
        The units best first, each in conversation order; every message carries its
        unit's score.
    """
    picked: list[Recalled] = []
    seen: set[int] = set()
    left = budget
    units = 0
    order = [i for i in sorted(scores, key=lambda i: (-scores[i], i)) if i in rows]
    if packing > 0 and budget is not None and cost is not None:
        order = packed(order, scores.__getitem__, lambda i: cost(rows[i].text), k, budget, packing)
    for index in order:
        if units >= k or (left is not None and left <= 0):
            break
        if index in seen or index not in rows:
            continue
        members = [index, *(i for i in range(index + 1, index + 1 + after) if i in rows)]
        members = [i for i in members if i not in seen]
        if left is not None and cost is not None:
            costs = [cost(rows[i].text) for i in members]
            if sum(costs) > left:
                members, costs = members[:1], costs[:1]
                if costs[0] > left:
                    continue
            left -= sum(costs)
        units += 1
        seen.update(members)
        score = scores[index]
        picked.extend(
            Recalled(role=rows[i].role, text=rows[i].text, index=i, key=rows[i].key, score=score)
            for i in sorted(members)
        )
    return picked


def fit(
    hits: Sequence[Recalled],
    budget: int | None,
    cost: Callable[[str], int],
    *,
    k: int | None = None,
    packing: float = 0.0,
) -> list[Recalled]:
    """``hits`` (best first) cut to ``budget`` tokens (and ``k``) by :func:`select`'s rule.

    A hit that does not fit what is left is skipped, and a later, shorter one may still
    fit. For stores that rank by themselves (mem0), and to read a budget from one ranking.
    """
    if budget is None:
        return list(hits)[:k]
    if packing > 0:
        at = list(range(len(hits)))
        order = packed(
            at,
            lambda i: hits[i].score,
            lambda i: cost(hits[i].text),
            k or len(hits),
            budget,
            packing,
        )
        hits = [hits[i] for i in order]
    kept: list[Recalled] = []
    for hit in hits:
        if budget <= 0:
            break
        tokens = cost(hit.text)
        if tokens <= budget:
            kept.append(hit)
            budget -= tokens
    return kept[:k]
