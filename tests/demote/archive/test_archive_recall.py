"""SQLiteArchive recall: token budgets, hit units, neighbours' text, asearch."""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import pytest

from demote.archive.options import ArchiveOptions
from demote.archive.sqlite import SQLiteArchive
from demote.errors import ConfigError
from demote.records import DemotedMessage, Demotion, fingerprint, make_key


def batch(conversation_id: str, *texts: str, start: int = 0) -> Demotion:
    return Demotion(
        conversation_id,
        tuple(
            DemotedMessage(
                role="user" if i % 2 == 0 else "assistant",
                text=t,
                index=start + i,
                key=make_key(conversation_id, start + i, fingerprint("user", t)),
            )
            for i, t in enumerate(texts)
        ),
    )


FILLER = [
    "We talked about the weather and the week ahead.",
    "My sister visited for the weekend.",
    "I cooked pasta with tomatoes and basil.",
    "The new job starts on Monday morning.",
]
LONG = "garden " * 150


def tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


def test_help_does_not_print_the_stop_words() -> None:
    # The option is documented once, on the options object both archives take.
    signature = str(inspect.signature(ArchiveOptions))
    assert "stop_words: 'Iterable[str] | None' = None" in signature
    assert "yourselves" not in signature + str(inspect.signature(SQLiteArchive))
    assert "STOP_WORDS" in (ArchiveOptions.__doc__ or "")


def test_own_stop_words_still_apply() -> None:
    with SQLiteArchive(":memory:", stop_words=["garden"]) as archive:
        archive.deliver(batch("c", "garden party", "the garden", *FILLER))
        assert archive.search("c", "garden") == []
        assert archive.search("c", "the party")[0].text == "garden party"


def test_results_fit_the_token_budget_and_shorter_hits_fill_it() -> None:
    short = "A small garden."
    with SQLiteArchive(":memory:", adjacent_weight=0, neighbours=0.4) as archive:
        archive.deliver(batch("c", LONG, *FILLER, short, "garden gnome", *FILLER))
        ranked = archive.search("c", "garden", k=10)
        assert ranked[0].text == LONG  # "garden" 150 times
        budget = tokens(short) + tokens("garden gnome")
        assert budget < tokens(LONG)
        fitted = archive.search("c", "garden", k=10, budget_tokens=budget)
        assert sorted(h.text for h in fitted) == sorted([short, "garden gnome"])
        assert sum(tokens(h.text) for h in fitted) <= budget
        assert archive.search("c", "garden", k=1, budget_tokens=10_000) == ranked[:1]
        assert archive.search("c", "garden", k=10, budget_tokens=0) == []


def test_the_budget_counts_with_the_archives_counter() -> None:
    words = SQLiteArchive(":memory:", adjacent_weight=0, counter=lambda t: len(t.split()))
    with words as archive:
        archive.deliver(batch("c", "garden one two", "garden three", *FILLER))
        assert [h.text for h in archive.search("c", "garden", k=5, budget_tokens=2)] == [
            "garden three"
        ]


@pytest.mark.parametrize("bad", [-1, 2.5, "100", True])
def test_a_bad_budget_is_a_config_error(bad: object) -> None:
    with SQLiteArchive(":memory:") as archive, pytest.raises(ConfigError, match="budget_tokens"):
        archive.search("c", "garden", budget_tokens=bad)  # type: ignore[arg-type]


