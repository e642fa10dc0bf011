"""PostgresArchive beyond the contract: a fleet's concerns (migration races, read-only use,
pools, dead backends, black holes), PostgreSQL's own limits, the vector storage choice,
and the statistics kept in step under concurrent deliveries."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import psycopg
import psycopg_pool
import pytest

from demote import Demoter, PostgresStateStore, SlidingWindow
from demote.archive.postgres import PostgresArchive
from demote.archive.postgres import _schema as _pg_schema
from demote.archive.postgres._schema import Layout, storage_for
from demote.archive.postgres._search import _unpack
from demote.archive.postgres._statements import Statements
from demote.errors import ConfigError, ConversationIdError, StoreError
from demote.records import Demotion
from tests.demote.archive.archive_contract import FILLER, TEXTS, Concepts, batch, message
from tests.demote.archive.pg import drop_archive
from tests.demote.state.conftest import drop_pg_tables
from tests.demote.state.test_store_faults import _terminate
from tests.strategies import Msg, describer
from tests.support.tcp_proxy import TcpProxy


@pytest.fixture
def table(postgres_url: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    drop_archive(postgres_url, name)


def in_threads(n: int, work: Callable[[int], None]) -> list[BaseException]:
    """Run ``work(0)`` ... ``work(n - 1)`` in threads started together; their errors."""
    barrier, errors = threading.Barrier(n), []

    def run(i: int) -> None:
        try:
            barrier.wait()
            work(i)
        except BaseException as exc:  # pragma: no cover - reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return errors


def scalar(url: str, sql: str) -> object:
    with psycopg.connect(url) as conn:
        row = conn.execute(sql).fetchone()
        return None if row is None else row[0]


# -- schema and migrations ---------------------------------------------------------------


def test_ten_workers_opening_a_new_table_at_once_make_it_once(
    postgres_url: str, table: str
) -> None:
    opened: list[PostgresArchive] = []

    def open_one(n: int) -> None:
        archive = PostgresArchive(postgres_url, table=table, application_name=f"w{n}")
        opened.append(archive)
        archive.deliver(batch(f"c{n}", f"worker {n} was here", *FILLER))

    errors = in_threads(10, open_one)
    try:
        assert errors == []
        assert scalar(postgres_url, f"SELECT version FROM {table}_meta") == 2
        assert opened[0].count() == 50
        assert opened[0].search("c7", "worker")[0].text == "worker 7 was here"
    finally:
        for archive in opened:
            archive.close()


def test_a_newer_schema_is_refused(postgres_url: str, table: str) -> None:
    PostgresArchive(postgres_url, table=table).close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"UPDATE {table}_meta SET version = 99")
    with pytest.raises(StoreError, match="schema 99, newer"):
        PostgresArchive(postgres_url, table=table)


def test_read_only_creates_nothing_and_writes_nothing(postgres_url: str, table: str) -> None:
    with pytest.raises(StoreError, match="no archive in table"):
        PostgresArchive(postgres_url, table=table, read_only=True)
    assert scalar(postgres_url, f"SELECT to_regclass('{table}')") is None
    with PostgresArchive(postgres_url, table=table) as writer:
        writer.deliver(batch("c", "the locker code is 4512", *FILLER))
    with PostgresArchive(postgres_url, table=table, read_only=True) as reader:
        assert reader.search("c", "locker code")[0].text == "the locker code is 4512"
        assert (reader.count(), reader.conversations()) == (5, ["c"])
        for write in (
            lambda: reader.deliver(batch("c", "more")),
            lambda: reader.erase("c"),
            lambda: reader.embed_pending(),
        ):
            with pytest.raises(StoreError, match="read-only"):
                write()
        # The connections themselves refuse writes, whatever a caller tries.
        with (
            pytest.raises(psycopg.errors.ReadOnlySqlTransaction),
            reader._pools.pool.connection() as conn,
        ):
            conn.execute(f"DELETE FROM {table}")
    with PostgresArchive(postgres_url, table=table) as writer:
        assert writer.count("c") == 5


@pytest.mark.parametrize(
    ("option", "stored", "installed", "expected"),
    [
        ("auto", None, None, None),
        ("auto", None, "public", "public"),
        ("auto", "array", "public", None),  # a table keeps the storage it was made with
        ("auto", "pgvector", "ext", "ext"),
        ("array", None, "public", None),
        ("pgvector", None, "public", "public"),
    ],
)
def test_the_vector_storage_follows_the_table_then_the_database(
    option: str, stored: str | None, installed: str | None, expected: str | None
) -> None:
    assert storage_for(option, stored, installed) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("option", "stored", "installed", "match"),
    [
        ("pgvector", None, None, "CREATE EXTENSION vector"),
        ("auto", "pgvector", None, "not installed"),
        ("pgvector", "array", "public", "stores its vectors as array"),
        ("cosine", None, None, "vectors must be"),
    ],
)
def test_a_vector_storage_that_cannot_be_had_is_a_config_error(
    option: str, stored: str | None, installed: str | None, match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        storage_for(option, stored, installed)  # type: ignore[arg-type]


def test_pgvector_is_detected_from_the_catalog(postgres_url: str, table: str) -> None:
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute(
            "SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'vector'"
        ).fetchone()
        assert _pg_schema.detect(conn) == (None if row is None else row[0])
    if row is None:  # this machine: no pgvector, so real[] and a clear refusal
        with PostgresArchive(postgres_url, table=table, embeddings=Concepts()) as archive:
            archive.deliver(batch("c", *TEXTS))
            assert archive.search("c", "automobile", k=1)[0].text == TEXTS[0]
        column = scalar(
            postgres_url,
            f"SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
            f"WHERE attrelid = '{table}_vectors'::regclass AND attname = 'embedding'",
        )
        assert column == "real[]"
        with pytest.raises(ConfigError, match="CREATE EXTENSION vector"):
            PostgresArchive(postgres_url, table=f"{table}_v", vectors="pgvector")


def test_with_pgvector_the_column_and_the_scan_use_its_type() -> None:
    # Without the extension here, the statements pgvector would run are checked as text.
    layout = Layout("arch", pgvector="ext schema")
    ddl = " ".join(layout.ddl())
    assert 'embedding "ext schema".vector NOT NULL' in ddl
    assert "'pgvector') ON CONFLICT" in ddl
    st = Statements(layout)
    assert '::"ext schema".vector' in st.insert_vectors
    assert 'v.embedding OPERATOR("ext schema".<=>) %(query)s::"ext schema".vector' in st.nearest
    assert "WHERE v.conversation = %(conv)s ORDER BY" in st.nearest
    plain = Statements(Layout("arch"))
    assert "REAL[]" in " ".join(plain.layout.ddl()) and not hasattr(plain, "nearest")


def test_malformed_vector_arrays_are_a_store_error() -> None:
    header = (2).to_bytes(4, "big") + (1).to_bytes(4, "big") + (700).to_bytes(4, "big")
    with pytest.raises(StoreError, match="nulls"):
        _unpack(header + bytes(16), 1)


# -- the fleet: pools, dead backends, black holes ---------------------------------------


def test_an_existing_pool_is_used_and_left_open(postgres_url: str, table: str) -> None:
    pool = psycopg_pool.ConnectionPool(postgres_url, min_size=1, max_size=2, open=True)
    try:  # not autocommit: every operation commits its own transaction
        with PostgresArchive(pool=pool, table=table) as archive:
            archive.deliver(batch("c", "the pool is mine", *FILLER))

            async def main() -> str:
                found = await archive.asearch("c", "pool")
                await archive.aclose()
                return found[0].text

            assert asyncio.run(main()) == "the pool is mine"
        with pool.connection() as conn:
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (5,)
    finally:
        pool.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_recovers_after_its_backends_are_terminated(
    postgres_url: str, table: str, mode: str
) -> None:
    name = f"archive-{uuid.uuid4().hex[:8]}"
    archive = PostgresArchive(postgres_url, table=table, application_name=name, min_size=2)
    loop = asyncio.new_event_loop()

    def call(method: str, *args: object) -> object:
        if mode == "sync":
            return getattr(archive, method)(*args)
        return loop.run_until_complete(getattr(archive, "a" + method)(*args))

    try:
        call("deliver", batch("c", "before the restart", *FILLER))
        for round_ in range(3):
            assert _terminate(postgres_url, name), "the archive had live backends to kill"
            call("deliver", batch("c", f"after restart {round_}", start=10 + round_))
            assert call("count", "c") == 6 + round_
        found = {h.text for h in call("search", "c", "restart", 10)}  # type: ignore[attr-defined]
        assert found >= {"before the restart", *(f"after restart {n}" for n in range(3))}
    finally:
        loop.run_until_complete(archive.aclose())
        loop.close()
        archive.close()


def test_a_black_holed_connection_fails_within_its_timeout(postgres_url: str, table: str) -> None:
    parts = urlsplit(postgres_url)
    proxy = TcpProxy(parts.port or 5432).start()
    auth = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    via = f"{parts.scheme}://{auth}127.0.0.1:{proxy.port}{parts.path}"
    archive = PostgresArchive(via, table=table, timeout=1.0, connect_timeout=2)
    try:
        archive.deliver(batch("c", "hello over the proxy", *FILLER))
        proxy.blackhole()
        for call in (
            lambda: archive.search("c", "hello"),
            lambda: archive.deliver(batch("c", "lost", start=20)),
        ):
            started = time.monotonic()
            with pytest.raises(StoreError):
                call()
            assert time.monotonic() - started < 5, "bounded by the 1 s timeout (+ retries)"
        proxy.restore()
        proxy.cut()
        for _ in range(40):
            try:
                assert archive.count("c") == 5  # the lost batch stored nothing
                break
            except StoreError:
                time.sleep(0.25)
        else:  # pragma: no cover
            pytest.fail("the archive did not recover once the network did")
    finally:
        proxy.restore()
        archive.close()
        proxy.close()


def test_settings_are_checked(postgres_url: str) -> None:
    for bad in ("x; drop", "Upper", "x" * 42, ""):
        with pytest.raises(ConfigError, match="table"):
            PostgresArchive(postgres_url, table=bad)
    with pytest.raises(ConfigError, match="dsn"):
        PostgresArchive()
    with pytest.raises(ConfigError, match="candidates"):
        PostgresArchive(postgres_url, candidates=0)
    for bad_timeout in (0, float("nan")):
        with pytest.raises(ConfigError, match="timeout"):
            PostgresArchive(postgres_url, timeout=bad_timeout)
    # Out of reach: built, calls fail until it answers (see test_boot_while_down.py);
    # read-only (what the command line opens) it raises at once.
    down = PostgresArchive("postgresql://postgres@127.0.0.1:1/test", timeout=0.5)
    with pytest.raises(StoreError, match="postgres"):
        down.count()
    down.close()
    with pytest.raises(StoreError, match="cannot reach postgres"):
        PostgresArchive("postgresql://postgres@127.0.0.1:1/test", read_only=True)


def test_a_closed_archive_is_a_store_error(postgres_url: str, table: str) -> None:
    archive = PostgresArchive(postgres_url, table=table)
    archive.close()
    archive.close()
    for call in (lambda: archive.deliver(batch("c", "x")), lambda: archive.search("c", "x")):
        with pytest.raises(StoreError, match="closed"):
            call()


# -- PostgreSQL's limits ------------------------------------------------------------------


def test_nul_in_text_is_stored_as_a_replacement_character(postgres_url: str, table: str) -> None:
    with PostgresArchive(postgres_url, table=table) as archive:
        archive.deliver(Demotion("c", (message("c", 0, "nul\x00inside the cake"),)))
        [stored] = archive.messages("c")
        assert stored.text == "nul\ufffdinside the cake"
        assert archive.search("c", "cake")[0].index == 0
        with pytest.raises(ConversationIdError, match="NUL"):
            archive.deliver(batch("nul\x00id", "hello"))
        assert archive.count() == 1


def test_a_huge_message_is_stored_whole_and_indexed_in_part(postgres_url: str, table: str) -> None:
    words = [f"w{n}x" for n in range(60_000)]  # ~400,000 characters, all distinct
    huge = "zanzibar " + " ".join(words) + " quokka"
    with PostgresArchive(postgres_url, table=table, statement_timeout=30) as archive:
        archive.deliver(batch("c", huge, *FILLER))
        assert archive.messages("c")[0].text == huge
        assert archive.search("c", "zanzibar")[0].index == 0
        assert archive.search("c", "quokka") == []  # past the first 40,000 characters


def test_a_match_reads_one_conversation_through_an_index(postgres_url: str, table: str) -> None:
    with PostgresArchive(postgres_url, table=table) as archive:
        for c in range(20):
            archive.deliver(batch(f"c{c}", *(f"{w} {c} {n}" for n in range(25) for w in FILLER)))
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"ANALYZE {table}")
            plan = "\n".join(
                r[0]
                for r in conn.execute(
                    f"EXPLAIN SELECT id FROM {table} m WHERE m.scope = %s AND "
                    "m.conversation_id = %s AND m.tsv @@ %s::tsquery",
                    ("cabc", "c3", "'cabc':D & 'sister':A"),
                )
            )
        # The GIN index (scope lexeme AND terms) or the scope index: never the whole table.
        assert "Seq Scan" not in plan
        assert f"{table}_tsv" in plan or f"{table}_scope_idx" in plan


# -- statistics under concurrent deliveries -----------------------------------------------


def test_concurrent_deliveries_keep_the_statistics_exact(postgres_url: str, table: str) -> None:
    archive = PostgresArchive(postgres_url, table=table, max_size=8)

    def work(n: int) -> None:
        for i in range(15):  # interleaved indexes: neighbours arrive from other threads
            index = i * 4 + n % 4
            m = message(f"conv-{n % 2}", index, f"thread {n} message {i} about kites")
            archive.deliver(Demotion(f"conv-{n % 2}", (m,)))
            archive.search(f"conv-{n % 2}", "kites message", k=3)

    errors = in_threads(8, work)
    try:
        assert errors == []
        assert archive.count() == 120
        with psycopg.connect(postgres_url) as conn:
            # What deliver keeps in step, recounted from the rows themselves.
            kept = conn.execute(
                f"SELECT c.conversation_id, t.term, t.in_text, t.in_all FROM {table}_terms t "
                f"JOIN {table}_conversations c ON c.id = t.conversation "
                "WHERE t.in_text <> 0 OR t.in_all <> 0 ORDER BY 1, 2"
            ).fetchall()
            recount = conn.execute(
                "SELECT m.conversation_id, u.lexeme, "
                "count(*) FILTER (WHERE 'A' = ANY(u.weights)), "
                f"count(*) FILTER (WHERE u.weights && '{{A,B,C}}') FROM {table} m, unnest(m.tsv) u "
                "WHERE u.weights && '{A,B,C}' GROUP BY 1, 2 ORDER BY 1, 2"
            ).fetchall()
            assert kept == recount
            tokens = conn.execute(
                f"SELECT c.tokens, (SELECT sum(m.tokens) FROM {table} m WHERE m.scope = c.scope),"
                f" (SELECT sum((SELECT count(*) FROM unnest(m.tsv) u, unnest(u.positions))) "
                f"FROM {table} m WHERE m.scope = c.scope) FROM {table}_conversations c"
            ).fetchall()
            assert all(a == b == c for a, b, c in tokens)
    finally:
        archive.close()


def test_a_second_archive_objects_vectors_reach_the_first_ones_cache(
    postgres_url: str, table: str
) -> None:
    with (
        PostgresArchive(postgres_url, table=table, embeddings=Concepts()) as one,
        PostgresArchive(postgres_url, table=table, embeddings=Concepts()) as two,
    ):
        one.deliver(batch("c", *TEXTS))
        assert 10 not in {h.index for h in one.search("c", "dog", k=5)}  # cached now
        two.deliver(batch("c", "My puppy", start=10))
        assert one.search("c", "dog", k=1)[0].index == 10
        two.erase("c")
        two.deliver(batch("c", "A vehicle", start=3))
        assert [h.index for h in one.search("c", "automobile", k=5)] == [3]


# -- with the engine -------------------------------------------------------------------


async def test_a_demoter_on_postgres_state_and_archive_erases_both(
    postgres_url: str, table: str
) -> None:
    state_table = f"s_{uuid.uuid4().hex[:12]}"
    archive = PostgresArchive(postgres_url, table=table)
    state = PostgresStateStore(postgres_url, table=state_table)
    demoter = Demoter(SlidingWindow.last_messages(4), archive, state=state)
    try:
        history = [Msg("user" if i % 2 == 0 else "assistant", f"turn {i} kites") for i in range(12)]
        for end in range(2, 13, 2):
            await demoter.aload("c", history[:end], describer(demoter))
        assert await archive.acount("c") == 8
        assert [m.index for m in await archive.amessages("c")] == list(range(8))
        report = await demoter.aerase("c")
        [tier] = [t for t in report.tiers if t.tier == "PostgresArchive"]
        assert (tier.status, tier.removed) == ("erased", 8)
        assert await archive.acount("c") == 0
    finally:
        await archive.aclose()
        await state.aclose()
        demoter.close()
        drop_pg_tables(postgres_url, state_table)


async def test_the_async_twins_never_block_the_loop(postgres_url: str, table: str) -> None:
    pytest.importorskip("blockbuster")
    from tests.test_event_loop_blocking import detector

    archive = PostgresArchive(postgres_url, table=table, embeddings=Concepts())
    demoter = Demoter(SlidingWindow.last_messages(4), archive)
    history = [Msg("user" if i % 2 == 0 else "assistant", f"my car, turn {i}") for i in range(12)]
    try:
        with detector():
            for end in range(2, 13, 2):
                await demoter.aload("c", history[:end], describer(demoter))
            await archive.adeliver(batch("d", *TEXTS))
            assert (await archive.asearch("d", "automobile", k=1))[0].text == TEXTS[0]
            assert await archive.ahas_keys("c", [m.key for m in await archive.amessages("c")])
            assert await archive.acount() == 12
            assert await archive.aconversations() == ["c", "d"]
            assert await archive.aerase("d") == 4
            assert await archive.aembed_pending() == 0
    finally:
        await archive.aclose()
        demoter.close()
