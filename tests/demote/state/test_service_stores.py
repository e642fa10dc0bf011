"""The Redis and Postgres state stores against the real services.

They run when DEMOTE_TEST_REDIS_URL / DEMOTE_TEST_POSTGRES_URL are set (.ci/run sets
them and fails if a service is unreachable); a laptop without them skips, visibly.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator

import pytest

from demote import ConversationState, Demoter, Demotion, SlidingWindow, StoreError
from demote.errors import ConfigError
from demote.state.postgres import PostgresStateStore
from demote.state.redis import RedisStateStore

Factory = Callable[[], object]


@pytest.fixture(params=["redis", "postgres"])
def make_store(request: pytest.FixtureRequest) -> Iterator[Factory]:
    """A factory of store objects that share one backend namespace (like two processes)."""
    made: list[object] = []
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        prefix = f"t{uuid.uuid4().hex[:8]}:"

        def factory() -> object:
            made.append(RedisStateStore(url, prefix=prefix))
            return made[-1]
    else:
        url = request.getfixturevalue("postgres_url")
        table = f"t_{uuid.uuid4().hex[:12]}"

        def factory() -> object:
            made.append(PostgresStateStore(url, table=table))
            return made[-1]

    yield factory
    for store in made:
        store.close()  # type: ignore[attr-defined]


ODD_IDS = ["plain", "quo'te\"s", "100%;drop table x;--", "../../etc/passwd", "é" * 3000]


def test_get_cas_delete_count(make_store: Factory) -> None:
    store = make_store()
    s1 = ConversationState(window_start=3, delivered=3, pinned=1, anchor="ab")
    assert store.get("c") is None  # type: ignore[attr-defined]
    assert store.compare_and_set("c", None, s1)  # type: ignore[attr-defined]
    assert not store.compare_and_set("c", None, s1)  # type: ignore[attr-defined]
    s2 = ConversationState(window_start=9, delivered=9, pinned=1, anchor="cd", summary="s")
    assert not store.compare_and_set("c", s2, s2)  # type: ignore[attr-defined]
    assert store.compare_and_set("c", s1, s2)  # type: ignore[attr-defined]
    assert store.get("c") == s2  # type: ignore[attr-defined]
    assert store.count() == 1  # type: ignore[attr-defined]
    store.delete("c")  # type: ignore[attr-defined]
    assert store.get("c") is None and store.count() == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("cid", ODD_IDS)
def test_odd_ids_round_trip_without_touching_others(make_store: Factory, cid: str) -> None:
    store = make_store()
    other = ConversationState(window_start=1, delivered=1)
    assert store.compare_and_set("other", None, other)  # type: ignore[attr-defined]
    state = ConversationState(window_start=5, delivered=5, anchor="x")
    assert store.compare_and_set(cid, None, state)  # type: ignore[attr-defined]
    assert store.get(cid) == state  # type: ignore[attr-defined]
    assert store.get("other") == other  # type: ignore[attr-defined]
    store.delete(cid)  # type: ignore[attr-defined]
    assert store.get("other") == other  # type: ignore[attr-defined]


def test_two_processes_only_one_cas_wins(make_store: Factory) -> None:
    a, b = make_store(), make_store()
    base = ConversationState(window_start=2, delivered=2)
    assert a.compare_and_set("c", None, base)  # type: ignore[attr-defined]
    results: list[bool] = []
    barrier = threading.Barrier(2)

    def advance(store: object, to: int) -> None:
        barrier.wait()
        new = ConversationState(window_start=to, delivered=to)
        results.append(store.compare_and_set("c", base, new))  # type: ignore[attr-defined]

    threads = [threading.Thread(target=advance, args=(s, n)) for s, n in ((a, 5), (b, 7))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False, True]


def test_lease_is_exclusive_and_expires(make_store: Factory) -> None:
    a, b = make_store(), make_store()
    assert a.acquire_lease("c", "worker-a", 30)  # type: ignore[attr-defined]
    assert not b.acquire_lease("c", "worker-b", 30)  # type: ignore[attr-defined]
    b.release_lease("c", "worker-b")  # type: ignore[attr-defined]  # not b's: no effect
    assert not b.acquire_lease("c", "worker-b", 30)  # type: ignore[attr-defined]
    a.release_lease("c", "worker-a")  # type: ignore[attr-defined]
    assert b.acquire_lease("c", "worker-b", 0.05)  # type: ignore[attr-defined]
    import time

    time.sleep(0.2)
    assert a.acquire_lease("c", "worker-a", 30)  # type: ignore[attr-defined]  # expired


def test_demoter_on_shared_store_survives_restart_without_redelivery(make_store: Factory) -> None:
    delivered: list[str] = []

    class Hook:
        def deliver(self, batch: Demotion) -> None:
            delivered.extend(m.key for m in batch.messages)

    policy = SlidingWindow.last_messages(4)
    hist: list[tuple[str, str]] = []
    d = Demoter(policy, Hook(), state=make_store())  # type: ignore[arg-type]
    for i in range(10):
        hist += [("user", f"u{i}"), ("assistant", f"a{i}")]
        d.load("c", hist, lambda m: d.describe(*m))
    first = len(delivered)
    assert first == 16
    d2 = Demoter(policy, Hook(), state=make_store())  # type: ignore[arg-type]
    w = d2.load("c", hist, lambda m: d2.describe(*m))
    assert len(delivered) == first and w.start == 16
    hist += [("user", "u10"), ("assistant", "a10")]
    d2.load("c", hist, lambda m: d2.describe(*m))
    assert len(delivered) == len(set(delivered)) == 18


def test_a_held_lease_keeps_other_workers_from_delivering(make_store: Factory) -> None:
    calls: list[int] = []

    class Hook:
        def deliver(self, batch: Demotion) -> None:
            calls.append(len(batch))

    store = make_store()
    d = Demoter(SlidingWindow.last_messages(2), Hook(), state=store)  # type: ignore[arg-type]
    hist = [("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d")]
    other = make_store()
    assert other.acquire_lease("c", "another-host", 30)  # type: ignore[attr-defined]
    w = d.load("c", hist, lambda m: d.describe(*m))
    assert calls == [] and w.start == 0  # committed window, nothing delivered
    other.release_lease("c", "another-host")  # type: ignore[attr-defined]
    w = d.load("c", hist, lambda m: d.describe(*m))
    assert calls == [2] and w.start == 2


def test_bad_table_name_and_unreachable_services() -> None:
    with pytest.raises(ConfigError, match="table"):
        PostgresStateStore("postgresql://127.0.0.1:1/x", table="x; drop")
    with pytest.raises(StoreError):
        PostgresStateStore("postgresql://postgres@127.0.0.1:1/test?connect_timeout=2")
    with pytest.raises(StoreError):
        RedisStateStore("redis://127.0.0.1:1/0")
