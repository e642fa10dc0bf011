"""Stored state that is not a state: typed errors, and never a conversation stuck for good.

Garbage is written straight into the SQLite table or the Redis key (wrong JSON types,
non-JSON, another schema, a key of another type, negative indexes). The chosen behaviour,
documented in demote/state/sqlite.py and demote/state/redis.py:

* every read of it (``get``, a lease's state, ``Demoter.load``) raises ``StoreError``,
  never a ``TypeError``/``KeyError`` from deep inside, and never guesses;
* the other conversations are untouched;
* ``Demoter.clear`` repairs it (a tombstone replaces it) and ``Demoter.forget`` removes
  it, after which the conversation loads again.
"""

from __future__ import annotations

import json
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from demote import Demoter, SlidingWindow, SQLiteStateStore
from demote.errors import StoreError
from demote.records import ConversationState
from demote.state import RedisStateStore
from tests.strategies import Msg, unique

POLICY = SlidingWindow.last_messages(2)
GOOD = json.loads(
    '{"anchor":null,"delivered":0,"generation":3,"offset":0,"pinned":0,"summarized":0,'
    '"summary":null,"trail":"","window_start":0}'
)


def chat(n: int, tag: str) -> list[Msg]:
    return unique([Msg(("user", "assistant")[i % 2], f"message {i}") for i in range(n)], tag)


def _load(d: Demoter, cid: str) -> Any:
    return d.load(
        cid,
        chat(6, cid),
        lambda m: d.describe(m.role, m.text, opens=m.opens, answers=m.answers),
    )


#: Column overrides that make an SQLite row not a state.
SQLITE_GARBAGE: dict[str, str] = {
    "window_start text": "window_start = 'abc'",
    "window_start negative": "window_start = -4",
    "delivered real": "delivered = 2.5",
    "generation blob": "generation = x'00ff'",
    "generation text": "generation = 'many'",
    "anchor blob": "anchor = x'00'",
    "summary blob": "summary = x'6869'",
    "trail blob": "trail = x'ff'",
    "offset huge negative": "offset = -9223372036854775808",
}

#: Values at a Redis state key that are not a state.
REDIS_GARBAGE: dict[str, Any] = {
    "not JSON": "{not json",
    "a list": "[1, 2]",
    "a number": "42",
    "null": "null",
    "wrong types": json.dumps({**GOOD, "window_start": "abc"}),
    "negative": json.dumps({**GOOD, "delivered": -1}),
    "float generation": json.dumps({**GOOD, "generation": 1.5}),
    "missing fields": json.dumps({"window_start": 1}),
    "extra fields": json.dumps({**GOOD, "evil": True}),
    "invalid UTF-8": b"\xff\xfe{",
}


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[SQLiteStateStore]:
    store = SQLiteStateStore(tmp_path / "state.db")
    yield store
    store.close()


def _sqlite_corrupt(path: str, cid: str, change: str) -> None:
    db = sqlite3.connect(path)
    db.execute(f"UPDATE demote_state SET {change} WHERE conversation_id = ?", (cid,))
    db.commit()
    db.close()


@pytest.mark.parametrize("name", list(SQLITE_GARBAGE))
def test_a_corrupt_sqlite_row_is_a_store_error_until_cleared(
    name: str, sqlite_store: SQLiteStateStore
) -> None:
    d = Demoter(POLICY, state=sqlite_store)
    _load(d, "victim")
    _load(d, "bystander")
    before = sqlite_store.get("bystander")
    _sqlite_corrupt(sqlite_store.path, "victim", SQLITE_GARBAGE[name])
    _assert_refused_then_repaired(d, sqlite_store, before)


