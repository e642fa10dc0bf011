"""StoreHook and StoreRecall on langgraph-checkpoint-postgres's ``PostgresStore``.

Each test gets a schema of its own in the test database. An agent whose ``store=`` is a
``PostgresStore`` (sync) or an ``AsyncPostgresStore`` (async) demotes into it and recalls
from it, and its erase empties the store of the conversation. Two processes growing the
same conversations (a shared length table, a ``PostgresStateStore`` with leases) put each
demoted message once; a worker killed (SIGKILL) right after a put is resumed by a new
process, and every demoted message is still one item. While the store is cut (a TCP proxy
in front of it) the agent keeps answering, without recall and reported; once it is back
everything demoted meanwhile reaches the store, once.

``python -m tests.langchain_demote.test_store_postgres CONFIG`` runs one worker process
(:func:`worker`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
from langchain.agents import create_agent
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.store.base import PutOp
from langgraph.store.postgres import AsyncPostgresStore, PostgresStore
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from demote import Backoff, Demoter, PostgresStateStore, SlidingWindow
from langchain_demote import DemotingMiddleware, StoreHook, StoreRecall, recall_tool
from langchain_demote.messages import message_text, to_core
from langchain_demote.middleware import RECALL_PREFIX
from langchain_demote.provider_rules import violations
from tests.langchain_demote.test_store_agent import FACT, QUESTION, Model, converse
from tests.langchain_demote.test_store_hook import expected_keys, thread
from tests.langchain_demote.test_store_recall import grow_and_search
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
CONNECTION = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}


def in_schema(url: str, schema: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"


@pytest.fixture
def pg(postgres_url: str) -> Iterator[str]:
    """A URL of the test database whose tables go to a schema of this test's own."""
    schema = f"lgstore_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    yield in_schema(postgres_url, schema)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def rows(url: str, cid: str | None = None) -> list[tuple[str, str]]:
    """The store table's (prefix, key) rows, read with SQL (of one conversation's label)."""
    with psycopg.connect(url, autocommit=True) as conn:
        if cid is None:
            found = conn.execute("SELECT prefix, key FROM store ORDER BY prefix, key").fetchall()
        else:
            found = conn.execute(
                "SELECT prefix, key FROM store WHERE prefix = %s ORDER BY key", (f"demote.{cid}",)
            ).fetchall()
    return [(str(p), str(k)) for p, k in found]


class CountingStore(PostgresStore):
    """A ``PostgresStore`` that appends the key of every put it runs to a file.

    With ``hold_at``, the ``hold_at``-th batch of puts writes ``marker`` once it has run
    and then waits (where a test kills the process).
    """

    def __init__(self, conn: Any, log: Path, hold_at: int | None = None, marker: str = ""):
        super().__init__(conn)
        self.log = log
        self.hold_at = hold_at
        self.marker = marker
        self.put_batches = 0

    def batch(self, ops: Iterable[Any]) -> list[Any]:
        ops = list(ops)
        results = super().batch(ops)
        keys = [op.key for op in ops if isinstance(op, PutOp) and op.value is not None]
        if keys:
            with self.log.open("a") as f:
                f.write("".join(k + "\n" for k in keys))
            self.put_batches += 1
            if self.put_batches == self.hold_at:
                Path(self.marker).write_text("held")
                time.sleep(60)
        return results


