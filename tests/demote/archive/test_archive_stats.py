"""SQLiteArchive's term statistics, their migration, and ranking with them."""

from __future__ import annotations

import math
import random
import sqlite3
from pathlib import Path

import pytest

from demote.archive import _fts, _lexical, _rank
from demote.archive._search import scope as _scope
from demote.archive.sqlite import SQLiteArchive
from demote.records import DemotedMessage, Demotion, Recalled, fingerprint, make_key
from tests.demote.archive.legacy import make_old_archive

WORDS = [
    "garden",
    "river",
    "runs",
    "running",
    "dogs",
    "dog",
    "hiking",
    "cake",
    "paint",
    "painting",
    "Paris",
    "museum",
    "trip",
]


def msg(conversation_id: str, index: int, text: str, speaker: str = "") -> DemotedMessage:
    return DemotedMessage(
        role="user",
        text=text,
        index=index,
        key=make_key(conversation_id, index, fingerprint("user", text)),
        raw={"speaker": speaker},
    )


def speaker(message: DemotedMessage) -> str | None:
    return message.raw.get("speaker") if isinstance(message.raw, dict) else None


def chat(conversation_id: str, n: int, seed: int) -> list[DemotedMessage]:
    rng = random.Random(seed)
    return [
        msg(
            conversation_id,
            i,
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8)))
            + ("?" if rng.random() < 0.2 else ""),
            rng.choice(["Caroline", "Melanie running"]),
        )
        for i in range(n)
    ]


def fill(archive: SQLiteArchive, messages: list[DemotedMessage], size: int = 7) -> None:
    """Deliver ``messages`` in batches, under the conversation named by their keys."""
    for start in range(0, len(messages), size):
        for conversation_id in ("a", "b"):
            batch = tuple(
                m
                for m in messages[start : start + size]
                if m.key == make_key(conversation_id, m.index, fingerprint("user", m.text))
            )
            if batch:
                archive.deliver(Demotion(conversation_id, batch))


def stats(db: sqlite3.Connection) -> dict[tuple[str, str], tuple[int, int]]:
    return {
        (c, term): (in_text, in_any)
        for c, term, in_text, in_any in db.execute(
            "SELECT c.conversation_id, t.term, t.in_text, t.in_any "
            "FROM terms AS t JOIN conversations AS c ON c.id = t.conversation"
        )
    }


def reference(db: sqlite3.Connection) -> dict[tuple[str, str], tuple[int, int]]:
    """The statistics counted from the main index itself."""
    db.execute(
        "CREATE VIRTUAL TABLE IF NOT EXISTS temp.reference "
        "USING fts5vocab(main, messages_fts, 'instance')"
    )
    rows = db.execute(
        "SELECT m.conversation_id, v.term, "
        "count(DISTINCT v.doc) FILTER (WHERE v.col = 'text'), count(DISTINCT v.doc) "
        "FROM temp.reference AS v JOIN messages AS m ON m.id = v.doc "
        "WHERE v.col IN ('text', 'context') GROUP BY m.conversation_id, v.term"
    ).fetchall()
    return {(c, term): (in_text, in_any) for c, term, in_text, in_any in rows}


def counts(db: sqlite3.Connection) -> dict[str, int]:
    return dict(db.execute("SELECT conversation_id, messages FROM conversations").fetchall())


def test_statistics_follow_deliveries_redeliveries_and_deletes(tmp_path: Path) -> None:
    a, b = chat("a", 60, 1), chat("b", 40, 2)
    with SQLiteArchive(tmp_path / "a.db", context=speaker) as archive:
        fill(archive, a)
        fill(archive, b, size=40)
        fill(archive, a[10:30], size=5)  # re-delivery stores and counts nothing
        archive.deliver(Demotion("a", (a[0], a[0], a[1])))
        db = archive._db
        assert stats(db) == reference(db)
        assert counts(db) == {"a": 60, "b": 40}
        assert archive.delete("a") == 60
        assert stats(db) == reference(db)
        assert counts(db) == {"b": 40}
        assert {c for c, _ in stats(db)} == {"b"}
        fill(archive, a[:5])
        assert stats(db) == reference(db)
        assert counts(db) == {"a": 5, "b": 40}
        # The scratch table is left empty.
        archive.search("a", "running dogs in the garden", k=3)
        assert db.execute("SELECT count(*) FROM temp.demote_scratch_terms").fetchone() == (0,)


