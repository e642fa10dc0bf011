"""The catalogue, state stores: every method of every store with hostile ids and arguments.

Each probe runs on InMemoryStateStore and SQLiteStateStore, and on RedisStateStore and
PostgresStateStore when DEMOTE_TEST_REDIS_URL / DEMOTE_TEST_POSTGRES_URL are set (else
skipped, saying so). A refused call must leave the store as it was: the SQLite file
byte-for-byte (the harness), the in-memory dicts, the Redis keys (DUMP), the Postgres
rows. Odd but valid ids round-trip and never reach another conversation's state.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from demote.records import ConversationState
from demote.state import InMemoryStateStore, PostgresStateStore, RedisStateStore, SQLiteStateStore
from demote.state.base import Lease
from tests.hostile.harness import (
    BAD_IDS,
    BAD_NUMBERS,
    FOREIGN_KINDS,
    ODD_IDS,
    Env,
    Probe,
    check,
    guarded,
    make_foreign,
    probes_for,
    show,
)

BACKENDS = ("memory", "sqlite", "redis", "postgres")
OTHER = ConversationState(window_start=6, delivered=6, generation=2)
BAD_PATHS: list[object] = [None, 3, b"state.db", "", "nul\x00inside.db", ["s.db"]]


def _url(name: str) -> str:
    url = os.environ.get(f"DEMOTE_TEST_{name.upper()}_URL")
    if not url:
        pytest.skip(f"DEMOTE_TEST_{name.upper()}_URL not set: needs a running {name}")
    return url


def open_store(env: Env, backend: str) -> Any:
    """A store of ``backend`` holding conversation "other" (state and a live lease)."""
    if backend == "memory":
        store: Any = InMemoryStateStore()
    elif backend == "sqlite":
        store = SQLiteStateStore(env.root / "state.db")
    elif backend == "redis":
        import redis

        prefix = f"hostile-{uuid.uuid4().hex[:12]}:"
        store = RedisStateStore(_url("redis"), prefix=prefix)
        client = redis.Redis.from_url(_url("redis"))
        env.objects["dump"] = lambda: {
            k: client.dump(k) for k in sorted(client.scan_iter(match=f"{prefix}*"))
        }
        env.closers += [lambda: client.delete(*client.keys(f"{prefix}*") or ["-"]), client.close]
    else:
        import psycopg

        table = f"hostile_{uuid.uuid4().hex[:12]}"
        store = PostgresStateStore(_url("postgres"), table=table)
        conn = psycopg.connect(_url("postgres"), autocommit=True)
        env.objects["dump"] = lambda: [
            conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall()
            for t in (table, f"{table}_lease")
        ]
        env.closers += [
            conn.close,
            lambda: conn.execute(
                f"DROP TABLE IF EXISTS {table}, {table}_lease, {table}_meta CASCADE;"
                f"DROP SEQUENCE IF EXISTS {table}_fence"
            ),
        ]
    if backend == "memory":
        env.objects["dump"] = lambda: (dict(store._states), dict(store._leases))
    env.closers.insert(0, store.close)
    assert store.compare_and_set("other", None, OTHER)
    env.objects.update(store=store, lease=store.acquire_lease("other", "w1", 60))
    return store


def setup_for(backend: str) -> Any:
    return lambda env: open_store(env, backend)


def store(env: Env) -> Any:
    return env.objects["store"]


STATE = ConversationState(window_start=2, delivered=2)
CALLS: dict[str, Any] = {
    "get": lambda e, v: store(e).get(v),
    "compare_and_set": lambda e, v: store(e).compare_and_set(v, None, STATE),
    "clear": lambda e, v: store(e).clear(v),
    "delete": lambda e, v: store(e).delete(v),
    "acquire_lease": lambda e, v: store(e).acquire_lease(v, "w2", 30),
}

PROBES: list[Probe] = []
for backend in BACKENDS:
    setup = setup_for(backend)
    for method, call in CALLS.items():
        PROBES += probes_for(
            f"{backend}.{method}", "conversation_id", BAD_IDS, guarded(call), setup
        )
    PROBES += probes_for(
        f"{backend}.acquire_lease",
        "holder",
        [None, "", 3, "nul\x00", "\ud800", "h" * 5000],
        guarded(lambda e, v: store(e).acquire_lease("c", v, 30)),
        setup,
    )
    PROBES += probes_for(
        f"{backend}.acquire_lease",
        "ttl",
        [*BAD_NUMBERS, 0],
        guarded(lambda e, v: store(e).acquire_lease("c", "w2", v)),
        setup,
    )
    PROBES += probes_for(
        f"{backend}.renew_lease",
        "ttl",
        [*BAD_NUMBERS, 0],
        guarded(lambda e, v: store(e).renew_lease(e.objects["lease"], v)),
        setup,
    )
    for method in ("renew_lease", "release_lease"):
        extra = (30,) if method == "renew_lease" else ()
        PROBES += probes_for(
            f"{backend}.{method}",
            "lease",
            [None, "w1", ("other", "w1", 1), 3],
            guarded(lambda e, v, m=method, x=extra: getattr(store(e), m)(v, *x)),
            setup,
        )
    PROBES += probes_for(
        f"{backend}.compare_and_set",
        "lease",
        ["w1", 3, ("other", "w1", 1)],
        guarded(lambda e, v: store(e).compare_and_set("other", OTHER, STATE, lease=v)),
        setup,
    )
    PROBES += probes_for(
        f"{backend}.compare_and_set",
        "state",
        [None, {"window_start": 3}, "state", 3],
        guarded(lambda e, v: store(e).compare_and_set("other", OTHER, v)),
        setup,
    )


def _round_trip(backend: str, cid: str) -> Probe:
    def run(env: Env) -> object:
        s = store(env)
        ok = s.compare_and_set(cid, None, STATE)
        lease = s.acquire_lease(cid, "w2", 30)
        foreign = s.compare_and_set("other", OTHER, STATE, lease=lease)  # wrong conversation
        cleared = s.clear(cid)
        return ok, lease, foreign, cleared, s.get(cid), s.get("other")

    def check(result: Any, env: Env) -> bool:
        ok, lease, foreign, cleared, mine, other = result
        return (
            ok
            and isinstance(lease, Lease)
            and lease.state == STATE
            and not foreign
            and mine == cleared == ConversationState(generation=1)
            and other == OTHER
        )

    return Probe(
        f"{backend}(conversation_id={show(cid)})", "id", run, True, check, setup_for(backend)
    )


PROBES += [_round_trip(b, cid) for b in BACKENDS for cid in ODD_IDS]

# -- constructors ---------------------------------------------------------------------------

PROBES += probes_for("SQLiteStateStore", "path", BAD_PATHS, lambda env, v: SQLiteStateStore(v))
PROBES.append(
    Probe(
        "SQLiteStateStore(path=program file)",
        "state.db",
        lambda env: SQLiteStateStore(env.root / "state.db"),
        setup=lambda env: make_foreign(env.root / "state.db", "program"),
    )
)
assert "program" in FOREIGN_KINDS
PROBES += probes_for(
    "RedisStateStore",
    "url",
    ["not a url", "http://127.0.0.1:6379", "redis://127.0.0.1:notaport/0", 3, b"redis://"],
    lambda env, v: RedisStateStore(v),
)
for option, values in {
    "socket_timeout": BAD_NUMBERS,
    "socket_connect_timeout": BAD_NUMBERS,
    "health_check_interval": BAD_NUMBERS,
    "retries": [-1, 2.5, "3", None, 10**400],
    "max_connections": [0, -1, 2.5, "3", None, 10**400],
    "prefix": [None, 3, b"p:", "nul\x00", "\ud800"],
    "client": ["redis://", 3, object()],
}.items():
    PROBES += probes_for(
        "RedisStateStore",
        option,
        values,
        lambda env, v, option=option: RedisStateStore("redis://127.0.0.1:1/0", **{option: v}),
    )
for option, values in {
    "table": ["Robert'); DROP TABLE x;--", "", None, 3, "a" * 80, "UPPER"],
    "timeout": BAD_NUMBERS,
    "statement_timeout": BAD_NUMBERS,
    "connect_timeout": BAD_NUMBERS,
    "min_size": [-1, 2.5, "1", None, 10**400],
    "max_size": [0, -1, 2.5, "1", None, 10**400],
    "keepalives_idle": [0, -1, 2.5, "30", None],
    "application_name": [None, 3, "line\nbreak"],
    "dsn": [3, b"postgresql://", ["x"]],
}.items():
    PROBES += probes_for(
        "PostgresStateStore",
        option,
        values,
        lambda env, v, option=option: PostgresStateStore(
            **{"dsn": "postgresql://127.0.0.1:1/x", option: v}
        ),
    )


@pytest.mark.parametrize("probe", PROBES, ids=lambda p: p.name)
def test_store_probe(probe: Probe, tmp_path: Path) -> None:
    check(probe, tmp_path)


def test_the_catalogue_is_large() -> None:
    assert len(PROBES) >= 350
