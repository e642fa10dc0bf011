"""``demote erase``: one conversation out of a state store, an archive and an outbox.

The stores are filled by a real Demoter (SQLite state, a Recorder with an SQLite outbox in
front of an SQLite archive, one conversation's batches failing into the dead letters).
Most runs go through :func:`demote.cli.app.main` in this process; one through the
installed entry point.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from demote import (
    DemotedMessage,
    Demoter,
    Demotion,
    FencedOut,
    Recorder,
    SlidingWindow,
    SQLiteStateStore,
)
from demote.archive.sqlite import SQLiteArchive
from demote.backends import wal as _wal
from demote.capture import RetryPolicy, SQLiteOutbox
from demote.cli.app import main
from demote.cli.erase import EXIT_NOT_FOUND, file_kind
from tests.demote.capture.test_capture_erase import leaks
from tests.demote.cli.test_cli import one_line_error, run
from tests.strategies import Msg, describer

SECRET, KEPT = "quokka7741", "heron3390"


class Picky(SQLiteArchive):
    """An archive that refuses the batches of one conversation (they are dead-lettered)."""

    def deliver(self, batch: Demotion) -> None:
        if batch.conversation_id == "dead":
            raise RuntimeError("refused")
        super().deliver(batch)


def chat(cid: str, word: str, n: int = 12) -> list[Msg]:
    return [Msg(("user", "assistant")[i % 2], f"{cid} {word} turn {i}") for i in range(n)]


@pytest.fixture
def stores(tmp_path: Path) -> Path:
    """state.db, archive.db and outbox.db holding conversations c, o and dead."""
    retry = RetryPolicy(max_attempts=1, base_delay=0, max_delay=0)
    with (
        SQLiteStateStore(tmp_path / "state.db") as state,
        Picky(tmp_path / "archive.db") as archive,
        SQLiteOutbox(tmp_path / "outbox.db", retry=retry) as outbox,
    ):
        with Recorder(archive, outbox=outbox) as recorder:
            demoter = Demoter(SlidingWindow.last_messages(2), recorder, state=state)
            for cid, word in (("c", SECRET), ("o", KEPT), ("dead", SECRET)):
                messages = chat(cid, word)
                for end in range(2, len(messages) + 1, 2):
                    demoter.load(cid, messages[:end], describer(demoter))
            demoter.close()
        assert archive.count("c") == 10 and len(outbox.dead_letters()) == 5
    return tmp_path


def files(folder: Path) -> list[Path]:
    return [folder / f"{name}.db" for name in ("state", "archive", "outbox")]


def snapshot(folder: Path) -> dict[str, bytes]:
    """The database files' bytes (a read-only look at a WAL file may leave its -shm)."""
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.db"))}


