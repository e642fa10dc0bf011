"""The contract of an archive, written once: SQLiteArchive and PostgresArchive, sync and async.

A subclass gives the ``raw_opener`` fixture: ``opener(**options)`` opens an archive with those
options on the test's own storage (every call on the same storage, as a second process
would), and its module imports the state stores' ``mode`` fixture: each method runs
directly, or through its async twin (``adeliver``, ``asearch``, ...) on an event loop of
the test's own; a method without a twin runs sync.

Every answer asserted here is the same for both archives. Where they may differ (see
``demote.archive.postgres``): BM25's statistics are per file in SQLite and per
conversation in PostgreSQL, so exact scores are compared only in
``test_archive_conformance.py`` with one conversation per archive; PostgreSQL refuses a
conversation id holding NUL (the SQLite archive stores it), and stores a NUL in a text as
U+FFFD.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from demote.errors import ConfigError, ConversationIdError, EmbeddingModelChanged, FencedOut
from demote.hooks.base import ArchiveRecall, Recall, SyncHook
from demote.records import DemotedMessage, Demotion, fingerprint, make_key
from tests.demote.archive.test_archive_vectors import TEXTS, Concepts

FILLER = [
    "We talked about the weather and the week ahead.",
    "My sister visited for the weekend.",
    "I cooked pasta with tomatoes and basil.",
    "The new job starts on Monday morning.",
]


def message(
    conversation_id: str, index: int, text: str, role: str = "user", raw: Any = None
) -> DemotedMessage:
    return DemotedMessage(
        role=role,  # type: ignore[arg-type]
        text=text,
        index=index,
        key=make_key(conversation_id, index, fingerprint(role, text)),
        raw=raw,
    )


def batch(conversation_id: str, *texts: str, start: int = 0, fence: int | None = None) -> Demotion:
    return Demotion(
        conversation_id,
        tuple(
            message(conversation_id, start + i, t, "user" if (start + i) % 2 == 0 else "assistant")
            for i, t in enumerate(texts)
        ),
        fence=fence,
    )


def carrying(conversation_id: str) -> Demotion:
    """Messages in the neutral forms the adapters deliver, carrying speaker and date: LangChain's
    ``name`` and ``additional_kwargs``, LlamaIndex's ``additional_kwargs``; the rest none."""
    said: list[tuple[str, dict[str, Any]]] = [
        (
            "I went hiking",
            {
                "name": "Caroline",
                "extra": {"additional_kwargs": {"timestamp": "2023-05-08T13:56Z"}},
            },
        ),
        (
            "I went fishing",
            {
                "extra": {
                    "additional_kwargs": {
                        "speaker": "Melanie",
                        "date_time": "7:55 pm on 20 July, 2023",
                    }
                }
            },
        ),
        ("Hiking! We went hiking, hiking all week.", {}),
        *((text, {}) for text in FILLER),
    ]
    return Demotion(
        conversation_id,
        tuple(
            dataclasses.replace(
                message(conversation_id, i, text), data={"role": "user", "text": text, **form}
            )
            for i, (text, form) in enumerate(said)
        ),
    )


def tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


class Facade:
    """An archive whose methods run sync, or through their async twins on ``loop``."""

    def __init__(self, archive: Any, loop: asyncio.AbstractEventLoop | None) -> None:
        self.archive = archive
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        sync = getattr(self.archive, name)
        twin = getattr(self.archive, "a" + name, None)
        if self._loop is None or twin is None or not callable(sync):
            return sync
        loop = self._loop

        def call(*args: Any, **kwargs: Any) -> Any:
            return asyncio.run_coroutine_threadsafe(twin(*args, **kwargs), loop).result(60)

        return call

    def close(self) -> None:
        if self._loop is not None and hasattr(self.archive, "aclose"):
            asyncio.run_coroutine_threadsafe(self.archive.aclose(), self._loop).result(30)
        self.archive.close()


Opener = Callable[..., Facade]


