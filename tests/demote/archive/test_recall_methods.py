"""The archive's optional recall methods: entity index, time awareness, decomposition,
reranker."""

from __future__ import annotations

import sqlite3
from datetime import date
from pathlib import Path

import pytest

from demote.archive import _decompose, _time
from demote.archive._fts import STOP_WORDS, query_terms
from demote.archive.sqlite import SQLiteArchive, _entities
from demote.errors import ArgumentTypeError, ConfigError, EmbeddingError
from demote.records import DemotedMessage, Demotion, fingerprint, make_key

SPEAKERS = {"user": "Ann", "assistant": "Bob"}


def batch(conversation_id: str, *texts: str, start: int = 0, dates: list[str] | None = None):
    return Demotion(
        conversation_id,
        tuple(
            DemotedMessage(
                role="user" if (start + i) % 2 == 0 else "assistant",
                text=t,
                index=start + i,
                key=make_key(conversation_id, start + i, fingerprint("user", t)),
                raw={"date": dates[i]} if dates else None,
            )
            for i, t in enumerate(texts)
        ),
    )


def context(message: DemotedMessage) -> dict[str, str]:
    found = {"speaker": SPEAKERS[message.role]}
    if isinstance(message.raw, dict):
        found["date"] = message.raw["date"]
    return found


# -- entities ----------------------------------------------------------------------------


def test_names_are_found_and_pronouns_resolve_to_the_last_non_speaker_name() -> None:
    known: set[str] = set()
    names, last = _entities.mentions("Yesterday I met Jenna at the market.", known, {"ann"}, "")
    assert names == {"jenna"} and last == "jenna"
    names, last = _entities.mentions("She sells bread. Thanks, Ann!", known, {"ann"}, last)
    assert names == {"jenna", "ann"} and last == "jenna"  # a speaker is never a referent
    # A sentence's first word is a name only once the conversation knows it.
    assert _entities.mentions("Wow. Great stuff.", known, set(), "")[0] == set()
    assert _entities.mentions("Jenna's stall. Nice.", known, set(), "")[0] == {"jenna"}


FILLER = ["The weather was grim all week.", "Rain again, and wind.", "Still raining here."]


def test_the_entity_index_finds_a_pronoun_message_that_shares_no_word() -> None:
    texts = ["I met Jenna at the market today.", "Nice!", *FILLER, "She is a carpenter now."]
    query = "What is Jenna's job?"
    with SQLiteArchive(":memory:", context=context) as plain:
        plain.deliver(batch("c", *texts))
        assert 5 not in {h.index for h in plain.search("c", query)}
    with SQLiteArchive(":memory:", context=context, entities=True) as archive:
        archive.deliver(batch("c", *texts[:3]))  # pronouns resolve across deliveries
        archive.deliver(batch("c", *texts[3:], start=3))
        assert 5 in {h.index for h in archive.search("c", query)}
        assert archive.search("other", query) == []


def test_the_entity_index_is_erased_and_built_for_an_older_file(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    texts = ["I met Jenna at the market today.", *FILLER, "She is a carpenter now."]
    with SQLiteArchive(path, context=context) as archive:
        archive.deliver(batch("c", *texts))
    with SQLiteArchive(path, context=context, entities=True) as archive:
        assert 4 in {h.index for h in archive.search("c", "Jenna's job?")}
        archive.erase("c")
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT count(*) FROM entities").fetchone() == (0,)
        assert db.execute("SELECT count(*) FROM entity_state").fetchone() == (0,)
    finally:
        db.close()


def test_entities_option_is_checked() -> None:
    with pytest.raises(ArgumentTypeError, match="entities"):
        SQLiteArchive(":memory:", entities="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="entity_weight"):
        SQLiteArchive(":memory:", entities=True, entity_weight=-1)


# -- time ----------------------------------------------------------------------------------

NOW = date(2023, 10, 20)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("When did she go camping in June?", (date(2023, 6, 1), date(2023, 6, 30))),
        ("What happened in October 2023?", (date(2023, 10, 1), date(2023, 10, 31))),
        ("What did he show on October 13, 2023?", (date(2023, 10, 13), date(2023, 10, 13))),
        ("What did he do on 3 June, 2023?", (date(2023, 6, 3), date(2023, 6, 3))),
        ("last weekend before April 10, 2023", (date(2023, 3, 31), date(2023, 4, 10))),
        ("Where did they go last year?", (date(2022, 1, 1), date(2022, 12, 31))),
        ("What did they do in 2022?", (date(2022, 1, 1), date(2022, 12, 31))),
        ("What were the plans for the summer?", (date(2023, 6, 1), date(2023, 8, 31))),
        ("What did he do last winter?", (date(2022, 12, 1), date(2023, 2, 28))),
        ("What is her favourite book?", None),
    ],
)
def test_time_spans(query: str, expected: tuple[date, date] | None) -> None:
    assert _time.span(query, NOW) == expected


