"""ArchiveOptions: the recall options both archives take, checked once, and how an
archive combines ``options=`` with its keywords (the keywords override)."""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import demote
from demote.archive.options import ArchiveKeywords, ArchiveOptions
from demote.archive.postgres import PostgresArchive
from demote.archive.sqlite import SQLiteArchive
from demote.errors import ArgumentTypeError, ConfigError
from demote.records import DemotedMessage, Demotion, fingerprint, make_key
from tests.demote.archive.pg import drop_archive

BAD: list[tuple[str, object]] = [
    ("context_weight", -0.1),
    ("adjacent_weight", math.nan),
    ("coverage", "1"),
    ("neighbours", True),
    ("speaker_weight", math.inf),
    ("time_weight", -1),
    ("dense_weight", 1.5),
    ("decompose", 2.0),
    ("rerank_weight", -0.5),
    ("packing", 4.5),
    ("candidates", 0),
    ("candidates", 2.5),
    ("after", -1),
    ("rerank_depth", 0),
    ("counter", "no-such-counter"),
    ("counter", 3),
    ("fusion", "max"),
    ("on_model_change", "ignore"),
    ("media", "base64"),
    ("stop_words", "the"),
    ("stop_words", [None]),
    ("context", "speaker"),
    ("reranker", 3),
    ("embeddings", object()),
]


@pytest.mark.parametrize(("field", "value"), BAD, ids=lambda v: repr(v)[:20])
def test_a_bad_field_is_refused_naming_it(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        ArchiveOptions(**{field: value})


@pytest.mark.parametrize("field", ["context", "reranker", "stop_words", "coverage"])
def test_a_value_of_the_wrong_type_is_an_argument_type_error(field: str) -> None:
    value: object = 3 if field != "coverage" else "0.4"
    kind = ConfigError if field == "coverage" else ArgumentTypeError
    with pytest.raises(kind, match=field):
        ArchiveOptions(**{field: value})


def test_values_are_normalised_so_equal_options_compare_equal() -> None:
    given = ArchiveOptions(coverage=1, stop_words=["The", "A", "the"], packing=0)
    assert given.coverage == 1.0 and isinstance(given.coverage, float)
    assert given.stop_words == frozenset({"the", "a"})
    assert given == ArchiveOptions(stop_words={"a", "the"}, coverage=1.0)
    assert hash(given) == hash(ArchiveOptions(stop_words=("a", "the")))
    assert ArchiveOptions() == ArchiveOptions(candidates=50, after=0, media="reference")


def test_frozen_and_replace_checks_again() -> None:
    options = ArchiveOptions(after=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.after = 2  # type: ignore[misc]
    assert dataclasses.replace(options, after=3).after == 3
    with pytest.raises(ConfigError, match="after"):
        dataclasses.replace(options, after=-3)
    assert options.after == 1


def test_the_keywords_are_the_fields_with_the_same_types() -> None:
    # ArchiveKeywords types the archives' **recall; it must not drift from the fields.
    fields = {f.name: f.type for f in dataclasses.fields(ArchiveOptions)}
    keywords = {
        k: getattr(t, "__forward_arg__", t) for k, t in ArchiveKeywords.__annotations__.items()
    }
    assert keywords == fields
    assert ArchiveKeywords.__optional_keys__ == frozenset(fields)


def test_exported_at_the_top() -> None:
    assert demote.ArchiveOptions is ArchiveOptions and "ArchiveOptions" in demote.__all__


# -- options= and keywords together -----------------------------------------------------------


def test_keywords_override_the_options_object(tmp_path: Path) -> None:
    tuned = ArchiveOptions(after=1, time_weight=0.5, candidates=30)
    with SQLiteArchive(tmp_path / "a.db", options=tuned, after=2, pool=40) as archive:
        assert archive.options == dataclasses.replace(tuned, after=2, candidates=40)
        assert tuned.after == 1  # the object given is not changed
    with SQLiteArchive(tmp_path / "b.db", options=tuned) as archive:
        assert archive.options is tuned
    with SQLiteArchive(tmp_path / "c.db", coverage=0) as archive:
        assert archive.options == ArchiveOptions(coverage=0.0)


def test_the_keywords_change_what_a_search_returns(tmp_path: Path) -> None:
    # after=1 from options, after=0 from a keyword over it: the follower is dropped.
    lines = ["where did we hike?", "the alps in june", "nice", "and the tent?", "it leaked"]
    messages = tuple(
        DemotedMessage(role="user", text=t, index=i, key=make_key("c", i, fingerprint("user", t)))
        for i, t in enumerate(lines)
    )
    tuned = ArchiveOptions(after=1)
    with (
        SQLiteArchive(tmp_path / "a.db", options=tuned) as kept,
        SQLiteArchive(tmp_path / "b.db", options=tuned, after=0) as plain,
    ):
        for archive in (kept, plain):
            archive.deliver(Demotion("c", messages))
        assert [h.text for h in kept.search("c", "hike", 1)] == lines[:2]
        assert [h.text for h in plain.search("c", "hike", 1)] == lines[:1]


def test_a_bad_keyword_over_good_options_opens_nothing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="dense_weight"):
        SQLiteArchive(tmp_path / "a.db", options=ArchiveOptions(), dense_weight=2.0)
    with pytest.raises(ConfigError, match="pool"):
        SQLiteArchive(tmp_path / "a.db", options=ArchiveOptions(), pool=0)
    assert not (tmp_path / "a.db").exists()


@pytest.mark.parametrize(
    ("kwargs", "kind", "match"),
    [
        ({"options": {"after": 1}}, ArgumentTypeError, "options: must be an ArchiveOptions"),
        ({"bogus": 1}, TypeError, "unexpected keyword argument 'bogus'"),
        ({"pool": 10, "candidates": 10}, ConfigError, "pool: the same option as candidates"),
        ({"pool": None}, ConfigError, "pool"),
        ({"entity_weight": -1.0}, ConfigError, "entity_weight"),
    ],
)
def test_sqlite_refuses_what_is_not_an_option(
    tmp_path: Path, kwargs: dict[str, Any], kind: type[Exception], match: str
) -> None:
    with pytest.raises(kind, match=match):
        SQLiteArchive(tmp_path / "a.db", **kwargs)
    assert not (tmp_path / "a.db").exists()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"options": "defaults"}, "options: must be an ArchiveOptions"),
        ({"entities": True}, "unexpected keyword argument 'entities'"),  # SQLite's own
        ({"options": ArchiveOptions(), "candidates": 0}, "candidates"),
    ],
)
def test_postgres_refuses_before_it_connects(kwargs: dict[str, Any], match: str) -> None:
    # No server is asked: the options are checked first (this DSN would refuse anyway).
    with pytest.raises((ArgumentTypeError, ConfigError), match=match):
        PostgresArchive("postgresql://nobody@127.0.0.1:1/none", **kwargs)