def test_a_hit_comes_with_its_next_turn_as_one_unit() -> None:
    texts = ["Did you ever adopt the turtles?", "Yes, three years ago.", *FILLER, "turtles!"]
    with SQLiteArchive(":memory:", adjacent_weight=0, neighbours=0, after=1) as archive:
        archive.deliver(batch("c", *texts))
        hits = archive.search("c", "turtles", k=2)
        assert [h.text for h in hits] == ["turtles!", *texts[:2]] or [h.text for h in hits] == [
            *texts[:2],
            "turtles!",
        ]
        first = archive.search("c", "adopt turtles", k=1)
        assert [h.text for h in first] == texts[:2]
        assert first[0].score == first[1].score  # a unit carries its hit's score
        # Under a budget the unit is cut to its hit when the follower does not fit.
        cut = archive.search("c", "adopt turtles", k=1, budget_tokens=tokens(texts[0]))
        assert [h.text for h in cut] == texts[:1]
    with SQLiteArchive(":memory:", adjacent_weight=0, neighbours=0) as alone:
        alone.deliver(batch("c", *texts))
        assert [h.text for h in alone.search("c", "adopt turtles", k=1)] == texts[:1]


def test_a_reply_is_found_by_the_words_of_the_turn_before_it() -> None:
    texts = [*FILLER, "How long have you had your turtles?", "About three years now.", *FILLER]
    with (
        SQLiteArchive(":memory:", neighbours=0) as adjacent,
        SQLiteArchive(":memory:", neighbours=0, adjacent_weight=0) as alone,
    ):
        # Delivered one message at a time: a message's neighbours may arrive later.
        for i, text in enumerate(texts):
            adjacent.deliver(batch("c", text, start=i))
            alone.deliver(batch("c", text, start=i))
        found = [h.text for h in adjacent.search("c", "how long turtles", k=2)]
        assert found == ["How long have you had your turtles?", "About three years now."]
        assert [h.text for h in alone.search("c", "how long turtles", k=2)] == [texts[4]]
        # The earlier message also knows the later one's words.
        assert adjacent.search("c", "three years", k=2)[1].text == texts[4]


def test_the_neighbours_text_never_crosses_conversations() -> None:
    with SQLiteArchive(":memory:") as archive:
        archive.deliver(batch("a", "nothing to see", start=0))
        archive.deliver(batch("b", "zebra crossing", start=1))
        assert archive.search("a", "zebra") == []
        assert [h.text for h in archive.search("b", "zebra")] == ["zebra crossing"]


async def test_asearch_gives_what_search_gives(tmp_path: Path) -> None:
    with SQLiteArchive(tmp_path / "a.db", after=1) as archive:
        archive.deliver(batch("c", "Which team did you sign with?", "The Wolves!", *FILLER))
        for query, budget in (("which team", None), ("team wolves", 5), ("the", None)):
            expected = archive.search("c", query, k=3, budget_tokens=budget)
            assert await archive.asearch("c", query, k=3, budget_tokens=budget) == expected
        assert await archive.asearch("c", "which team", k=0) == []


def test_a_named_speakers_own_messages_are_favoured() -> None:
    said = [
        ("Caroline", "Thanks, Melanie! Books are great."),
        ("Melanie", "I read a book about the stars."),
        ("Caroline", "Melanie, which book, Melanie?"),
        ("Melanie", "A small book."),
    ]
    messages = tuple(
        DemotedMessage("user", text, i, make_key("c", i, fingerprint("user", text)), raw=who)
        for i, (who, text) in enumerate(said)
    )

    def context(m: DemotedMessage) -> dict[str, str]:
        return {"speaker": m.raw}

    options = {"context": context, "context_weight": 0.0, "adjacent_weight": 0.0, "neighbours": 0.0}
    with (
        SQLiteArchive(":memory:", speaker_weight=4, **options) as favoured,  # type: ignore[arg-type]
        SQLiteArchive(":memory:", speaker_weight=0, **options) as plain,  # type: ignore[arg-type]
    ):
        for archive in (favoured, plain):
            archive.deliver(Demotion("c", messages))
        assert plain.search("c", "Melanie book", k=1)[0].text == said[2][1]
        top = favoured.search("c", "Melanie book", k=2)
        assert {h.text for h in top} == {said[1][1], said[3][1]}
        # A query that names no speaker ranks as before.
        assert favoured.search("c", "book", k=4) == plain.search("c", "book", k=4)
