"""SQLiteArchive.erase: rows, full-text index, statistics, vectors and the bytes of the file.

The secret is one index token (lowercase letters and digits, which the porter stemmer
leaves alone), so it is stored verbatim in the text, in the neighbours' text, in the term
statistics and in the full-text segments: a byte search of the files finds every copy.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from demote.archive.sqlite import SQLiteArchive, _schema
from demote.backends import wal as _wal
from demote.erase import conversation_hash
from demote.errors import ConversationIdError, FencedOut, StoreError
from demote.records import DemotedMessage, Demotion
from tests.demote.archive.test_archive_vectors import Concepts
from tests.demote.capture.test_capture_erase import leaks

SECRET, SPEAKER, CID = "qzxvault5531", "zorblaxquenn", "tenant-7781-chat"
OTHER = "other-chat"


def message(cid: str, i: int, text: str) -> DemotedMessage:
    return DemotedMessage("user" if i % 2 == 0 else "assistant", text, i, f"{cid}/{i}")


def fill(archive: SQLiteArchive, cid: str, n: int, fence: int | None = None) -> None:
    """``n`` messages in batches of 10 (each batch its own full-text segment)."""
    texts = [f"turn {i} about the car and the bakery in town" for i in range(n)]
    if cid == CID:
        texts[3] = f"my locker code is {SECRET}, remember it"
    for start in range(0, n, 10):
        batch = tuple(message(cid, i, texts[i]) for i in range(start, min(n, start + 10)))
        archive.deliver(Demotion(cid, batch, fence))


def speaker(m: DemotedMessage) -> dict[str, str]:
    user = SPEAKER if m.key.startswith(CID) else "Bob"  # only the erased one names him
    return {"speaker": user if m.role == "user" else "Ava"}


TERMS = (
    "SELECT t.term, t.in_text, t.in_any FROM terms AS t JOIN conversations AS c "
    "ON c.id = t.conversation WHERE c.conversation_id = ? ORDER BY t.term"
)


def rows(archive: SQLiteArchive, sql: str, *args: object) -> list[tuple[object, ...]]:
    return list(archive._db.execute(sql, args).fetchall())


def test_erase_leaves_no_byte_of_the_conversation_in_any_file(tmp_path: Path) -> None:
    path = tmp_path / "archive.db"
    archive = SQLiteArchive(path, context=speaker, embeddings=Concepts())
    fill(archive, CID, 60)
    fill(archive, OTHER, 60)
    assert archive.search(CID, f"locker {SECRET}", k=1)[0].index == 3  # caches its vectors
    before = [(r.index, r.key) for r in archive.search(OTHER, "car bakery town", k=5)]
    other_terms = rows(archive, TERMS, OTHER)
    archive._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
    assert leaks(path, SECRET) and leaks(path, SPEAKER) and leaks(path, CID)

    assert archive.erase(CID) == 60

    for needle in (SECRET, SPEAKER, CID):
        assert leaks(path, needle) == [], f"{needle!r} survives in the file"
    assert (tmp_path / "archive.db-wal").stat().st_size == 0
    assert archive.messages(CID) == [] and archive.count(CID) == 0
    assert archive.search(CID, f"locker {SECRET}") == []
    assert archive.search(CID, "automobile") == [], "no vector left to match"
    assert archive.has_keys(CID, [f"{CID}/3"]) == set() and archive.conversations() == [OTHER]
    for table in ("vectors", "speakers"):
        assert rows(archive, f"SELECT 1 FROM {table} WHERE conversation_id = ?", CID) == []
    assert rows(archive, "SELECT 1 FROM conversations WHERE conversation_id = ?", CID) == []
    # The other conversation is untouched: rows, recall, statistics.
    # (BM25 reads whole-index statistics: the scores move a little, the ranking does not.)
    after = [(r.index, r.key) for r in archive.search(OTHER, "car bakery town", k=5)]
    assert archive.count(OTHER) == 60 and after == before
    assert rows(archive, TERMS, OTHER) == other_terms
    assert rows(archive, "SELECT count(*) FROM terms") == [(len(other_terms),)]
    archive.close()
    assert leaks(path, SECRET) == [] and leaks(path, CID) == []


def test_without_the_index_merge_the_full_text_segments_keep_the_words(tmp_path: Path) -> None:
    # Why erase merges the index: the rows alone, deleted with secure_delete and the WAL
    # truncated, still leave the secret in an FTS5 segment (behind a delete marker).
    path = tmp_path / "archive.db"
    with SQLiteArchive(path) as archive:
        fill(archive, CID, 30)
        fill(archive, OTHER, 30)
        db = archive._db
        db.execute("BEGIN IMMEDIATE")
        db.execute("DELETE FROM messages WHERE conversation_id = ?", (CID,))
        db.execute("COMMIT")
        _wal.truncate_wal(db)
        assert leaks(path, SECRET) == ["archive.db"]
        assert archive.erase(CID) == 0  # nothing left to delete, but the index is merged
        assert leaks(path, SECRET) == []


def test_a_batch_older_than_the_erase_is_fenced_out_in_every_process(tmp_path: Path) -> None:
    path = tmp_path / "archive.db"
    with SQLiteArchive(path) as archive, SQLiteArchive(path) as elsewhere:
        fill(archive, CID, 10, fence=3)
        assert archive.erase(CID, fence=7) == 10
        for arch in (archive, elsewhere):
            with pytest.raises(FencedOut, match="fencing token 6, older than its erase"):
                arch.deliver(Demotion(CID, (message(CID, 0, SECRET),), 6))
        assert archive.count(CID) == 0 and leaks(path, SECRET) == []
        fill(archive, OTHER, 10, fence=6)  # another conversation is not fenced
        assert archive.erase(CID, fence=5) == 0  # an older erase keeps the newer fence
        assert rows(archive, "SELECT conversation, fence FROM erased") == [
            (conversation_hash(CID), 7)
        ]
        fill(elsewhere, CID, 10, fence=8)  # a worker with a newer lease writes again
        fill(archive, CID, 20)  # and a store without leases is never fenced
        assert archive.count(CID) == 20 and archive.count(OTHER) == 10


def test_a_busy_wal_is_reported_and_the_next_erase_finishes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_wal, "PATIENCE", 0.05)
    path = tmp_path / "archive.db"
    with SQLiteArchive(path) as archive:
        fill(archive, CID, 20)
        reader = sqlite3.connect(path, isolation_level=None)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM messages").fetchone()  # holds a WAL snapshot
        with pytest.raises(StoreError, match="WAL could not be truncated"):
            archive.erase(CID)
        assert archive.count(CID) == 0, "the rows are deleted all the same"
        reader.execute("COMMIT")
        reader.close()
        assert archive.erase(CID) == 0
        assert leaks(path, SECRET) == [] and (tmp_path / "archive.db-wal").stat().st_size == 0


def test_a_version_3_file_gains_the_fence_table(tmp_path: Path) -> None:
    path = tmp_path / "v3.db"
    with SQLiteArchive(path) as archive:
        fill(archive, CID, 10)
        fill(archive, OTHER, 10)
        archive._db.executescript("DROP TABLE erased; PRAGMA user_version = 3;")
    with SQLiteArchive(path) as migrated:
        assert rows(migrated, "PRAGMA user_version") == [(_schema.VERSION,)] == [(5,)]
        assert migrated.count() == 20
        assert migrated.erase(CID, fence=2) == 10
        with pytest.raises(FencedOut):
            migrated.deliver(Demotion(CID, (message(CID, 0, "late"),), 1))
    assert leaks(path, SECRET) == []


def test_delete_is_erase_without_a_fence_and_bad_ids_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "archive.db"
    with SQLiteArchive(path) as archive:
        fill(archive, CID, 20)
        assert archive.delete(CID) == 20 and archive.delete(CID) == 0
        assert leaks(path, SECRET) == [] and rows(archive, "SELECT * FROM erased") == []
        for bad in ("", None, 3):
            with pytest.raises(ConversationIdError):
                archive.erase(bad)  # type: ignore[arg-type]


async def test_aerase(tmp_path: Path) -> None:
    path = tmp_path / "archive.db"
    with SQLiteArchive(path) as archive:
        fill(archive, CID, 20)
        fill(archive, OTHER, 20)
        assert await archive.aerase(CID, fence=4, keys=["ignored"]) == 20
        assert archive.count() == 20 and leaks(path, SECRET) == []


def test_an_in_memory_archive_erases_too() -> None:
    with SQLiteArchive(":memory:") as archive:
        fill(archive, CID, 10)
        assert archive.erase(CID) == 10 and archive.count() == 0