class ArchiveContract:
    """Tests every archive passes; subclasses provide ``raw_opener``."""

    @pytest.fixture
    def raw_opener(self) -> Callable[..., Any]:
        raise NotImplementedError

    @pytest.fixture
    def opener(
        self, raw_opener: Callable[..., Any], mode: asyncio.AbstractEventLoop | None
    ) -> Iterator[Opener]:
        made: list[Facade] = []

        def open_(**options: Any) -> Facade:
            made.append(Facade(raw_opener(**options), mode))
            return made[-1]

        yield open_
        for archive in made:
            archive.close()

    @pytest.fixture
    def archive(self, opener: Opener) -> Facade:
        # Which messages match; the neighbours' text, which also makes one match, apart.
        return opener(adjacent_weight=0)

    # -- the hook ----------------------------------------------------------------------

    def test_is_a_hook_and_a_recall(self, archive: Facade) -> None:
        assert isinstance(archive.archive, SyncHook)
        assert isinstance(archive.archive, Recall)
        # What the recall tools take: it can also fetch by key.
        assert isinstance(archive.archive, ArchiveRecall)

    def test_redelivery_stores_nothing_twice(self, archive: Facade) -> None:
        b = batch("c", "one", "two", "three")
        archive.deliver(b)
        archive.deliver(b)
        archive.deliver(Demotion("c", b.messages[1:]))
        assert archive.count("c") == 3
        assert [m.text for m in archive.messages("c")] == ["one", "two", "three"]
        assert sorted(h.text for h in archive.search("c", "two three", k=10)) == ["three", "two"]

    def test_messages_come_back_in_index_order(self, archive: Facade) -> None:
        archive.deliver(batch("c", "five", "six", start=5))
        archive.deliver(batch("c", "zero", "one", start=0))
        got = archive.messages("c")
        assert [(m.index, m.text) for m in got] == [
            (0, "zero"),
            (1, "one"),
            (5, "five"),
            (6, "six"),
        ]
        assert got[0].key == make_key("c", 0, fingerprint("user", "zero"))
        assert [m.role for m in got] == ["user", "assistant", "assistant", "user"]

    def test_a_batch_lands_only_under_its_conversation(self, archive: Facade) -> None:
        archive.deliver(batch("A", "alpha text", "beta text"))
        assert (archive.count("A"), archive.count("B"), archive.conversations()) == (2, 0, ["A"])
        archive.deliver(Demotion("B", batch("A", "alpha text").messages))  # same key elsewhere
        assert (archive.count("B"), archive.count()) == (1, 3)
        assert archive.conversations() == ["A", "B"]

    def test_has_keys_reports_only_stored_keys(self, archive: Facade) -> None:
        b = batch("c", *(f"message {i}" for i in range(1200)))
        archive.deliver(b)
        keys = [m.key for m in b.messages]
        assert archive.has_keys("c", [*keys, "missing"]) == set(keys)
        assert archive.has_keys("c", []) == set()
        assert archive.has_keys("d", keys) == set()

    def test_a_lone_surrogate_is_kept_readable(self, archive: Facade) -> None:
        archive.deliver(batch("c", "broken \ud83d emoji cake"))
        [stored] = archive.messages("c")
        assert stored.text.startswith("broken ") and stored.text.endswith(" emoji cake")
        assert archive.search("c", "cake")[0].index == 0

    def test_reopening_keeps_everything(self, opener: Opener) -> None:
        opener().deliver(batch("c", "remember the blue umbrella", *FILLER))
        again = opener()
        assert again.count("c") == 5
        assert again.search("c", "umbrella")[0].text == "remember the blue umbrella"
        again.deliver(batch("c", "remember the blue umbrella", *FILLER))
        assert again.count("c") == 5

    # -- scoping and hostile input -------------------------------------------------------

    @pytest.mark.parametrize(
        "conversation_id",
        [
            'it\'s "quoted"',
            "100%_done",
            "a'; DROP TABLE messages; --",
            "x' OR '1'='1",
            "$1 %s %(cid)s {scope}",
            "../../etc/passwd",
            "x" * 10_000,
            "NEAR(a b) OR * & | ! <->",
            "日本語の会話",
        ],
    )
    def test_a_second_tenant_never_comes_back(self, opener: Opener, conversation_id: str) -> None:
        archive = opener()
        archive.deliver(batch(conversation_id, "the secret word is marmalade", *FILLER))
        archive.deliver(batch("other", "marmalade for the neighbour", *FILLER))
        mine = {m.key for m in archive.messages(conversation_id)}
        theirs = {m.key for m in archive.messages("other")}
        assert len(mine) == 5 and not mine & theirs
        for query in ("marmalade", "marmalade neighbour", "marmalade | neighbour", "other"):
            hits = archive.search(conversation_id, query, k=10)
            assert {h.key for h in hits} <= mine
        assert archive.search(conversation_id, "marmalade")[0].text.startswith("the secret")
        assert archive.has_keys(conversation_id, theirs) == set()
        assert sorted(archive.conversations()) == sorted([conversation_id, "other"])
        assert archive.delete(conversation_id) == 5
        assert archive.count() == 5 and archive.count("other") == 5

    @pytest.mark.parametrize(
        "query",
        [
            'say "hello',
            "hello*",
            "hello:*",
            "text:hello",
            "hello:A",
            "-hello",
            "!hello",
            "hello AND NOT world",
            "hello & !world",
            "hello <-> world",
            "hello <2> world",
            "NEAR(hello world)",
            "hello OR",
            "hello |",
            "^hello",
            "(hello",
            "'hello'",
            "hello\\",
            "hello'); DROP TABLE messages; --",
            "{scope context} : hello",
            "hello\x00world",
        ],
    )
    def test_query_syntax_is_plain_text(self, archive: Facade, query: str) -> None:
        archive.deliver(batch("c", "hello there", "goodbye now", *FILLER))
        assert [h.text for h in archive.search("c", query)] == ["hello there"]
        assert archive.count() == 6

    @pytest.mark.parametrize("bad", ["", None, 42, b"bytes", "lone\ud800surrogate"])
    def test_bad_conversation_ids_raise_and_store_nothing(self, archive: Facade, bad: Any) -> None:
        for call in (
            lambda: archive.deliver(Demotion(bad, (message("x", 0, "hello"),))),
            lambda: archive.search(bad, "hello"),
            lambda: archive.messages(bad),
            lambda: archive.has_keys(bad, ["k"]),
            lambda: archive.delete(bad),
        ):
            with pytest.raises(ConversationIdError):
                call()
        assert (archive.count(), archive.conversations()) == (0, [])

    # -- recall ------------------------------------------------------------------------

    def test_stemming_running_finds_runs(self, archive: Facade) -> None:
        archive.deliver(batch("c", "She runs along the river every day", *FILLER))
        assert [h.text for h in archive.search("c", "running")] == [
            "She runs along the river every day"
        ]

    def test_diacritics_and_case_are_folded(self, archive: Facade) -> None:
        archive.deliver(batch("c", "Un CAFÉ crème au comptoir", *FILLER))
        for query in ("cafe", "café", "CREME comptoir"):
            assert archive.search("c", query)[0].index == 0

    def test_stop_words_are_dropped(self, archive: Facade) -> None:
        archive.deliver(batch("c", "What is the plan for the trip?", "Museum tickets for Paris"))
        for query in ("what is the", "", "?!... --"):
            assert archive.search("c", query) == []
        assert [h.text for h in archive.search("c", "what about the museum")] == [
            "Museum tickets for Paris"
        ]

    def test_own_stop_words_apply(self, opener: Opener) -> None:
        archive = opener(stop_words=["garden"])
        archive.deliver(batch("c", "garden party", "the garden", *FILLER))
        assert archive.search("c", "garden") == []
        assert archive.search("c", "the party")[0].text == "garden party"

    def test_the_message_covering_the_query_comes_first(self, archive: Facade) -> None:
        archive.deliver(
            batch(
                "c",
                "The garden needs water",
                "I planted tomatoes in the garden last spring",
                "Tomatoes are red",
                *FILLER,
            )
        )
        hits = archive.search("c", "when did I plant tomatoes in the garden?", k=3)
        assert hits[0].text == "I planted tomatoes in the garden last spring"
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        assert len(archive.search("c", "garden tomatoes", k=1)) == 1
        assert archive.search("c", "garden", k=0) == []

    def test_a_reply_to_a_matching_question_is_lifted(self, opener: Opener) -> None:
        texts = ["Which team did you sign with?", "The Minnesota Wolves!", *FILLER]
        plain, alone = opener(adjacent_weight=0), opener(adjacent_weight=0, neighbours=0)
        plain.deliver(batch("c", *texts))
        assert "The Minnesota Wolves!" in [h.text for h in plain.search("c", "which team", k=2)]
        assert [h.text for h in alone.search("c", "which team", k=2)] == [texts[0]]

    def test_a_reply_is_found_by_the_turn_before_it(self, opener: Opener) -> None:
        texts = [*FILLER, "How long have you had your turtles?", "About three years now.", *FILLER]
        archive = opener(neighbours=0)
        for i, text in enumerate(texts):  # one at a time: a neighbour may arrive later
            archive.deliver(batch("c", text, start=i))
        found = [h.text for h in archive.search("c", "how long turtles", k=2)]
        assert found == ["How long have you had your turtles?", "About three years now."]
        assert archive.search("c", "three years", k=2)[1].text == texts[4]
        archive.deliver(batch("d", "zebra crossing", start=5))  # idx 4 of "c" is not its neighbour
        assert archive.search("c", "zebra") == []

    def test_context_is_indexed_but_not_returned(self, opener: Opener) -> None:
        def speaker(m: DemotedMessage) -> str | None:
            return m.raw.get("speaker") if isinstance(m.raw, dict) else None

        archive = opener(context=speaker)
        archive.deliver(
            Demotion(
                "c",
                (
                    message("c", 0, "I went hiking", raw={"speaker": "Caroline"}),
                    message("c", 1, "I went fishing", "assistant", raw={"speaker": "Melanie"}),
                    message("c", 2, "Nothing much"),
                ),
            )
        )
        assert [h.text for h in archive.search("c", "what did Melanie do", k=5)] == [
            "I went fishing"
        ]
        assert "Melanie" not in {m.text for m in archive.messages("c")}
        assert opener(context_weight=0).search("c", "Melanie") == []

    def test_a_named_speakers_own_turns_are_favoured(self, opener: Opener) -> None:
        said = [
            ("Caroline", "Thanks, Melanie! Books are great."),
            ("Melanie", "I read a book about the stars."),
            ("Caroline", "Melanie, which book, Melanie?"),
            ("Melanie", "A small book."),
        ]
        messages = tuple(message("c", i, text, raw=who) for i, (who, text) in enumerate(said))
        options: dict[str, Any] = {
            "context": lambda m: {"speaker": m.raw},
            "context_weight": 0.0,
            "adjacent_weight": 0.0,
            "neighbours": 0.0,
        }
        favoured, plain = opener(speaker_weight=4, **options), opener(speaker_weight=0, **options)
        favoured.deliver(Demotion("c", messages))
        assert plain.search("c", "Melanie book", k=1)[0].text == said[2][1]
        assert {h.text for h in favoured.search("c", "Melanie book", k=2)} == {
            said[1][1],
            said[3][1],
        }
        assert favoured.search("c", "book", k=4) == plain.search("c", "book", k=4)

    def test_a_messages_own_speaker_and_date_are_indexed_without_context(
        self, opener: Opener
    ) -> None:
        archive = opener(adjacent_weight=0)  # no context=: the default reads the metadata
        archive.deliver(carrying("c"))
        assert [h.text for h in archive.search("c", "what did Melanie do", k=5)] == [
            "I went fishing"
        ]
        assert [h.text for h in archive.search("c", "Caroline went hiking", k=1)] == [
            "I went hiking"
        ]
        assert [h.text for h in archive.search("c", "in July", k=5)] == ["I went fishing"]
        dated_2023 = {h.text for h in archive.search("c", "in 2023", k=5)}
        assert dated_2023 == {"I went fishing", "I went hiking"}  # not the undated one
        stored = archive.messages("c")
        assert [m.data for m in stored] == [m.data for m in carrying("c").messages]
        # Time awareness reads the dates the messages carry ("may" is a stop word: only the
        # date lifts the message of May over the undated one that says "hiking" thrice).
        query = "who went hiking in May?"
        assert archive.search("c", query, k=1)[0].text.startswith("Hiking!")
        dated = opener(adjacent_weight=0, time_weight=4.0)
        assert dated.search("c", query, k=1)[0].text == "I went hiking"

    def test_a_context_of_ones_own_replaces_the_default(self, opener: Opener) -> None:
        opener(context=lambda m: {"speaker": "Zed"}).deliver(carrying("d"))
        opener(context=None).deliver(carrying("e"))  # the text only
        archive = opener(adjacent_weight=0)
        assert archive.search("d", "Melanie") == []
        assert len(archive.search("d", "what did Zed do", k=10)) == 7
        assert archive.search("e", "Melanie") == archive.search("e", "2023") == []
        assert len(archive.search("e", "went", k=10)) == 3

    def test_results_fit_the_token_budget(self, opener: Opener) -> None:
        # A weak neighbour lift, so the ranking is BM25's (the budget is what is tested).
        archive = opener(neighbours=0.4)
        long, short = "garden " * 150, "A small garden."
        archive.deliver(batch("c", long, *FILLER, short, "garden gnome", *FILLER))
        ranked = archive.search("c", "garden", k=10)
        assert ranked[0].text == long
        budget = tokens(short) + tokens("garden gnome")
        fitted = archive.search("c", "garden", k=10, budget_tokens=budget)
        assert sorted(h.text for h in fitted) == sorted([short, "garden gnome"])
        assert archive.search("c", "garden", k=1, budget_tokens=10_000) == ranked[:1]
        assert archive.search("c", "garden", k=10, budget_tokens=0) == []

    def test_the_budget_counts_with_the_archives_counter(self, opener: Opener) -> None:
        archive = opener(adjacent_weight=0, counter=lambda t: len(t.split()))
        archive.deliver(batch("c", "garden one two", "garden three", *FILLER))
        hits = archive.search("c", "garden", k=5, budget_tokens=2)
        assert [h.text for h in hits] == ["garden three"]

    @pytest.mark.parametrize("bad", [-1, 2.5, "100", True])
    def test_a_bad_budget_is_a_config_error(self, archive: Facade, bad: Any) -> None:
        with pytest.raises(ConfigError, match="budget_tokens"):
            archive.search("c", "garden", budget_tokens=bad)

    def test_a_hit_comes_with_its_next_turn_as_one_unit(self, opener: Opener) -> None:
        texts = ["Did you ever adopt the turtles?", "Yes, three years ago.", *FILLER, "turtles!"]
        archive = opener(adjacent_weight=0, neighbours=0, after=1)
        archive.deliver(batch("c", *texts))
        first = archive.search("c", "adopt turtles", k=1)
        assert [h.text for h in first] == texts[:2]
        assert first[0].score == first[1].score
        cut = archive.search("c", "adopt turtles", k=1, budget_tokens=tokens(texts[0]))
        assert [h.text for h in cut] == texts[:1]

    def test_search_and_asearch_agree(self, opener: Opener) -> None:
        archive = opener(after=1)
        archive.deliver(batch("c", "Which team did you sign with?", "The Wolves!", *FILLER))
        raw, loop = archive.archive, asyncio.new_event_loop()
        try:
            for query, budget in (("which team", None), ("team wolves", 5), ("the", None)):
                expected = raw.search("c", query, k=3, budget_tokens=budget)
                got = loop.run_until_complete(raw.asearch("c", query, k=3, budget_tokens=budget))
                assert got == expected
            if hasattr(raw, "aclose"):
                loop.run_until_complete(raw.aclose())
        finally:
            loop.close()

    # -- erase -------------------------------------------------------------------------

    def test_erase_removes_everything_and_fences_stale_writers(self, archive: Facade) -> None:
        if not hasattr(archive.archive, "erase"):
            pytest.skip(f"{type(archive.archive).__name__}.erase lands with the erase branch")
        archive.deliver(batch("c", "kites fly high", *FILLER))
        archive.deliver(batch("d", "kites in the park", *FILLER))
        assert archive.erase("c", fence=7) == 5
        assert archive.erase("c") == 0
        assert (archive.search("c", "kites"), archive.count("c")) == ([], 0)
        assert [h.text for h in archive.search("d", "kites")] == ["kites in the park"]
        with pytest.raises(FencedOut):
            archive.deliver(batch("c", "late write from a stale worker", fence=6))
        assert archive.count("c") == 0
        archive.deliver(batch("c", "kites fly high", fence=8))  # a newer lease
        archive.deliver(batch("c", "no lease at all", start=1))
        assert archive.count("c") == 2
        assert archive.count("d") == 5

    # -- embeddings --------------------------------------------------------------------

    def test_each_message_is_embedded_once(self, opener: Opener) -> None:
        model = Concepts()
        archive = opener(embeddings=model)
        model.batches.clear()  # the dimension probe at open
        archive.deliver(batch("c", *TEXTS))
        archive.deliver(batch("c", *TEXTS))
        archive.deliver(batch("c", TEXTS[0], "A new puppy!"))
        assert model.batches == [TEXTS, ["A new puppy!"]]
        assert archive.search("c", "automobile", k=1)[0].text == TEXTS[0]
        assert archive.delete("c") == 5
        assert archive.search("c", "automobile") == []
        archive.deliver(batch("c", "Selling my vehicle.", *TEXTS[1:]))
        assert archive.search("c", "automobile", k=1)[0].text == "Selling my vehicle."

    @pytest.mark.parametrize("fusion", ["weighted", "rrf"])
    def test_dense_recall_finds_what_shares_no_word(self, opener: Opener, fusion: str) -> None:
        dense, lexical = opener(embeddings=Concepts(), fusion=fusion), opener()
        dense.deliver(batch("c", *TEXTS))
        assert lexical.search("c", "automobile") == []
        assert dense.search("c", "automobile", k=1)[0].text == TEXTS[0]
        assert len(dense.search("c", "what about it?", k=2)) == 2
        assert dense.search("c", "bakery bread", k=1)[0].text == TEXTS[1]
        assert dense.search("other", "automobile") == []
        # Vectors that arrive after a search are found by the next one.
        dense.deliver(batch("c", "My puppy", start=10))
        assert dense.search("c", "dog", k=1)[0].index == 10
        dense.deliver(batch("c", "Another puppy", start=11))
        assert {h.index for h in dense.search("c", "dog", k=2)} == {10, 11}

    def test_a_speaker_prefixes_the_embedded_text(self, opener: Opener) -> None:
        model = Concepts()
        archive = opener(
            embeddings=model,
            context=lambda m: {"speaker": m.raw, "date": "8 May 2023"} if m.raw else None,
        )
        model.batches.clear()
        archive.deliver(
            Demotion("c", (message("c", 0, "Hello!", raw="Caroline"), message("c", 1, "Hi.")))
        )
        assert model.batches == [["Caroline: Hello!", "Hi."]]
        assert archive.search("c", "May 2023")[0].text == "Hello!"

    def test_another_model_is_refused_and_reembed_replaces(self, opener: Opener) -> None:
        opener(embeddings=Concepts(6)).deliver(batch("c", *TEXTS))

        def other(texts: list[str]) -> list[list[float]]:
            return [[1.0, 2.0] for _ in texts]

        with pytest.raises(EmbeddingModelChanged, match="on_model_change='reembed'"):
            opener(embeddings=Concepts(8))
        with pytest.raises(EmbeddingModelChanged):
            opener(embeddings=other)
        assert opener().search("c", "guitar")[0].text == TEXTS[2]  # no model: by text
        replaced = opener(embeddings=Concepts(7), on_model_change="reembed")
        assert replaced.search("c", "automobile", k=1)[0].text == TEXTS[0]
        opener(embeddings=Concepts(7))  # now the stored model

    def test_a_model_that_changes_its_answers_is_caught(self, opener: Opener) -> None:
        model = Concepts(6)
        archive = opener(embeddings=model)
        archive.deliver(batch("c", *TEXTS))
        model.dims = 7
        with pytest.raises(EmbeddingModelChanged, match="7 dimensions"):
            archive.search("c", "automobile")
        with pytest.raises(EmbeddingModelChanged):
            archive.deliver(batch("c", "A new car.", start=10))
        assert archive.count("c") == 4

    def test_messages_archived_without_a_model_are_embedded_on_request(
        self, opener: Opener
    ) -> None:
        opener().deliver(batch("c", *TEXTS))
        archive = opener(embeddings=Concepts())
        assert archive.search("c", "automobile") == []
        assert archive.embed_pending(batch_size=3) == 4
        assert archive.embed_pending() == 0
        assert archive.search("c", "automobile", k=1)[0].text == TEXTS[0]

    @pytest.mark.parametrize(
        ("option", "value"),
        [
            ("coverage", -1.0),
            ("neighbours", float("nan")),
            ("context_weight", -0.1),
            ("dense_weight", 2.0),
            ("fusion", "max"),
            ("after", -1),
        ],
    )
    def test_bad_options_raise_config_error(self, opener: Opener, option: str, value: Any) -> None:
        with pytest.raises(ConfigError, match=option):
            opener(**{option: value})
