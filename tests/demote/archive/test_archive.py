from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from demote.archive._fts import query_terms
from demote.archive.sqlite import SQLiteArchive
from demote.errors import ConfigError, ConversationIdError, StoreError
from demote.hooks.base import Recall, SyncHook
from demote.records import DemotedMessage, Demotion, fingerprint, make_key


def msg(conversation_id: str, index: int, text: str, role: str = "user") -> DemotedMessage:
    return DemotedMessage(
        role=role,  # type: ignore[arg-type]
        text=text,
        index=index,
        key=make_key(conversation_id, index, fingerprint(role, text)),
    )


def batch(conversation_id: str, *texts: str, start: int = 0) -> Demotion:
    return Demotion(
        conversation_id,
        tuple(msg(conversation_id, start + i, t) for i, t in enumerate(texts)),
    )


@pytest.fixture
def archive(tmp_path: Path) -> SQLiteArchive:
    # These tests check which messages match; the neighbours' text, which also makes a
    # message match, is tested on its own (test_archive_recall.py).
    with SQLiteArchive(tmp_path / "archive.db", adjacent_weight=0) as a:
        yield a  # type: ignore[misc]


FILLER = [
    "We talked about the weather and the week ahead.",
    "My sister visited for the weekend.",
    "I cooked pasta with tomatoes and basil.",
    "The new job starts on Monday morning.",
]


def test_satisfies_the_hook_and_recall_protocols(archive: SQLiteArchive) -> None:
    assert isinstance(archive, SyncHook)
    assert isinstance(archive, Recall)


def test_redelivery_of_the_same_keys_stores_nothing_twice(archive: SQLiteArchive) -> None:
    b = batch("c", "one", "two", "three")
    archive.deliver(b)
    archive.deliver(b)
    archive.deliver(Demotion("c", b.messages[1:]))
    assert archive.count("c") == 3
    assert [m.text for m in archive.messages("c")] == ["one", "two", "three"]
    # The FTS index did not get duplicates either.
    hits = archive.search("c", "two three", k=10)
    assert sorted(h.text for h in hits) == ["three", "two"]


def test_messages_come_back_in_index_order(archive: SQLiteArchive) -> None:
    archive.deliver(batch("c", "five", "six", start=5))
    archive.deliver(batch("c", "zero", "one", start=0))
    got = archive.messages("c")
    assert [m.index for m in got] == [0, 1, 5, 6]
    assert [m.text for m in got] == ["zero", "one", "five", "six"]
    assert got[0].key == make_key("c", 0, fingerprint("user", "zero"))
    assert got[0].role == "user"


def test_search_is_scoped_to_one_conversation(archive: SQLiteArchive) -> None:
    archive.deliver(batch("alice", "I adopted a cat named Pixel", *FILLER))
    archive.deliver(batch("bob", "My cat Pixel likes the garden", *FILLER))
    for conversation_id in ("alice", "bob"):
        hits = archive.search(conversation_id, "cat Pixel")
        assert len(hits) == 1
        stored = {m.key for m in archive.messages(conversation_id)}
        assert {h.key for h in hits} <= stored
    assert archive.search("alice", "cat")[0].text == "I adopted a cat named Pixel"
    assert archive.search("bob", "cat")[0].text == "My cat Pixel likes the garden"
    assert archive.search("carol", "cat") == []


def test_batch_lands_only_under_its_own_conversation(archive: SQLiteArchive) -> None:
    archive.deliver(batch("A", "alpha text", "beta text"))
    assert archive.count("A") == 2
    assert archive.count("B") == 0
    assert archive.conversations() == ["A"]
    # The same key under another conversation is a different message.
    archive.deliver(Demotion("B", batch("A", "alpha text").messages))
    assert archive.count("B") == 1
    assert archive.count() == 3


def test_stemming_running_finds_runs(archive: SQLiteArchive) -> None:
    archive.deliver(batch("c", "She runs along the river every day", *FILLER))
    hits = archive.search("c", "running")
    assert [h.text for h in hits] == ["She runs along the river every day"]


def test_stop_words_are_dropped(archive: SQLiteArchive) -> None:
    archive.deliver(batch("c", "What is the plan for the trip?", "Museum tickets for Paris"))
    assert archive.search("c", "what is the") == []
    assert archive.search("c", "") == []
    assert archive.search("c", "?!... --") == []
    hits = archive.search("c", "what about the museum")
    assert [h.text for h in hits] == ["Museum tickets for Paris"]
    assert query_terms("What is THE museum, the Museum?") == ["museum"]


def test_ranking_prefers_the_message_that_covers_the_query(archive: SQLiteArchive) -> None:
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
    assert archive.search("c", "garden", k=1)[0].text in {
        "The garden needs water",
        "I planted tomatoes in the garden last spring",
    }
    assert len(archive.search("c", "garden tomatoes", k=1)) == 1
    assert archive.search("c", "garden", k=0) == []