def test_erase_reports_each_tier_and_leaves_no_bytes(
    stores: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, archive, outbox = map(str, files(stores))
    args = ["erase", "--state", state, "--archive", archive, "--outbox", outbox]
    assert main([*args, "c"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "erase 'c'" and out[-1] == "complete"
    assert out[1].split() == ["tier", "kind", "status", "removed"]
    rows = [line.split("  ") for line in out[2:-1]]
    rows = [[cell.strip() for cell in row if cell.strip()] for row in rows]
    assert rows == [["SQLiteArchive", "long tail", "erased", "10"],
                    ["SQLiteOutbox", "long tail", "erased", "0"],
                    ["SQLiteStateStore", "state", "erased", "1"]]  # fmt: skip
    assert main([*args, "dead"]) == 0
    assert ["SQLiteOutbox", "long", "tail", "erased", "5"] in [
        r.split() for r in capsys.readouterr().out.split("\n")
    ]
    for f in files(stores):
        assert leaks(f, SECRET) == [], f
    with SQLiteArchive(archive) as ar, SQLiteStateStore(state) as st:
        assert ar.count("c") == 0 and ar.count("o") == 10
        assert KEPT in ar.search("o", KEPT, k=1)[0].text
        assert st.get("c") is None and st.get("o") is not None
    assert main([*args, "c"]) == EXIT_NOT_FOUND == 3  # again: nothing left to erase
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "not found: none of these stores held 'c'; nothing was erased"
    assert [line.split()[-1] for line in out[2:-1]] == ["0", "0", "0"]


def test_an_id_nothing_knew_exits_with_its_own_status_and_changes_nothing(
    stores: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, archive, outbox = map(str, files(stores))
    args = ["erase", "--state", state, "--archive", archive, "--outbox", outbox]
    with SQLiteArchive(archive) as ar:
        counts = {cid: ar.count(cid) for cid in ("c", "o")}
    assert main([*args, "never-seen-id"]) == 3
    out = capsys.readouterr().out
    assert "deleted" not in out and "not found: none of these stores held" in out
    assert "SQLiteStateStore  state      erased        0" in out
    with SQLiteArchive(archive) as ar, SQLiteStateStore(state) as st:
        assert {cid: ar.count(cid) for cid in ("c", "o")} == counts
        assert st.get("c") is not None and st.get("o") is not None


def test_files_of_the_wrong_kind_are_refused_and_left_as_they_were(
    stores: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (stores / "junk.db").write_text("not a database")
    sqlite3.connect(stores / "other.db").execute("CREATE TABLE t (x)").connection.close()
    before = snapshot(stores)
    cases = {
        (
            "archive",
            "archive",
            None,
        ): "--state archive.db: not a demote state store (it is archive)",
        ("state", "state", None): "--archive state.db: not a demote archive (it is state store)",
        ("state", "archive", "archive"): "--outbox archive.db: not a demote outbox (it is archive)",
        ("state", "junk", None): "--archive junk.db: not a demote archive (it is not an SQLite",
        ("state", "other", None): "(it is an SQLite file of something else)",
        ("state", "archive", "nowhere"): "nowhere.db: no such file",
        ("state", "archive", "state"): "not a demote outbox (it is state store)",
    }
    for (state, archive, outbox), message in cases.items():
        args = ["erase", "--state", f"{state}.db", "--archive", f"{archive}.db"]
        args += ["--outbox", f"{outbox}.db"] if outbox else []
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(stores)
            assert main([*args, "c"]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("demote: error: ") and message in err, (args, err)
    assert snapshot(stores) == before, "a refused erase changed a file"
    assert file_kind(stores / "outbox.db") == "outbox"


def test_two_options_naming_one_file_are_refused(
    stores: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = str(stores / "archive.db")
    state = str(stores / "state.db")
    assert main(["erase", "--state", state, "--archive", archive, "--outbox", archive, "c"]) == 2
    assert "not a demote outbox" in capsys.readouterr().err


def test_a_tier_that_fails_makes_the_exit_status_1(
    stores: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_wal, "PATIENCE", 0.05)
    reader = sqlite3.connect(stores / "archive.db", isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM messages").fetchone()  # the WAL cannot be truncated
    state, archive = str(stores / "state.db"), str(stores / "archive.db")
    assert main(["erase", "--state", state, "--archive", archive, "c"]) == 1
    out = capsys.readouterr().out
    assert "SQLiteArchive     long tail  failed" in out and "WAL could not be truncated" in out
    assert out.splitlines()[-1].startswith("incomplete")
    reader.execute("COMMIT")
    reader.close()
    # Again: the rows went the first time (only the WAL stayed), so nothing is found now.
    assert main(["erase", "--state", state, "--archive", archive, "c"]) == EXIT_NOT_FOUND
    assert leaks(stores / "archive.db", SECRET) == []


def test_a_delivery_in_flight_that_outlives_wait_is_taken_over(
    stores: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with SQLiteStateStore(stores / "state.db") as st:
        lease = st.acquire_lease("c", "a-worker-elsewhere", 30)
        assert lease is not None
    state, archive = str(stores / "state.db"), str(stores / "archive.db")
    status = main(["erase", "--state", state, "--archive", archive, "--wait", "0.2", "c"])
    out = capsys.readouterr().out
    assert status == 1 and "did not end within --wait" in out
    with SQLiteArchive(archive) as ar:
        assert ar.count("c") == 0
        late = Demotion("c", (DemotedMessage("user", SECRET, 0, "late"),), lease.token)
        with pytest.raises(FencedOut, match="older than its erase"):
            ar.deliver(late)  # the worker's late batch, under its revoked lease


def test_the_installed_command(stores: Path) -> None:
    proc = run("erase", "--state", "state.db", "--archive", "archive.db", "c", cwd=stores,
               timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "complete"
    bad = run("erase", "--state", "archive.db", "--archive", "archive.db", "c", cwd=stores,
              timeout=60)  # fmt: skip
    assert "not a demote state store" in one_line_error(bad)


@pytest.mark.parametrize("state_kind", ["postgres", "redis"])
def test_erase_takes_the_urls_of_a_fleets_stores(
    state_kind: str, postgres_url: str, request: pytest.FixtureRequest
) -> None:
    import uuid

    from demote import PostgresArchive, PostgresStateStore, RedisStateStore

    archive_table = f"era_{uuid.uuid4().hex[:10]}"
    state_table = f"ers_{uuid.uuid4().hex[:10]}"
    if state_kind == "postgres":
        state_url = postgres_url
        state: object = PostgresStateStore(postgres_url, table=state_table)
        options = ["--state-table", state_table]
    else:
        state_url = request.getfixturevalue("redis_url")
        state = RedisStateStore(state_url)
        options = []
    with PostgresArchive(postgres_url, table=archive_table) as archive:
        demoter = Demoter(SlidingWindow.last_messages(2), archive, state=state)  # type: ignore[arg-type]
        for cid, word in (("c", SECRET), ("o", KEPT)):
            demoter.load(cid, chat(cid, word), describer(demoter))
        assert archive.count("c") == 10 and archive.count("o") == 10
        argv = ["erase", "--state", state_url, *options, "--archive", postgres_url]
        assert main([*argv, "--archive-table", archive_table, "c"]) == 0
        assert archive.count("c") == 0 and archive.search("c", SECRET) == []
        assert archive.count("o") == 10
        assert state.get("c") is None and state.get("o") is not None  # type: ignore[attr-defined]
        demoter.close()
    state.close()  # type: ignore[attr-defined]


def test_erase_refuses_a_table_option_without_a_url(stores: Path) -> None:
    code = main(
        [
            "erase",
            "--state",
            str(stores / "state.db"),
            "--state-table",
            "t",
            "--archive",
            str(stores / "archive.db"),
            "c",
        ]
    )
    assert code == 2
