"""``demote inspect`` reads every state store demote writes: SQLite, Redis, PostgreSQL.

The same two conversations (one with messages pending behind a failing hook, one caught
up) are written by a real Demoter into an SQLite file, under a Redis key prefix and into a
PostgreSQL table; ``demote inspect`` shows them the same way on all three, after a first
block that says what each store reads (file, key prefix, table). Every open is read-only:
nothing is created or written, a URL is never taken for a file path, and an option that
goes with another backend is a one-line error.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from demote import Backoff, Demoter, Demotion, SlidingWindow, SQLiteArchive, SQLiteStateStore
from demote.cli import main
from demote.state import PostgresStateStore, RedisStateStore
from tests.demote.state.conftest import drop_pg_tables
from tests.strategies import Msg, describer

CHAT = [Msg("user" if i % 2 == 0 else "assistant", f"message {i}") for i in range(20)]


class Down:
    def deliver(self, batch: Demotion) -> None:
        raise RuntimeError("archive offline")


def write(store: Any, archive: Path) -> None:
    """Two conversations: 'stuck' (6 pending), 'fine' (caught up, 6 archived)."""
    stuck = Demoter(SlidingWindow.last_messages(4), Down(), state=store, retry=Backoff(0, 0))
    stuck.load("stuck", CHAT[:10], describer(stuck))
    with SQLiteArchive(archive) as hook:
        fine = Demoter(SlidingWindow.last_messages(4), hook, state=store, hook_wait=None)
        fine.load("fine", CHAT[:10], describer(fine))
        fine.close()
    stuck.close()


def body(text: str) -> list[str]:
    """The output after its first block (what each store reads)."""
    return text.split("\n\n", 1)[1].splitlines()


@pytest.fixture
def sqlite_state(tmp_path: Path) -> Iterator[list[str]]:
    path = tmp_path / "state.db"
    with SQLiteStateStore(path) as store:
        write(store, tmp_path / "archive.db")
    yield ["--state", str(path)]


@pytest.fixture
def redis_state(redis_url: str, tmp_path: Path) -> Iterator[list[str]]:
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    with RedisStateStore(redis_url, prefix=prefix) as store:
        write(store, tmp_path / "archive.db")
    yield ["--state", redis_url, "--state-prefix", prefix]


@pytest.fixture
def postgres_state(postgres_url: str, tmp_path: Path) -> Iterator[list[str]]:
    table = f"t_{uuid.uuid4().hex[:12]}"
    with PostgresStateStore(postgres_url, table=table) as store:
        write(store, tmp_path / "archive.db")
    yield ["--state", postgres_url, "--state-table", table]
    drop_pg_tables(postgres_url, table)


def inspect(args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["inspect", *args, "--archive", str(tmp_path / "archive.db")]) == 0
    return capsys.readouterr().out


def test_inspect_shows_the_same_conversations_the_same_way_on_every_store(
    sqlite_state: list[str],
    redis_state: list[str],
    postgres_state: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    outputs = {
        kind: inspect(args, tmp_path, capsys)
        for kind, args in (
            ("sqlite", sqlite_state),
            ("redis", redis_state),
            ("postgres", postgres_state),
        )
    }
    first = body(outputs["sqlite"])
    assert body(outputs["redis"]) == first
    assert body(outputs["postgres"]) == first
    rows = {line.split()[0]: line.split() for line in first[1:3]}
    assert rows["stuck"][1:6] == ["6", "0", "6", "0", "0"]  # start, watermark, pending, ...
    assert rows["fine"][1:6] == ["6", "6", "0", "0", "6"]
    assert "pending: 6 messages in 1 of 2 conversations" in first
    # What each one read, said first.
    assert outputs["sqlite"].startswith(f"state:   {sqlite_state[1]} (SQLite file)\n")
    assert f"(keys {redis_state[3]}*)" in outputs["redis"].splitlines()[0]
    assert f"(table {postgres_state[3]})" in outputs["postgres"].splitlines()[0]
    assert "archive: " in outputs["postgres"].splitlines()[1]


def test_a_redis_url_is_read_not_taken_for_a_file(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The failure: "state store redis:/127.0.0.1:6379/0: no such file".
    client = redis.Redis.from_url(redis_url)
    before = client.dbsize()
    assert main(["inspect", "--state", redis_url]) == 0
    captured = capsys.readouterr()
    assert "no such file" not in captured.err
    assert captured.out.startswith(f"state: {redis_url} (keys demote:*)\n")
    assert client.dbsize() == before  # nothing written
    client.close()


def test_a_postgres_table_that_is_not_there_is_not_made(
    postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = f"t_{uuid.uuid4().hex[:12]}"
    code = main(["inspect", "--state", postgres_url, "--state-table", missing])
    assert code == 2 and f"no state store in table '{missing}'" in capsys.readouterr().err
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute(f"SELECT to_regclass('{missing}')").fetchone() == (None,)


def test_an_unreachable_server_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    for url in ("redis://127.0.0.1:1/0", "postgresql://postgres@127.0.0.1:1/x"):
        assert main(["inspect", "--state", url]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert (
            len(err) == 1 and err[0].startswith("demote: error: ") and "no such file" not in err[0]
        )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["inspect", "--state", "s.db", "--state-table", "t"], "--state-table goes with"),
        (["inspect", "--state", "s.db", "--state-prefix", "p:"], "--state-prefix goes with"),
        (["inspect", "--archive", "redis://127.0.0.1:1/0"], "Redis holds only a state store"),
        (["search", "--archive", "redis://127.0.0.1:1/0", "c", "q"], "Redis holds only"),
        (["inspect", "--outbox", "postgresql://h/db"], "an outbox is an SQLite file"),
    ],
)
def test_options_for_another_backend_are_one_line_errors(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "s.db").touch()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        assert main(args) == 2
    assert message in capsys.readouterr().err