def test_relative_time_needs_a_now_and_dates_come_from_the_context() -> None:
    assert _time.span("last year", None) is None
    assert _time.message_date("1:56 pm on 8 May, 2023") == date(2023, 5, 8)
    assert _time.message_date("no date here") is None
    assert _time.within(date(2023, 7, 5), (date(2023, 6, 1), date(2023, 6, 30)))  # slack
    assert not _time.within(date(2023, 7, 20), (date(2023, 6, 1), date(2023, 6, 30)))


def test_time_awareness_favours_messages_of_the_named_month() -> None:
    texts = ["We went camping, camping by the lake.", "Fun!", "We went camping once more."]
    dates = ["8 May, 2023", "8 May, 2023", "20 June, 2023"]
    query = "When did they go camping in June?"
    with SQLiteArchive(":memory:", context=context, context_weight=0) as plain:
        plain.deliver(batch("c", *texts, dates=dates))
        assert plain.search("c", query)[0].index == 0
    with SQLiteArchive(":memory:", context=context, context_weight=0, time_weight=2) as archive:
        archive.deliver(batch("c", *texts, dates=dates))
        assert archive.search("c", query)[0].index == 2


# -- decomposition ---------------------------------------------------------------------------


def test_a_question_naming_two_speakers_is_split_per_speaker() -> None:
    query = "What have Ann and Bob both painted?"
    terms = query_terms(query)
    parts = _decompose.parts(query, terms, {"Ann", "Bob"}, STOP_WORDS)
    assert parts == [(["ann", "painted"], "Ann"), (["bob", "painted"], "Bob")]
    clauses = "What did Ann buy at the market and where did she travel afterwards?"
    found = _decompose.parts(clauses, query_terms(clauses), {"Ann"}, STOP_WORDS)
    assert found == [(["ann", "buy", "market"], "Ann"), (["ann", "travel", "afterwards"], "Ann")]
    assert _decompose.parts("Ann and Bob?", ["ann", "bob"], set(), STOP_WORDS) == []


def test_decomposition_finds_each_speakers_answer() -> None:
    texts = [
        "I painted the lake, painted the hills, painted the sky.",  # Ann
        "Nice colours.",  # Bob
        "Then I painted the barn and painted the fence.",  # Ann
        "Lovely.",  # Bob
        "I painted my room too.",  # Ann
        "Last spring, after many long weekends of practice, I painted a horse.",  # Bob
    ]
    query = "What have Ann and Bob both painted?"
    found = {}
    for decompose in (0.0, 1.0):
        with SQLiteArchive(
            ":memory:", context=context, decompose=decompose, neighbours=0, adjacent_weight=0
        ) as archive:
            archive.deliver(batch("c", *texts))
            found[decompose] = {h.index for h in archive.search("c", query, k=2)}
    assert found == {0.0: {0, 2}, 1.0: {0, 5}}  # Bob's own answer, with decomposition
    with pytest.raises(ConfigError, match="decompose"):
        SQLiteArchive(":memory:", decompose=2)


# -- reranker --------------------------------------------------------------------------------


