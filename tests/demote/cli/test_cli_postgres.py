"""``demote inspect`` and ``demote search`` on a PostgreSQL archive, given as a URL.

The archive is written here by a PostgresArchive; the command line reads it through a
read-only archive: it creates nothing (not even for a table that does not exist), never
writes, and never prints a URL's password.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import psycopg
import pytest

from demote.archive.postgres import PostgresArchive
from demote.cli import main
from tests.demote.archive.archive_contract import FILLER, batch
from tests.demote.archive.pg import drop_archive
from tests.demote.cli.test_cli import one_line_error, run


@pytest.fixture
def table(postgres_url: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    with PostgresArchive(postgres_url, table=name) as archive:
        archive.deliver(batch("user-42", "My locker code is 4512.", *FILLER))
        archive.deliver(batch("user-7", "The locker code of user 7 is 9999.", *FILLER))
    yield name
    drop_archive(postgres_url, name)


def with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    user, host = parts.netloc.rsplit("@", 1) if "@" in parts.netloc else ("postgres", parts.netloc)
    return parts._replace(netloc=f"{user.split(':')[0]}:{password}@{host}").geturl()


def test_search_reads_one_conversation_from_postgres(
    postgres_url: str, table: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["search", "--archive", postgres_url, "--archive-table", table]
    assert main([*args, "user-42", "locker code", "-k", "3"]) == 0
    captured = capsys.readouterr()
    assert captured.err == f"demote search: read {postgres_url} (table {table})\n"
    out = captured.out.splitlines()
    assert out[0].startswith("1. ") and "4512" in out[0]
    assert not any("9999" in line for line in out)  # the other tenant never shows
    assert main([*args, "user-42", "marmalade"]) == 0
    assert capsys.readouterr().out == "no match in 5 archived messages of 'user-42'\n"


def test_inspect_counts_every_conversation(
    postgres_url: str, table: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", "--archive", postgres_url, "--archive-table", table]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"archive: {postgres_url} (table {table})\n")
    rows = {line.split()[0]: line.split() for line in out.split("\n\n")[1].splitlines()[1:]}
    assert rows["user-42"][5] == "5" and rows["user-7"][5] == "5"
    secret = with_password(postgres_url, "s3cret-pw")
    code = main(["inspect", "--archive", secret, "--archive-table", table, "nobody"])
    err = capsys.readouterr().err
    assert code == 2 and "unknown conversation 'nobody'" in err
    assert "s3cret-pw" not in err and ":***@" in err


def test_the_command_line_never_creates_or_writes(
    postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = f"t_{uuid.uuid4().hex[:12]}"
    code = main(["search", "--archive", postgres_url, "--archive-table", missing, "c", "q"])
    assert code == 2 and f"no archive in table '{missing}'" in capsys.readouterr().err
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute(f"SELECT to_regclass('{missing}')").fetchone() == (None,)
        assert conn.execute(f"SELECT to_regclass('{missing}_meta')").fetchone() == (None,)


def test_a_table_with_a_file_is_an_error(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["search", "--archive", "a.db", "--archive-table", "x", "c", "q"]) == 2
    assert "--archive-table goes with a PostgreSQL archive" in capsys.readouterr().err


def test_the_installed_command_takes_a_url(postgres_url: str, table: str, tmp_path: object) -> None:
    proc = run("search", "--archive", postgres_url, "--archive-table", table, "user-42",
               "locker", cwd=tmp_path, timeout=60)  # type: ignore[arg-type]  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "4512" in proc.stdout.splitlines()[0]
    bad = run("search", "--archive", "postgresql://postgres@127.0.0.1:1/x", "c", "q",
              cwd=tmp_path, timeout=60)  # type: ignore[arg-type]  # fmt: skip
    assert "cannot reach postgres" in one_line_error(bad)
