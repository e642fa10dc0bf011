"""One worker process of the fleet benchmark (section 5, :mod:`bench.fleet`).

``python -m bench.fleet_worker CONFIG`` (a JSON file written by :mod:`bench.fleet`)

A worker is what one web worker of a fleet does on every chat turn: append the user
message and the reply to the conversation's history (the *inner store*), read it, and
call :meth:`demote.Demoter.load`. The history of a conversation is a deterministic
function of its length, and the length lives in the same backend as the state (a Redis
counter, a Postgres row, an SQLite row): appending is one ``INCRBY`` / ``UPDATE ...
RETURNING``, as an app appends to a Redis or Postgres chat history, and it is not counted
among the state store's round trips. Conversations are picked at random, so the workers
share them and sometimes meet on one (the lease decides who demotes).

The state store is the real one, subclassed to count its operations: each is one round
trip by the stores' design (one Lua script, one SQL statement, one SQLite transaction),
lease renewals from the keeper thread included. The hook keeps every delivered key in
memory; the worker writes keys, load latencies and counts to ``OUT`` as JSON.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import _WORDS as WORDS
from demote import Bulk, Demoter, Demotion, SlidingWindow
from demote.records import MessageRecord, fingerprint, make_key

#: The window: the newest 8 messages, cut back once 4 more have come (a third of the
#: turns demote, the prompt prefix stays put in between).
POLICY = SlidingWindow.last_messages(8, eviction=Bulk(overflow=4))
#: Messages each conversation has before the run: the window is at its cut point, so
#: from the first turns on, one turn in three demotes (6 messages).
PREFILL = 10
#: The state store operations counted (``<name>`` is built by ``_<name>_op``).
OPS = ("get", "cas", "acquire", "renew", "release", "clear", "delete", "count")


def message(conversation: int, i: int) -> tuple[str, str]:
    """Message ``i`` of conversation ``conversation``: (role, ~30 words)."""
    rng = random.Random(conversation * 1_000_003 + i)
    return ("user", "assistant")[i % 2], f"c{conversation} #{i} " + " ".join(
        rng.choices(WORDS, k=30)
    )


def key_of(conversation: int, i: int) -> str:
    """The dedup key the engine gives message ``i`` of that conversation."""
    role, text = message(conversation, i)
    return make_key(cid(conversation), i, fingerprint(role, text, (), None))


def cid(conversation: int) -> str:
    return f"conv-{conversation:05d}"


def counting(base: type[Any]) -> type[Any]:
    """``base`` (a state store class) counting each operation it performs."""

    class Counting(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.trips: Counter[str] = Counter()
            self._trips_lock = threading.Lock()
            super().__init__(*args, **kwargs)

    def counted(name: str) -> Any:
        build = getattr(base, f"_{name}_op")

        def op(self: Any, *args: Any) -> Any:
            with self._trips_lock:
                self.trips[name] += 1
            return build(self, *args)

        return op

    for name in OPS:
        setattr(Counting, f"_{name}_op", counted(name))
    Counting.__name__ = f"Counting{base.__name__}"
    return Counting


def open_store(kind: str, target: str, namespace: str) -> Any:
    """The counting state store of ``kind``."""
    from demote.state import PostgresStateStore, RedisStateStore, SQLiteStateStore

    if kind == "sqlite":
        return counting(SQLiteStateStore)(target)
    if kind == "redis":
        return counting(RedisStateStore)(target, prefix=namespace)
    return counting(PostgresStateStore)(target, table=namespace)


class Lengths:
    """The inner store's stand-in: each conversation's history length, in the backend."""

    def __init__(self, kind: str, target: str, namespace: str, inner: str) -> None:
        self.kind = kind
        self.namespace = namespace
        if kind == "redis":
            import redis

            self.client: Any = redis.Redis.from_url(target)
        elif kind == "postgres":
            import psycopg

            self.client = psycopg.connect(target, autocommit=True)
        else:
            import sqlite3

            self.client = sqlite3.connect(inner, timeout=30, isolation_level=None)
            self.client.execute("PRAGMA journal_mode=WAL")  # as SQLiteStateStore's file
            self.client.execute("PRAGMA synchronous=NORMAL")

    def create(self, conversations: int, prefill: int) -> None:
        """Every conversation starts with ``prefill`` messages."""
        if self.kind == "redis":
            pipe = self.client.pipeline()
            for c in range(conversations):
                pipe.set(f"{self.namespace}len:{c}", prefill)
            pipe.execute()
            return
        table = f"{self.namespace}_len" if self.kind == "postgres" else "lengths"
        self.client.execute(f"CREATE TABLE IF NOT EXISTS {table} (c INT PRIMARY KEY, n INT)")
        rows = [(c, prefill) for c in range(conversations)]
        if self.kind == "postgres":
            with self.client.cursor() as cur:
                cur.executemany(f"INSERT INTO {table} VALUES (%s, %s)", rows)
        else:
            self.client.executemany(f"INSERT INTO {table} VALUES (?, ?)", rows)

    def append(self, conversation: int, n: int) -> int:
        """Add ``n`` messages; the new length."""
        if self.kind == "redis":
            return int(self.client.incrby(f"{self.namespace}len:{conversation}", n))
        if self.kind == "postgres":
            sql = f"UPDATE {self.namespace}_len SET n = n + %s WHERE c = %s RETURNING n"
        else:
            sql = "UPDATE lengths SET n = n + ? WHERE c = ? RETURNING n"
        return int(self.client.execute(sql, (n, conversation)).fetchone()[0])

    def close(self) -> None:
        self.client.close()


class Histories:
    """Each conversation's messages as one process reads them (same objects each time)."""

    def __init__(self) -> None:
        self._made: dict[int, list[tuple[str, str]]] = {}

    def of(self, conversation: int, n: int) -> list[tuple[str, str]]:
        made = self._made.setdefault(conversation, [])
        while len(made) < n:
            made.append(message(conversation, len(made)))
        return made[:n]