def put_counts(*logs: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    for log in logs:
        if log.exists():
            counts.update(line for line in log.read_text().splitlines() if line)
    return counts


# -- an agent on PostgresStore --------------------------------------------------------------


def recording_model() -> Model:
    return Model(messages=itertools.repeat("Noted."))


def _check_run(model: Any, demoter: Demoter, agent: Any, config: Any, url: str) -> None:
    last = model.seen[-1]
    recalled = [m for m in last if message_text(m).startswith(RECALL_PREFIX)]
    assert len(recalled) == 1 and f"- user: {FACT}" in message_text(recalled[0])
    for sent in model.seen:
        assert violations(sent) == [], violations(sent)[:3]
    messages = agent.get_state(config).values["messages"]
    delivered = demoter.state_of("trail.1").delivered
    keys = expected_keys(demoter, "trail.1", messages, delivered)
    assert rows(url) == sorted(("demote.trail%2E1", k) for k in keys)


def test_a_sync_agent_on_postgres_store_demotes_recalls_and_erases(pg: str) -> None:
    with psycopg.connect(pg, **CONNECTION) as conn:  # type: ignore[arg-type]
        store = PostgresStore(conn)
        store.setup()
        demoter = Demoter(SlidingWindow.last_turns(2), StoreHook(store), hook_wait=None)
        recall = StoreRecall()  # the agent's own store, from the run
        model = recording_model()
        middleware = DemotingMiddleware(demoter, recall=recall, recall_role="user")
        checkpointer = InMemorySaver()
        agent = create_agent(
            model,
            [recall_tool(recall)],
            checkpointer=checkpointer,
            store=store,
            middleware=[middleware],
        )
        config: Any = {"configurable": {"thread_id": "trail.1"}}
        converse(agent, config, "sync", small_talk=6)
        _check_run(model, demoter, agent, config, pg)
        held = len(rows(pg))

        report = middleware.erase("trail.1", checkpointer=checkpointer)
        assert report.complete and [(t.tier, t.removed) for t in report.tiers] == [
            ("StoreHook", held)
        ]
        assert rows(pg) == []
        assert StoreRecall(store).search("trail.1", "hike tent") == []


def test_an_async_agent_on_async_postgres_store_demotes_recalls_and_erases(pg: str) -> None:
    async def main() -> None:
        async with AsyncPostgresStore.from_conn_string(pg) as store:
            await store.setup()
            demoter = Demoter(SlidingWindow.last_turns(2), StoreHook(store), hook_wait=None)
            recall = StoreRecall(store)
            model = recording_model()
            middleware = DemotingMiddleware(demoter, recall=recall, recall_role="user")
            checkpointer = InMemorySaver()
            agent = create_agent(
                model, [recall_tool(recall)], checkpointer=checkpointer, middleware=[middleware]
            )
            config: Any = {"configurable": {"thread_id": "trail.1"}}
            turns = [FACT, *(f"Small talk {i} about nothing much." for i in range(6)), QUESTION]
            for turn in turns:
                await agent.ainvoke({"messages": [HumanMessage(turn)]}, config)
            last = model.seen[-1]
            assert any(f"- user: {FACT}" in message_text(m) for m in last)
            messages = (await agent.aget_state(config)).values["messages"]
            delivered = demoter.state_of("trail.1").delivered
            keys = expected_keys(demoter, "trail.1", messages, delivered)
            assert await asyncio.to_thread(rows, pg) == sorted(
                ("demote.trail%2E1", k) for k in keys
            )
            report = await middleware.aerase("trail.1", checkpointer=checkpointer)
            assert report.complete and report.tiers[0].removed == len(keys)
            assert await asyncio.to_thread(rows, pg) == []

    asyncio.run(main())


def test_a_search_finds_what_was_written_since_the_one_before(pg: str) -> None:
    with psycopg.connect(pg, **CONNECTION) as conn:  # type: ignore[arg-type]
        store = PostgresStore(conn)
        store.setup()
        grow_and_search(store)  # PostgresStore's $gt compares text: positions are padded


# -- two processes, and a restart -----------------------------------------------------------

CIDS = ["p.0", "p.1"]
TURNS = 40  # per conversation: 160 messages


def _start(config: dict[str, Any], path: Path) -> subprocess.Popen[bytes]:
    """Start a worker process; what it prints goes to ``path`` with ``.err``."""
    path.write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with path.with_suffix(".err").open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.langchain_demote.test_store_postgres", str(path)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def _ended(process: subprocess.Popen[bytes], path: Path, timeout: float = 240) -> None:
    process.wait(timeout=timeout)
    assert process.returncode == 0, path.with_suffix(".err").read_text()[-2000:]


def _lengths(url: str, start: int = 0) -> None:
    with psycopg.connect(url, **CONNECTION) as conn:  # type: ignore[arg-type]
        conn.execute("CREATE TABLE lengths (cid text PRIMARY KEY, n int NOT NULL)")
        for cid in CIDS:
            conn.execute("INSERT INTO lengths VALUES (%s, %s)", (cid, start))
        PostgresStore(conn).setup()


def _check_items(url: str, logs: list[Path]) -> Counter[str]:
    demoter = Demoter(SlidingWindow.last_messages(4))
    for cid in CIDS:
        state = PostgresStateStore(url, table="lgstate")
        try:
            delivered = state.get(cid)
        finally:
            state.close()
        assert delivered is not None
        full = thread(TURNS, tag=cid)
        keys = expected_keys(demoter, cid, full, delivered.delivered)
        assert delivered.delivered >= len(full) - 4
        assert rows(url, cid.replace(".", "%2E")) == sorted(
            (f"demote.{cid.replace('.', '%2E')}", k) for k in keys
        )
    return put_counts(*logs)


@pytest.mark.slow
def test_two_processes_growing_the_same_conversations_put_each_message_once(
    pg: str, tmp_path: Path
) -> None:
    _lengths(pg)
    logs = [tmp_path / f"puts-{n}.txt" for n in range(2)]
    paths = [tmp_path / f"w{n}.json" for n in range(2)]
    ready = [tmp_path / f"ready-{n}" for n in range(2)]
    go = tmp_path / "go"
    workers = [
        _start({"url": pg, "log": str(logs[n]), "ready": str(ready[n]), "go": str(go)}, paths[n])
        for n in range(2)
    ]
    # Both grow the conversations together: one that starts while the other has already
    # filled them would deliver nothing, and the test would race nothing.
    deadline = time.monotonic() + 120
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
        assert all(w.poll() is None for w in workers), "a worker ended before it was ready"
        time.sleep(0.05)
    assert all(r.exists() for r in ready), "the workers did not get ready within 120 s"
    go.touch()
    for w, path in zip(workers, paths, strict=True):
        _ended(w, path)
    counts = _check_items(pg, logs)
    assert set(counts.values()) == {1}, counts.most_common(3)
    assert all(put_counts(log) for log in logs), "both processes delivered"


@pytest.mark.slow
def test_a_worker_killed_after_a_put_is_resumed_and_each_message_is_one_item(
    pg: str, tmp_path: Path
) -> None:
    _lengths(pg)
    logs = [tmp_path / "puts-killed.txt", tmp_path / "puts-resumed.txt"]
    marker = tmp_path / "held"
    path = tmp_path / "killed.json"
    killed = _start({"url": pg, "log": str(logs[0]), "hold_at": 5, "marker": str(marker)}, path)
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline and killed.poll() is None:
        time.sleep(0.05)
    assert marker.exists(), path.with_suffix(".err").read_text()[-2000:]
    os.kill(killed.pid, signal.SIGKILL)  # its fifth batch is in the store, uncommitted
    killed.wait(timeout=30)
    path = tmp_path / "resumed.json"
    _ended(_start({"url": pg, "log": str(logs[1])}, path), path)
    counts = _check_items(pg, logs)
    # Only what the killed worker had put can have been put again (its last batch, whose
    # commit the kill prevented): once more at most, and still one item each.
    again = {key for key, n in counts.items() if n > 1}
    assert again <= set(put_counts(logs[0])) and max(counts.values()) <= 2


def worker(config: dict[str, Any]) -> None:
    """One process: grow ``CIDS`` by a turn each round (the shared ``lengths`` table) and
    load each through a Demoter on the shared state store, until both are full; settle."""
    url = config["url"]
    conn = psycopg.connect(url, **CONNECTION)  # type: ignore[arg-type]
    store = CountingStore(
        conn, Path(config["log"]), config.get("hold_at"), config.get("marker", "")
    )
    state = PostgresStateStore(url, table="lgstate")
    demoter = Demoter(
        SlidingWindow.last_messages(4),
        StoreHook(store),
        state=state,
        hook_wait=None,
        lease_ttl=2.0,
        retry=Backoff(0.05, 0.2),
        on_hook_error="log",
    )
    full = {cid: thread(TURNS, tag=cid) for cid in CIDS}
    counter = psycopg.connect(url, autocommit=True)

    def load(cid: str, n: int) -> Any:
        return demoter.load(cid, full[cid][:n], lambda m: to_core(m, demoter.describe))

    if "ready" in config:  # wait for the other worker (the test says go), bounded
        Path(config["ready"]).touch()
        go = Path(config["go"])
        until = time.monotonic() + 150
        while not go.exists():
            if time.monotonic() > until:
                raise SystemExit("no go within 150 s")
            time.sleep(0.01)
    deadline = time.monotonic() + 200
    growing = set(CIDS)
    while growing and time.monotonic() < deadline:
        for cid in sorted(growing):
            row = counter.execute(
                "UPDATE lengths SET n = LEAST(n + 4, %s) WHERE cid = %s RETURNING n",
                (len(full[cid]), cid),
            ).fetchone()
            assert row is not None
            load(cid, row[0])
            if row[0] == len(full[cid]):
                growing.discard(cid)
    for cid in CIDS:  # settle: a lease a killed worker held expires within lease_ttl
        while time.monotonic() < deadline:
            if load(cid, len(full[cid])).pending == 0:
                break
            time.sleep(0.05)
        else:
            raise SystemExit(f"{cid} did not settle")
    demoter.close()
    state.close()
    counter.close()
    conn.close()


# -- the store cut: the agent keeps answering -----------------------------------------------


class Degraded(BaseCallbackHandler):
    """Every ``demote.degraded`` custom event."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kwargs: Any) -> None:
        if name == "demote.degraded":
            with self.lock:
                self.events.append(data)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_while_the_store_is_cut_the_agent_answers_and_it_catches_up_after(
    pg: str, postgres_url: str, mode: str
) -> None:
    from urllib.parse import urlsplit

    proxy = TcpProxy(urlsplit(postgres_url).port or 5432).start()
    parts = urlsplit(pg)
    via = parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}").geturl()
    pool = ConnectionPool(
        via,
        min_size=1,
        max_size=4,
        timeout=1.0,  # a turn waits at most this for a connection while the store is down
        kwargs={**CONNECTION, "connect_timeout": 2},
        check=ConnectionPool.check_connection,
        open=True,
    )
    try:
        store = PostgresStore(pool)  # type: ignore[arg-type]
        store.setup()
        demoter = Demoter(SlidingWindow.last_turns(2), StoreHook(store), retry=Backoff(0.05, 0.2))
        recall = StoreRecall(store)
        model = recording_model()
        agent = create_agent(
            model,
            [],
            checkpointer=InMemorySaver(),
            middleware=[DemotingMiddleware(demoter, recall=recall, recall_role="user")],
        )
        degraded = Degraded()
        config: Any = {"configurable": {"thread_id": "cut"}, "callbacks": [degraded]}

        def turn(text: str) -> float:
            began = time.monotonic()
            state = {"messages": [HumanMessage(text)]}
            if mode == "sync":
                agent.invoke(state, config)
            else:
                asyncio.run(agent.ainvoke(state, config))
            return time.monotonic() - began

        for i in range(4):
            turn(f"We talked about boats, part {i}.")
        proxy.down()
        slowest = max(turn(f"While it is down: turn {i} about boats.") for i in range(5))
        assert slowest < 4.0, slowest  # a pool timeout at worst, then the breaker skips it
        assert any(e.get("source") == "recall" for e in degraded.events), degraded.events
        for sent in model.seen:
            assert violations(sent) == []
            assert sum(isinstance(m, HumanMessage) for m in sent) <= 4  # window + recall
        proxy.restore()
        deadline = time.monotonic() + 30
        pending, recalled = -1, False
        while time.monotonic() < deadline:
            turn("The store is back: boats again.")
            pending = demoter.conversation_stats("cut").pending
            # recall is back: the pool can still be reconnecting when the hook delivers
            recalled = message_text(model.seen[-1][-1]).startswith(RECALL_PREFIX)
            if pending == 0 and recalled:
                break
            time.sleep(0.1)
        assert pending == 0
        assert recalled, model.seen[-1]
        messages = agent.get_state(config).values["messages"]
        delivered = demoter.state_of("cut").delivered
        keys = expected_keys(demoter, "cut", messages, delivered)
        assert rows(pg) == sorted(("demote.cut", k) for k in keys)
    finally:
        proxy.restore()
        pool.close()
        proxy.close()


if __name__ == "__main__":
    worker(json.loads(Path(sys.argv[1]).read_text()))