# -- one options object, both archives -------------------------------------------------------

LINES = [
    ("user", "We hiked the Alps in June; the tent leaked."),
    ("assistant", "A leaking tent in the Alps sounds miserable."),
    ("user", "Melanie read two books about turtles last summer."),
    ("assistant", "Turtles live a long time."),
    ("user", "About three years now."),
    ("assistant", "How long have you had your turtles?"),
    ("user", "Caroline painted the lake at sunrise."),
    ("assistant", "Which books did Melanie like best?"),
]


def speaker(message: DemotedMessage) -> dict[str, str]:
    return {"speaker": "Melanie" if message.role == "user" else "Ava", "date": "8 May, 2023"}


@pytest.fixture
def table(postgres_url: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    drop_archive(postgres_url, name)


def test_both_archives_rank_the_same_given_one_options_object(
    postgres_url: str, table: str, tmp_path: Path
) -> None:
    tuned = ArchiveOptions(
        context=speaker, after=1, time_weight=0.5, decompose=0.5, packing=0.2, candidates=20
    )
    messages = tuple(
        DemotedMessage(role=r, text=t, index=i, key=make_key("c", i, fingerprint(r, t)))
        for i, (r, t) in enumerate(LINES)
    )
    with (
        SQLiteArchive(tmp_path / "a.db", options=tuned) as lite,
        PostgresArchive(postgres_url, table=table, options=tuned) as pg,
    ):
        assert lite.options == pg.options == tuned
        for archive in (lite, pg):
            archive.deliver(Demotion("c", messages[:5]))
            archive.deliver(Demotion("c", messages[5:]))
        asked = 0
        for query in ["tent", "what did Melanie read in the summer?", "turtles and books"]:
            for k, budget in ((3, None), (5, 30)):
                want = lite.search("c", query, k, budget_tokens=budget)
                got = pg.search("c", query, k, budget_tokens=budget)
                assert [(h.index, h.text) for h in got] == [(h.index, h.text) for h in want]
                assert [h.score for h in got] == pytest.approx([h.score for h in want], rel=1e-5)
                asked += bool(want)
        assert asked == 6