def test_a_failed_delivery_counts_nothing(tmp_path: Path) -> None:
    with SQLiteArchive(tmp_path / "a.db") as archive:
        archive.deliver(Demotion("c", (msg("c", 0, "first garden"),)))
        archive._db.execute(
            "CREATE TRIGGER boom AFTER INSERT ON terms WHEN new.term = 'boom' "
            "BEGIN SELECT RAISE(ABORT, 'disk on fire'); END"
        )
        with pytest.raises(Exception, match="disk on fire"):
            archive.deliver(Demotion("c", (msg("c", 1, "garden"), msg("c", 2, "boom"))))
        assert counts(archive._db) == {"c": 1}
        assert stats(archive._db) == {("c", "first"): (1, 1), ("c", "garden"): (1, 1)}


def make_version_1(path: Path, messages: list[DemotedMessage]) -> None:
    """A version-1 archive: the version-2 schema without the statistics tables."""
    owned = [(owner(m), m) for m in messages]
    make_old_archive(path, owned, 1, speaker)


def owner(m: DemotedMessage) -> str:
    return next(c for c in ("a", "b") if m.key == make_key(c, m.index, fingerprint("user", m.text)))


def test_a_version_1_file_is_migrated_at_open(tmp_path: Path) -> None:
    a, b = chat("a", 50, 3), chat("b", 30, 4)
    make_version_1(tmp_path / "old.db", a + b)
    with SQLiteArchive(tmp_path / "new.db", context=speaker) as fresh:
        fill(fresh, a)
        fill(fresh, b)
        with SQLiteArchive(tmp_path / "old.db", context=speaker) as migrated:
            db = migrated._db
            assert db.execute("PRAGMA user_version").fetchone() == (5,)
            assert stats(db) == reference(db) == stats(fresh._db)
            assert counts(db) == {"a": 50, "b": 30}
            for query in ("running dogs", "cake in Paris", "Melanie hiking trip", "museum?"):
                assert migrated.search("a", query, k=5) == fresh.search("a", query, k=5)
            migrated.deliver(Demotion("a", (msg("a", 50, "new garden cake"),)))
            assert stats(db) == reference(db)
    with SQLiteArchive(tmp_path / "old.db") as again:  # opened once more: not re-counted
        assert stats(again._db) == reference(again._db)