def test_a_reply_to_a_matching_question_is_lifted() -> None:
    texts = [
        "Which team did you sign with?",
        "The Minnesota Wolves!",
        "Nice weather for a walk today.",
        "I bought new running shoes.",
        "The season opener is next week.",
        "Pizza for dinner again.",
    ]
    with (
        SQLiteArchive(":memory:", adjacent_weight=0) as plain,
        SQLiteArchive(":memory:", adjacent_weight=0, neighbours=0) as alone,
    ):
        plain.deliver(batch("c", *texts))
        alone.deliver(batch("c", *texts))
        assert "The Minnesota Wolves!" in [h.text for h in plain.search("c", "which team", k=2)]
        assert [h.text for h in alone.search("c", "which team", k=2)] == [texts[0]]


@pytest.mark.parametrize(
    "query",
    [
        'say "hello',
        "hello*",
        "text:hello",
        "-hello",
        "hello AND NOT world",
        "NEAR(hello world)",
        "hello OR",
        "^hello",
        "(hello",
        "hello'); DROP TABLE messages; --",
        "{scope context} : hello",
        "hello\x00world",
    ],
)
def test_fts_syntax_in_queries_is_plain_text(archive: SQLiteArchive, query: str) -> None:
    archive.deliver(batch("c", "hello there", "goodbye now", *FILLER))
    hits = archive.search("c", query)
    assert [h.text for h in hits] == ["hello there"]
    assert archive.count() == 6


def test_the_scope_column_cannot_be_searched_from_a_query(archive: SQLiteArchive) -> None:
    archive.deliver(batch("c", "hello there"))
    scope = archive._db.execute("SELECT scope FROM messages").fetchone()[0]
    assert archive.search("c", scope) == []


def test_ids_the_state_stores_refuse_are_refused_too(tmp_path: Path) -> None:
    # A NUL or an id over 16 KiB would be truncated or refused by other stores: the
    # archive takes the ids the engine takes, no more.
    with SQLiteArchive(tmp_path / "a.db") as archive:
        for bad in ("nul\x00inside", "y" * 20_000):
            with pytest.raises(ConversationIdError, match="conversation_id"):
                archive.deliver(batch(bad, "hello"))
        assert archive.count() == 0


@pytest.mark.parametrize(
    "conversation_id",
    [
        'it\'s "quoted"',
        "100%_done",
        "a; DROP TABLE messages; --",
        "../../etc/passwd",
        "x" * 10_000,
        "NEAR(a b) OR *",
        "日本語の会話",
    ],
)
def test_awkward_conversation_ids_are_stored_and_scoped(
    tmp_path: Path, conversation_id: str
) -> None:
    with SQLiteArchive(tmp_path / "a.db") as archive:
        archive.deliver(batch(conversation_id, "the secret word is marmalade", *FILLER))
        archive.deliver(batch("other", "marmalade for the neighbour", *FILLER))
        assert archive.count(conversation_id) == 5
        hits = archive.search(conversation_id, "marmalade")
        assert hits[0].text == "the secret word is marmalade"
        assert {h.key for h in hits} <= {m.key for m in archive.messages(conversation_id)}
        assert sorted(archive.conversations()) == sorted([conversation_id, "other"])
        assert (
            archive.has_keys(conversation_id, [m.key for m in archive.messages("other")]) == set()
        )
        assert archive.delete(conversation_id) == 5
        assert archive.count() == 5
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("a.db")) == []


@pytest.mark.parametrize("bad", ["", None, 42, b"bytes", "lone\ud800surrogate"])
def test_bad_conversation_ids_raise_and_store_nothing(archive: SQLiteArchive, bad: object) -> None:
    with pytest.raises(ConversationIdError):
        archive.deliver(Demotion(bad, (msg("x", 0, "hello"),)))  # type: ignore[arg-type]
    with pytest.raises(ConversationIdError):
        archive.search(bad, "hello")  # type: ignore[arg-type]
    with pytest.raises(ConversationIdError):
        archive.messages(bad)  # type: ignore[arg-type]
    with pytest.raises(ConversationIdError):
        archive.has_keys(bad, ["k"])  # type: ignore[arg-type]
    with pytest.raises(ConversationIdError):
        archive.delete(bad)  # type: ignore[arg-type]
    assert archive.count() == 0
    assert archive.conversations() == []
    assert issubclass(ConversationIdError, ValueError)


def test_text_with_a_lone_surrogate_is_kept_readable(archive: SQLiteArchive) -> None:
    archive.deliver(batch("c", "broken \ud83d emoji cake"))
    [stored] = archive.messages("c")
    assert stored.text.startswith("broken ") and stored.text.endswith(" emoji cake")
    assert archive.search("c", "cake")[0].index == 0


def test_has_keys_reports_only_stored_keys(archive: SQLiteArchive) -> None:
    b = batch("c", *(f"message {i}" for i in range(1200)))
    archive.deliver(b)
    keys = [m.key for m in b.messages]
    assert archive.has_keys("c", [*keys, "missing"]) == set(keys)
    assert archive.has_keys("c", []) == set()
    assert archive.has_keys("d", keys) == set()


