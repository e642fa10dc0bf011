"""The engine on the Redis and Postgres state stores, against the real services.

The stores themselves are tested by test_store_contract.py and the per-store files.

They run when DEMOTE_TEST_REDIS_URL / DEMOTE_TEST_POSTGRES_URL are set (.ci/run sets
them and fails if a service is unreachable); a laptop without them skips, visibly.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from demote import Demoter, Demotion, SlidingWindow
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
    lease = other.acquire_lease("c", "another-host", 30)  # type: ignore[attr-defined]
    assert lease is not None
    w = d.load("c", hist, lambda m: d.describe(*m))
    # Another worker holds the lease: the window is still bounded, its cut pending.
    assert calls == [] and (w.start, w.pending) == (2, 2)
    other.release_lease(lease)  # type: ignore[attr-defined]
    w = d.load("c", hist, lambda m: d.describe(*m))
    assert calls == [2] and w.start == 2
