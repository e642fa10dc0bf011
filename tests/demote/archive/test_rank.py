"""The pure ranking functions a PostgresArchive will reuse: same rows, same answer."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from demote.archive import _rank
from demote.archive._rank import Candidate


def row(index: int, text: str = "x", bm25: float = 1.0, speaker: str = "") -> Candidate:
    return Candidate(index + 100, index, "user", text, f"k{index}", bm25, "", speaker)


def test_coverage_weighs_terms_by_idf() -> None:
    weights = _rank.term_weights(100, [1, 50, 0])
    assert weights[0] > weights[1] > 0 == weights[2]
    shares = _rank.coverage({1: frozenset({0}), 2: frozenset({1}), 3: frozenset({0, 1})}, weights)
    assert shares[3] == pytest.approx(1.0)
    assert shares[1] > shares[2] > 0
    assert _rank.coverage({1: frozenset({0})}, [2.0]) == {}  # one term: BM25 says it all


def test_a_reply_inherits_twice_as_much_from_a_question() -> None:
    rows = [row(0, "which team?", 4.0), row(1, "the Wolves", 0.0), row(5, "team", 4.0), row(6)]
    scores = _rank.lexical_scores(rows, {}, 0.0, 0.5)
    assert scores[1] == pytest.approx(0.5 * 2 * 4.0)
    assert scores[6] == pytest.approx(1.0 + 0.5 * 4.0)
    assert scores[0] == pytest.approx(4.0 + 0.5 * 0.5 * 0.0)


def test_fusions() -> None:
    lexical, dense = {1: 10.0, 2: 5.0, 3: 0.0}, {3: 0.9, 4: 0.5, 1: 0.1}
    weighted = _rank.fuse_weighted(lexical, dense, 0.25)
    assert weighted[1] == pytest.approx(0.75 * 1.0 + 0.25 * 0.0)
    assert weighted[3] == pytest.approx(0.75 * 0.0 + 0.25 * 1.0)
    assert weighted[4] == pytest.approx(0.25 * 0.5)
    assert _rank.fuse_weighted(lexical, dense, 0.0)[2] == pytest.approx(0.5)
    rrf = _rank.fuse_rrf(lexical, dense, k=60)
    assert rrf[1] == pytest.approx(1 / 61 + 1 / 63)
    assert rrf[4] == pytest.approx(1 / 62)
    assert _rank.minmax({1: 3.0, 2: 3.0}) == {1: 1.0, 2: 1.0}


def test_speakers_named_and_favoured() -> None:
    assert _rank.named_speakers(["melanie", "books"], ["Melanie", "Caroline"]) == {"Melanie"}
    assert _rank.named_speakers(["mary"], ["Mary Ann"]) == set()
    assert _rank.named_speakers(["mary", "ann"], ["Mary Ann"]) == {"Mary Ann"}
    rows = {0: row(0, speaker="Melanie"), 1: row(1, speaker="Caroline")}
    favoured = _rank.favour_speakers({0: 1.0, 1: 1.5}, rows, {"Melanie"}, 1.0)
    assert favoured == {0: 2.0, 1: 1.5}
    assert _rank.favour_speakers({0: 1.0}, rows, set(), 1.0) == {0: 1.0}


def test_select_makes_units_and_never_repeats_a_message() -> None:
    rows = {i: row(i, "t" * 8) for i in range(6)}
    scores = {0: 5.0, 1: 4.0, 4: 3.0}
    picked = _rank.select(scores, rows, 2, after=1)
    assert [r.index for r in picked] == [0, 1, 4, 5]
    assert [r.score for r in picked] == [5.0, 5.0, 3.0, 3.0]
    assert [r.index for r in _rank.select(scores, rows, 3)] == [0, 1, 4]


texts = st.text(alphabet="ab ", min_size=1, max_size=40)


@given(
    st.dictionaries(st.integers(0, 30), st.floats(0, 100), min_size=1),
    st.dictionaries(st.integers(0, 31), texts, min_size=1),
    st.integers(1, 10),
    st.integers(0, 2),
    st.integers(0, 60),
)
def test_select_stays_within_k_and_the_budget(
    scores: dict[int, float], texts: dict[int, str], k: int, after: int, budget: int
) -> None:
    rows = {i: row(i, t) for i, t in texts.items()}
    picked = _rank.select(scores, rows, k, after=after, budget=budget, cost=len)
    assert sum(len(r.text) for r in picked) <= budget
    indexes = [r.index for r in picked]
    assert len(indexes) == len(set(indexes))
    assert len({r.score for r in picked}) <= k
    assert [r.score for r in picked] == sorted((r.score for r in picked), reverse=True)
    assert all(i in rows for i in indexes)
    unlimited = _rank.select(scores, rows, k, after=after)
    assert _rank.fit([r for r in unlimited if r.index in scores], None, len) == [
        r for r in unlimited if r.index in scores
    ]


def test_fit_skips_what_does_not_fit() -> None:
    hits = [row(0, "a" * 10), row(1, "b" * 30), row(2, "c" * 5)]
    recalled = _rank.select({0: 3.0, 1: 2.0, 2: 1.0}, {r.index: r for r in hits}, 3)
    assert [r.index for r in _rank.fit(recalled, 20, len)] == [0, 2]
    assert _rank.fit(recalled, 0, len) == []


def test_packing_fills_a_binding_budget_with_more_short_hits() -> None:
    # One long best hit would spend the whole budget; packed, the two short ones come first.
    hits = {0: row(0, "a" * 40), 1: row(1, "b" * 10), 2: row(2, "c" * 10)}
    scores = {0: 3.0, 1: 2.5, 2: 2.4}
    best_first = _rank.select(scores, hits, 3, budget=40, cost=len)
    assert [r.index for r in best_first] == [0]
    packed = _rank.select(scores, hits, 3, budget=40, cost=len, packing=1.0)
    assert [r.index for r in packed] == [1, 2]
    assert [r.score for r in packed] == [2.5, 2.4]  # each keeps its own score
    # What the bench reads from one ranking is what the search returns.
    ranked = _rank.select(scores, hits, 3)
    assert _rank.fit(ranked, 40, len, k=3, packing=1.0) == packed


def test_packing_leaves_a_search_whose_k_binds_unchanged() -> None:
    hits = {0: row(0, "a" * 40), 1: row(1, "b" * 10), 2: row(2, "c" * 10)}
    scores = {0: 3.0, 1: 2.5, 2: 2.4}
    # The best two fit the budget: they are returned best first, packed or not.
    assert [r.index for r in _rank.select(scores, hits, 2, budget=60, cost=len, packing=1.0)] == [
        0,
        1,
    ]
    assert _rank.packed([0, 1, 2], scores.__getitem__, lambda i: 10, 3, 100, 2.0) == [0, 1, 2]
    assert _rank.packed([0, 1, 2], scores.__getitem__, lambda i: 10, 3, 10, 0.0) == [0, 1, 2]


@given(
    st.dictionaries(st.integers(0, 30), st.floats(0, 100), min_size=1),
    st.dictionaries(st.integers(0, 31), texts, min_size=1),
    st.integers(1, 10),
    st.integers(0, 60),
    st.sampled_from([0.1, 0.5, 1.0, 4.0]),
)
def test_packed_select_stays_within_k_and_the_budget(
    scores: dict[int, float], texts: dict[int, str], k: int, budget: int, packing: float
) -> None:
    rows = {i: row(i, t) for i, t in texts.items()}
    picked = _rank.select(scores, rows, k, budget=budget, cost=len, packing=packing)
    assert sum(len(r.text) for r in picked) <= budget
    assert len(picked) <= k
    indexes = [r.index for r in picked]
    assert len(indexes) == len(set(indexes)) and all(i in rows for i in indexes)
    best = _rank.select(scores, rows, k, budget=budget, cost=len)
    if (
        sum(len(rows[i].text) for i in sorted(scores, key=lambda i: (-scores[i], i)) if i in rows)
        <= budget
    ):
        assert picked == best  # nothing had to be left out: best first, as without packing