def test_eight_threads_deliver_and_search_at_once(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)
    with SQLiteArchive(tmp_path / "a.db") as archive:

        def work(n: int) -> None:
            try:
                barrier.wait()
                conversation_id = f"conv-{n % 4}"
                for i in range(25):
                    index = n * 100 + i
                    m = msg(conversation_id, index, f"thread {n} message {i} about kites")
                    archive.deliver(Demotion(conversation_id, (m,)))
                    archive.deliver(Demotion(conversation_id, (m,)))
                    archive.search(conversation_id, "kites message", k=3)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert archive.count() == 200
        assert all(archive.count(f"conv-{c}") == 50 for c in range(4))
        assert len(archive.search("conv-0", "kites", k=100)) == 50


def test_contents_persist_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    with SQLiteArchive(path) as archive:
        archive.deliver(batch("c", "remember the blue umbrella", *FILLER))
    with SQLiteArchive(str(path)) as archive:
        assert archive.count("c") == 5
        assert archive.search("c", "umbrella")[0].text == "remember the blue umbrella"
        archive.deliver(batch("c", "remember the blue umbrella", *FILLER))
        assert archive.count("c") == 5


def test_delete_removes_messages_and_their_index(archive: SQLiteArchive) -> None:
    archive.deliver(batch("c", "kites fly high", *FILLER))
    archive.deliver(batch("d", "kites in the park", *FILLER))
    assert archive.delete("c") == 5
    assert archive.delete("c") == 0
    assert archive.search("c", "kites") == []
    assert archive.conversations() == ["d"]
    assert [h.text for h in archive.search("d", "kites")] == ["kites in the park"]
    # Re-delivery after delete stores again (the keys are gone too).
    archive.deliver(batch("c", "kites fly high"))
    assert archive.count("c") == 1


def test_context_is_indexed_but_not_returned(tmp_path: Path) -> None:
    def speaker(m: DemotedMessage) -> str | None:
        return m.raw.get("speaker") if isinstance(m.raw, dict) else None

    with SQLiteArchive(tmp_path / "a.db", context=speaker) as archive:
        messages = (
            DemotedMessage("user", "I went hiking", 0, "k0", raw={"speaker": "Caroline"}),
            DemotedMessage("assistant", "I went fishing", 1, "k1", raw={"speaker": "Melanie"}),
            DemotedMessage("user", "Nothing much", 2, "k2"),
        )
        archive.deliver(Demotion("c", messages))
        hits = archive.search("c", "what did Melanie do", k=5)
        assert [h.text for h in hits] == ["I went fishing"]
        assert "Melanie" not in {m.text for m in archive.messages("c")}
    with SQLiteArchive(tmp_path / "a.db", context_weight=0) as archive:
        assert archive.search("c", "Melanie") == []


def test_a_missing_directory_raises_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot open archive") as info:
        SQLiteArchive(tmp_path / "missing" / "a.db")
    assert isinstance(info.value.__cause__, sqlite3.Error)


def test_a_file_that_is_not_a_database_raises_store_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"this is not a database, just some text\n" * 200)
    with pytest.raises(StoreError) as info:
        SQLiteArchive(path)
    assert isinstance(info.value.__cause__, sqlite3.Error)
    assert path.read_bytes().startswith(b"this is not a database")


def test_an_archive_with_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreError, match="schema version 99"):
        SQLiteArchive(path)


def test_backend_failure_during_deliver_is_a_store_error_and_stores_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.db"
    with SQLiteArchive(path) as archive:
        archive.deliver(batch("c", "first"))
        archive._db.execute("DROP TRIGGER messages_ai")
        archive._db.execute(
            "CREATE TRIGGER messages_ai AFTER INSERT ON messages WHEN new.text = 'boom' "
            "BEGIN SELECT RAISE(ABORT, 'disk on fire'); END"
        )
        with pytest.raises(StoreError, match="disk on fire"):
            archive.deliver(batch("c", "second", "boom", start=1))
        assert [m.text for m in archive.messages("c")] == ["first"]


def test_a_closed_archive_raises_store_error(tmp_path: Path) -> None:
    archive = SQLiteArchive(tmp_path / "a.db")
    archive.close()
    archive.close()
    with pytest.raises(StoreError, match="closed"):
        archive.deliver(batch("c", "hello"))
    with pytest.raises(StoreError, match="closed"):
        archive.search("c", "hello")


@pytest.mark.parametrize(
    ("option", "value"),
    [("coverage", -1.0), ("neighbours", float("nan")), ("pool", 0), ("context_weight", -0.1)],
)
def test_bad_options_raise_config_error(tmp_path: Path, option: str, value: float) -> None:
    with pytest.raises(ConfigError, match=option):
        SQLiteArchive(tmp_path / "a.db", **{option: value})  # type: ignore[arg-type]
    assert not (tmp_path / "a.db").exists()