@pytest.fixture
def redis_store() -> Iterator[tuple[RedisStateStore, Any]]:
    url = os.environ.get("DEMOTE_TEST_REDIS_URL")
    if not url:
        pytest.skip("DEMOTE_TEST_REDIS_URL not set: needs a running redis")
    import redis

    prefix = f"hostile-{uuid.uuid4().hex[:12]}:"
    store = RedisStateStore(url, prefix=prefix)
    client = redis.Redis.from_url(url)
    yield store, client
    store.close()
    keys = client.keys(f"{prefix}*")
    if keys:
        client.delete(*keys)
    client.close()


def _redis_writer(value: Any) -> Callable[[Any, str], None]:
    def write(client: Any, key: str) -> None:
        client.set(key, value)

    return write


REDIS_WRITERS: dict[str, Callable[[Any, str], None]] = {
    **{name: _redis_writer(value) for name, value in REDIS_GARBAGE.items()},
    "a hash": lambda client, key: (client.delete(key), client.hset(key, "a", "b")),
    "a list key": lambda client, key: (client.delete(key), client.rpush(key, "x")),
}


@pytest.mark.parametrize("name", list(REDIS_WRITERS))
def test_a_corrupt_redis_value_is_a_store_error_until_cleared(
    name: str, redis_store: tuple[RedisStateStore, Any]
) -> None:
    store, client = redis_store
    d = Demoter(POLICY, state=store)
    _load(d, "victim")
    _load(d, "bystander")
    before = store.get("bystander")
    REDIS_WRITERS[name](client, f"{store.prefix}state:victim")
    _assert_refused_then_repaired(d, store, before)
    d.close()


def _assert_refused_then_repaired(d: Demoter, store: Any, bystander: Any) -> None:
    with pytest.raises(StoreError):
        store.get("victim")
    # no cached view: it must read the garbage (and say so, rather than degrade)
    fresh = Demoter(POLICY, state=store, on_store_error="raise")
    with pytest.raises(StoreError):
        _load(fresh, "victim")
    assert store.get("bystander") == bystander  # the neighbour never notices
    fresh.clear("victim")  # the documented repair
    tomb = store.get("victim")
    assert isinstance(tomb, ConversationState) and tomb.window_start == 0
    assert _load(fresh, "victim").start == 4
    fresh.forget("victim")
    assert store.get("victim") is None
    assert _load(Demoter(POLICY, state=store), "victim").start == 4


def test_a_corrupt_fence_counter_is_a_store_error(
    redis_store: tuple[RedisStateStore, Any],
) -> None:
    store, client = redis_store
    client.set(f"{store.prefix}fence", "not a number")
    with pytest.raises(StoreError):
        store.acquire_lease("c", "w", 30)
    assert client.get(f"{store.prefix}lease:c") is None  # no lease left behind


def test_a_state_key_of_another_type_leaves_no_lease_behind(
    redis_store: tuple[RedisStateStore, Any],
) -> None:
    store, client = redis_store
    client.hset(f"{store.prefix}state:c", "a", "b")
    with pytest.raises(StoreError):
        store.acquire_lease("c", "w", 30)
    assert client.get(f"{store.prefix}lease:c") is None
    store.clear("c")
    assert store.acquire_lease("c", "w", 30) is not None


def test_an_ids_key_of_another_type_refuses_writes_before_writing_anything(
    redis_store: tuple[RedisStateStore, Any],
) -> None:
    store, client = redis_store
    d = Demoter(POLICY, state=store)
    _load(d, "c")
    before = client.get(f"{store.prefix}state:c")
    client.delete(f"{store.prefix}ids")
    client.set(f"{store.prefix}ids", "not a set")
    # A script is not rolled back on error: the ids key's type is checked before the state
    # is written, so the refused commit and the refused clear leave the state as it was.
    with pytest.raises(StoreError, match="not a set"):
        store.compare_and_set("c", store.get("c"), ConversationState(window_start=9))
    with pytest.raises(StoreError, match="not a set"):
        store.clear("c")
    assert client.get(f"{store.prefix}state:c") == before
    client.delete(f"{store.prefix}ids")  # the operator's repair
    store.clear("c")
    assert store.count() == 1
    d.close()
