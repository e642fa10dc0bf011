"""Whole messages in the SQLite and PostgreSQL archives: stored, searched, given back, migrated.

Real langchain-core messages go through a real Demoter into a real archive (a SQLite
file, or PostgreSQL on ``DEMOTE_TEST_POSTGRES_URL``); what comes back must compare equal
to the originals. Old archives (a SQLite file of schema 4 built with that schema's tables,
a version-2 file, a PostgreSQL table of version 1) open, keep their rows readable as text
only, and store whole messages from then on.
"""

from __future__ import annotations

import base64
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langchain_core", reason="langchain-core not installed (demote[langchain])")

import psycopg
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from demote import Demoter, SlidingWindow
from demote.archive import _fts, _lexical
from demote.archive.postgres import PostgresArchive
from demote.archive.sqlite import SQLiteArchive, _schema
from demote.errors import ConfigError
from demote.records import DemotedMessage, Demotion, fingerprint, make_key
from langchain_demote.messages import from_recalled, to_core
from tests.demote.archive.legacy import make_old_archive, scope
from tests.demote.archive.pg import drop_archive

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(200)).decode()


def agent_history() -> list[BaseMessage]:
    return [
        HumanMessage("Write the config file for the staging cluster.", id="u1"),
        AIMessage(
            [
                {"type": "reasoning", "reasoning": "The user wants a YAML file."},
                {"type": "text", "text": "Writing it now."},
            ],
            tool_calls=[
                {
                    "name": "write_file",
                    "args": {
                        "path": "deploy/staging.yaml",
                        "content": "replicas: 3\nzone: quokka-7",
                    },
                    "id": "call_w1",
                }
            ],
            id="a1",
            response_metadata={"model_provider": "openai", "finish_reason": "tool_calls"},
            usage_metadata={"input_tokens": 10, "output_tokens": 20, "total_tokens": 30},
        ),
        ToolMessage(
            "wrote 27 bytes",
            tool_call_id="call_w1",
            name="write_file",
            artifact={"bytes": 27},
            status="success",
        ),
        HumanMessage(
            [
                {"type": "text", "text": "Here is the diagram"},
                {"type": "image", "base64": PNG, "mime_type": "image/png"},
            ]
        ),
        ToolMessage("boom", tool_call_id="call_x", name="deploy", status="error"),
        AIMessage("Done: the config is written."),
        HumanMessage("thanks"),
        AIMessage("You are welcome."),
    ]


def demote_all(archive: Any, history: list[BaseMessage], cid: str = "chat") -> Demoter:
    demoter = Demoter(SlidingWindow.last_messages(1), archive)
    demoter.load(cid, history, lambda m: to_core(m, demoter.describe))
    return demoter