class KeySink:
    """The hook: keeps every delivered key (and the fence it came with)."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.lock = threading.Lock()

    def deliver(self, batch: Demotion) -> None:
        with self.lock:
            self.keys.extend(m.key for m in batch.messages)


def main() -> None:
    cfg = json.loads(Path(sys.argv[1]).read_text())
    store = open_store(cfg["kind"], cfg["target"], cfg["namespace"])
    lengths = Lengths(cfg["kind"], cfg["target"], cfg["namespace"], cfg["inner"])
    sink = KeySink()
    demoter = Demoter(POLICY, sink, state=store)
    histories = Histories()

    def describe(m: tuple[str, str]) -> MessageRecord:
        return demoter.describe(m[0], m[1])

    rng = random.Random(cfg["seed"])
    picks = [rng.randrange(cfg["conversations"]) for _ in range(cfg["turns"])]
    latencies: list[float] = []
    demoting = 0
    trips_demoting = trips_other = 0
    Path(cfg["ready"]).touch()
    deadline = time.monotonic() + 120
    while not Path(cfg["go"]).exists():
        if time.monotonic() > deadline:
            raise SystemExit("never told to go")
        time.sleep(0.005)
    began = time.time()
    for c in picks:
        messages = histories.of(c, lengths.append(c, 2))
        before = store.trips.total()
        t0 = time.perf_counter()
        window = demoter.load(cid(c), messages, describe)
        latencies.append(time.perf_counter() - t0)
        trips = store.trips.total() - before
        if window.demoted:
            demoting += 1
            trips_demoting += trips
        else:
            trips_other += trips
    ended = time.time()
    demoter.close()
    out = {
        "began": began,
        "ended": ended,
        "loads": len(picks),
        "latencies": latencies,
        "demoting": demoting,
        "trips_demoting": trips_demoting,
        "trips_other": trips_other,
        "trips": dict(store.trips),
        "keys": sink.keys,
    }
    store.close()
    lengths.close()
    Path(cfg["out"]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