def test_a_reranker_reorders_the_best_candidates() -> None:
    texts = ["garden party tonight", "the garden", "a garden, a garden, a garden", "weather"]
    seen: list[tuple[str, list[str]]] = []

    def shortest_first(query: str, found: list[str]) -> list[float]:
        seen.append((query, found))
        return [-float(len(t)) for t in found]

    with SQLiteArchive(
        ":memory:", reranker=shortest_first, rerank_weight=1.0, adjacent_weight=0, neighbours=0
    ) as archive:
        archive.deliver(batch("c", *texts))
        hits = archive.search("c", "garden", k=3)
    assert [h.text for h in hits] == ["the garden", "garden party tonight", texts[2]]
    assert seen and seen[0][0] == "garden" and "weather" not in seen[0][1]


def test_a_bad_reranker_is_a_typed_error() -> None:
    with pytest.raises(ArgumentTypeError, match="reranker"):
        SQLiteArchive(":memory:", reranker=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="rerank_weight"):
        SQLiteArchive(":memory:", reranker=lambda q, t: [], rerank_weight=1.5)
    with SQLiteArchive(":memory:", reranker=lambda q, t: [1.0]) as archive:
        archive.deliver(batch("c", "garden one", "garden two"))
        with pytest.raises(EmbeddingError, match="one finite number per text"):
            archive.search("c", "garden")

    def broken(query: str, texts: list[str]) -> list[float]:
        raise RuntimeError("model down")

    with SQLiteArchive(":memory:", reranker=broken) as archive:
        archive.deliver(batch("c", "garden one"))
        with pytest.raises(EmbeddingError, match="model down"):
            archive.search("c", "garden")


# -- the neighbour lift never puts a message above the one that says the word -----------------


def test_a_lifted_message_ranks_below_the_neighbour_that_says_the_word() -> None:
    from demote.archive._rank import Candidate, lexical_scores

    rows = [
        Candidate(1, 0, "user", "Which team did you sign with?", "k0", 2.0),
        Candidate(2, 1, "assistant", "The Minnesota Wolves!", "k1", 1.5),  # adjacent text
        Candidate(3, 5, "user", "team talk", "k5", 1.0),
    ]
    free = lexical_scores(rows, {}, 0.0, 0.7)
    assert free[1] > free[0]  # 1.5 + 0.7 * 2 * 2.0: the reply would win
    capped = lexical_scores(rows, {}, 0.0, 0.7, own={1, 3})
    assert capped[0] == free[0] and capped[5] == free[5]
    assert free[5] < capped[1] < capped[0]  # just below the question, still above the rest


def test_a_search_returns_the_message_that_says_the_word_first() -> None:
    texts = ["the secret word is marmalade", "We talked about the weather.", "Rain again."]
    with SQLiteArchive(":memory:") as archive:  # the default neighbour lift and text
        archive.deliver(batch("c", *texts))
        hits = archive.search("c", "marmalade", k=2)
        assert [h.index for h in hits] == [0, 1]


def test_budget_packing_is_an_archive_option_that_fits_more_hits() -> None:
    # The long message matches best and costs most of the budget by itself.
    texts = ["garden " * 30, "weather", "my garden", "weather again", "garden gnome"]
    with SQLiteArchive(":memory:", adjacent_weight=0, neighbours=0) as plain:
        plain.deliver(batch("c", *texts))
        best_first = plain.search("c", "garden", k=3, budget_tokens=55)
    with SQLiteArchive(":memory:", adjacent_weight=0, neighbours=0, packing=1.0) as packed:
        packed.deliver(batch("c", *texts))
        hits = packed.search("c", "garden", k=3, budget_tokens=55)
    assert [h.text for h in best_first] == [texts[0]]  # best first: the long one alone
    assert {h.text for h in hits} == {"my garden", "garden gnome"}
    with pytest.raises(ConfigError, match="packing"):
        SQLiteArchive(":memory:", packing=-1)
    with pytest.raises(ConfigError, match="packing"):
        SQLiteArchive(":memory:", packing=float("nan"))