@pytest.fixture(params=["sqlite", "postgres"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    opened: list[Any] = []
    if request.param == "sqlite":

        def open_sqlite(**options: Any) -> Any:
            opened.append(SQLiteArchive(tmp_path / "archive.db", **options))
            return opened[-1]

        yield open_sqlite
    else:
        url = request.getfixturevalue("postgres_url")
        table = f"w_{uuid.uuid4().hex[:12]}"

        def open_pg(**options: Any) -> Any:
            opened.append(PostgresArchive(url, table=table, **options))
            return opened[-1]

        yield open_pg
        for archive in opened:
            archive.close()
        drop_archive(url, table)
        return
    for archive in opened:
        archive.close()


def test_demoted_messages_come_back_equal_to_the_originals(opener: Callable[..., Any]) -> None:
    archive = opener(media="bytes")
    history = agent_history()
    demote_all(archive, history)
    stored = archive.messages("chat")
    # The window keeps the last turn ("thanks" and its reply), or only the reply with
    # "thanks" in front as the turn's opener (then delivered too); the rest is archived.
    assert [r.index for r in stored] == list(range(len(stored)))
    assert len(history) - 2 <= len(stored) <= len(history) - 1
    back = [from_recalled(r) for r in stored]
    assert back == history[: len(stored)]
    assert all(r.at is not None and r.at > 1.7e9 for r in stored)


def test_a_search_for_an_argument_value_finds_the_call(opener: Callable[..., Any]) -> None:
    archive = opener()
    history = agent_history()
    demote_all(archive, history)
    hits = archive.search("chat", "quokka", k=3)
    assert hits and hits[0].index == 1
    assert from_recalled(hits[0]) == history[1]
    assert hits[0].at is not None
    assert "write_file" in hits[0].text  # the call is part of the indexed text
    assert archive.search("chat", "write_file", k=5)[0].index == 1


def test_media_are_kept_by_reference_unless_bytes_are_asked_for(
    opener: Callable[..., Any],
) -> None:
    archive = opener()
    history = agent_history()
    demote_all(archive, history)
    [image] = [r for r in archive.messages("chat") if r.index == 3]
    assert image.data is not None
    block = image.data["blocks"][1]
    assert block["base64"] is None and block["mime_type"] == "image/png"
    assert block["omitted"]["bytes"] == 208
    assert PNG not in str(image.data)
    assert from_recalled(image).content[0] == {"type": "text", "text": "Here is the diagram"}


def test_a_message_without_data_is_stored_text_only(opener: Callable[..., Any]) -> None:
    archive = opener()
    m = DemotedMessage("user", "plain words", 0, make_key("c", 0, fingerprint("user", "plain")))
    archive.deliver(Demotion("c", (m,)))
    [row] = archive.messages("c")
    assert row.data is None and row.text == "plain words"
    assert from_recalled(row) == HumanMessage("plain words")


def test_the_media_option_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="media"):
        SQLiteArchive(tmp_path / "a.db", media="inline")  # type: ignore[arg-type]


# -- migrations ---------------------------------------------------------------------------

# The messages table of schema 4 (demote before whole messages); the other tables, index
# and triggers of schema 4 are the current ones.
_V4_MESSAGES = """CREATE TABLE messages (
    id INTEGER PRIMARY KEY, conversation_id TEXT NOT NULL, idx INTEGER NOT NULL,
    role TEXT NOT NULL, text TEXT NOT NULL, context TEXT NOT NULL DEFAULT '',
    key TEXT NOT NULL, scope TEXT NOT NULL, speaker TEXT NOT NULL DEFAULT '',
    adjacent TEXT NOT NULL DEFAULT '', UNIQUE (conversation_id, key)
)"""


def _v4_file(path: Path, texts: list[str]) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(_V4_MESSAGES)
    for statement in _schema._SCHEMA[1:]:
        db.execute(statement)
    _fts.create_scratch(db)
    db.execute("BEGIN")
    for i, text in enumerate(texts):
        role = "user" if i % 2 == 0 else "assistant"
        key = make_key("chat", i, fingerprint(role, text))
        db.execute(
            "INSERT INTO messages (conversation_id, idx, role, text, key, scope) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            ("chat", i, role, text, key, scope("chat")),
        )
        _lexical.add_terms(db, "chat", [(text, "")])
    db.execute("COMMIT")
    db.execute("PRAGMA user_version = 4")
    db.close()


def test_a_schema_4_file_migrates_and_old_rows_stay_readable(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _v4_file(path, ["we planned the harbour trip", "the ferry leaves at nine"])
    with SQLiteArchive(path) as archive:
        old = archive.messages("chat")
        assert [(r.text, r.data, r.at) for r in old] == [
            ("we planned the harbour trip", None, None),
            ("the ferry leaves at nine", None, None),
        ]
        assert [from_recalled(r) for r in old] == [
            HumanMessage("we planned the harbour trip"),
            AIMessage("the ferry leaves at nine"),
        ]
        assert archive.search("chat", "ferry")[0].data is None
        history = agent_history()
        demote_all(archive, history, cid="new")
        back = [from_recalled(r) for r in archive.messages("new")]
        assert back[:3] == history[:3]
        assert archive.search("new", "quokka")[0].index == 1
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone() == (5,)
    columns = {row[1] for row in db.execute("PRAGMA table_info(messages)")}
    assert {"data", "archived_at"} <= columns
    db.close()


def test_a_version_2_file_migrates_to_whole_messages(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    m = DemotedMessage("user", "the old harbour", 0, make_key("c", 0, fingerprint("user", "x")))
    make_old_archive(path, [("c", m)], version=2)
    with SQLiteArchive(path) as archive:
        [row] = archive.messages("c")
        assert (row.text, row.data) == ("the old harbour", None)
        assert archive.search("c", "harbour")[0].key == m.key


def test_a_read_only_open_refuses_a_schema_4_file(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _v4_file(path, ["one"])
    with pytest.raises(Exception, match="open it writable once"):
        SQLiteArchive(path, read_only=True)


def test_a_version_1_postgres_table_migrates(postgres_url: str) -> None:
    table = f"m_{uuid.uuid4().hex[:12]}"
    try:
        with PostgresArchive(postgres_url, table=table) as archive:
            old = DemotedMessage("user", "the old lighthouse", 0, "k-old")
            archive.deliver(Demotion("chat", (old,)))
        # Back to version 1's layout: no data, no archived_at.
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {table} DROP COLUMN data, DROP COLUMN archived_at")
            conn.execute(f"UPDATE {table}_meta SET version = 1")
        with PostgresArchive(postgres_url, table=table) as archive:
            [row] = archive.messages("chat")
            assert (row.text, row.data, row.at) == ("the old lighthouse", None, None)
            history = agent_history()
            demote_all(archive, history, cid="new")
            assert from_recalled(archive.search("new", "quokka")[0]) == history[1]
        with psycopg.connect(postgres_url) as conn:
            assert conn.execute(f"SELECT version FROM {table}_meta").fetchone() == (2,)
    finally:
        drop_archive(postgres_url, table)