def test_a_failed_migration_leaves_the_version_1_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.db"
    make_version_1(path, chat("a", 20, 5))

    def broken(db: sqlite3.Connection, chunk: int = 2000) -> None:
        db.execute("INSERT INTO conversations (conversation_id, messages) VALUES ('x', 1)")
        raise sqlite3.OperationalError("disk on fire")

    monkeypatch.setattr(_lexical, "rebuild_terms", broken)
    with pytest.raises(Exception, match="disk on fire"):
        SQLiteArchive(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone() == (1,)
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
    assert "terms" not in tables and "conversations" not in tables
    assert db.execute("SELECT count(*) FROM messages").fetchone() == (20,)
    db.close()


def test_stems_come_from_the_index_tokenizer() -> None:
    db = sqlite3.connect(":memory:", isolation_level=None)
    _fts.create_scratch(db)
    assert _fts.stems(db, ["running", "e.g", "", "Café", "dogs"]) == [
        ("run",),
        ("e", "g"),
        (),
        ("cafe",),
        ("dog",),
    ]
    cache = _fts.Stems(size=3)
    assert cache(db, ["running", "running", "dogs"]) == [("run",), ("run",), ("dog",)]
    db.close()
    assert cache(db, ["dogs", "running"]) == [("dog",), ("run",)]  # no database needed
    with pytest.raises(sqlite3.ProgrammingError):
        cache(db, ["cake", "paint"])  # past its size the cache starts again


def test_pick_terms_keeps_the_rarest_within_the_budget() -> None:
    terms = ["a", "b", "c", "d", "e"]
    assert _lexical.pick_terms(terms, [5, 0, 3, 9, 1], budget=100) == ["a", "c", "d", "e"]
    assert _lexical.pick_terms(terms, [500, 0, 300, 900, 100], budget=1000) == ["a", "c", "e"]
    assert _lexical.pick_terms(terms, [5000, 0, 3000, 9000, 1001], budget=1000) == ["e"]
    assert _lexical.pick_terms(terms, [0] * 5, budget=1000) == []


def test_a_frequent_term_past_the_budget_still_counts_as_coverage(tmp_path: Path) -> None:
    filler = [f"the weather was fine on day {i}" for i in range(_lexical.MATCH_BUDGET + 50)]
    texts = [*filler, "umbrella alone", "an umbrella for the weather", "umbrella again"]
    with SQLiteArchive(tmp_path / "a.db", adjacent_weight=0) as archive:
        archive.deliver(Demotion("c", tuple(msg("c", i, t) for i, t in enumerate(texts))))
        hits = archive.search("c", "weather umbrella", k=5)
        assert hits[0].text == "an umbrella for the weather"
        assert {h.text for h in hits} == set(texts[-3:])
        assert len(archive.search("c", "weather", k=3)) == 3


# -- the ranking equals the one that counted everything on every search ---------------


def old_search(archive: SQLiteArchive, conversation_id: str, query: str, k: int) -> list[Recalled]:
    """The ranking before term statistics: counts from the index on every search."""
    weights, pool, coverage_weight, neighbours = archive._searcher.ranking[:4]
    terms = _fts.query_terms(query)
    if not terms:
        return []
    db, scope = archive._db, _scope(conversation_id)
    columns = ("text", "context") if weights[2] > 0 else ("text",)
    rows = db.execute(
        "SELECT m.id, m.idx, m.role, m.text, m.key, -bm25(messages_fts, ?, ?, ?) AS score, "
        "m.context FROM messages_fts JOIN messages AS m ON m.id = messages_fts.rowid "
        "WHERE messages_fts MATCH ? AND m.conversation_id = ? "
        "ORDER BY score DESC, m.idx LIMIT ?",
        (
            *weights[:3],
            f"scope : {_fts.quote(scope)} AND {_fts.match_any(terms, columns)}",
            conversation_id,
            max(pool, k),
        ),
    ).fetchall()
    if not rows:
        return []
    total = archive.count(conversation_id)
    hits: dict[int, float] = {}
    weight_sum = 0.0
    for term in terms:
        expression = f"scope : {_fts.quote(scope)} AND {_fts.match_any([term], columns)}"
        matched = {
            rowid
            for (rowid,) in db.execute(
                "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?", (expression,)
            )
        }
        if not matched:
            continue
        idf = math.log(1.0 + (total - len(matched) + 0.5) / (len(matched) + 0.5))
        weight_sum += idf
        for row in rows:
            if row[0] in matched:
                hits[row[0]] = hits.get(row[0], 0.0) + idf
    shares = {i: w / weight_sum for i, w in hits.items()} if len(terms) > 1 else {}
    candidates = [_rank.Candidate(r[0], r[1], r[2], r[3], r[4], r[5], r[6]) for r in rows]
    if neighbours > 0:
        questions = {c.index + 1 for c in candidates if "?" in c.text}
        have = {c.index for c in candidates}
        candidates += _lexical.rows_at(db, conversation_id, questions - have)
    # A row that says no query term itself ranks below the neighbour that lifted it.
    own = set(hits) if neighbours > 0 else None
    scores = _rank.lexical_scores(candidates, shares, coverage_weight, neighbours, own)
    return _rank.select(scores, {c.index: c for c in reversed(candidates)}, k)


@pytest.mark.parametrize("context_weight", [1.0, 0.0])
def test_below_the_budget_search_ranks_as_counting_everything_did(
    tmp_path: Path, context_weight: float
) -> None:
    rng = random.Random(11)
    queries = [
        " ".join(rng.choice([*WORDS, "Caroline", "Melanie", "zebra"]) for _ in range(4))
        for _ in range(60)
    ]
    with SQLiteArchive(
        tmp_path / "a.db",
        context=speaker,
        context_weight=context_weight,
        adjacent_weight=0,
        pool=10,
    ) as archive:
        fill(archive, chat("a", 300, 6))
        fill(archive, chat("b", 100, 7))
        for query in queries:
            for k in (1, 5):
                assert archive.search("a", query, k) == old_search(archive, "a", query, k)


def test_past_the_budget_only_the_newest_matches_are_scored(tmp_path: Path) -> None:
    n = _lexical.MATCH_BUDGET + 100
    texts = ["weather weather weather report", *(f"the weather on day {i}" for i in range(n))]
    # A weak neighbour lift: term frequency, not neighbouring matches, decides below.
    with SQLiteArchive(tmp_path / "a.db", adjacent_weight=0, neighbours=0.4) as archive:
        archive.deliver(Demotion("c", tuple(msg("c", i, t) for i, t in enumerate(texts))))
        hits = archive.search("c", "weather", k=10)
        assert len(hits) == 10
        assert all(h.index > len(texts) - 1 - _lexical.MATCH_BUDGET for h in hits)
        # Below the budget the same message wins on its term frequency.
        archive.delete("c")
        fewer = [*texts[:20], *(f"a quiet day {i}" for i in range(40))]
        archive.deliver(Demotion("c", tuple(msg("c", i, t) for i, t in enumerate(fewer))))
        assert archive.search("c", "weather", k=1)[0].index == 0
